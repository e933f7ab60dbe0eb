//! The multi-resource client: several resources under one lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::Redlock;

use crate::history::{Event, HistoryLog, Mode, duration_ns, instant_ns, now_ns};

use super::*;

/// A client that locks two of `cfg.resources` at once (`lock_many_with`, the
/// pair picked at random, in either order) and, in each critical section,
/// reads and writes both, with a manual extend of the set between steps. Its
/// history is one `Acquire`, `Extend`, `Write` and `Release` per resource
/// (same token), so the checkers judge every key of the set as they judge a
/// single-resource lock, against the single-resource clients on the same
/// keys. Returns what it did.
pub async fn run_many_client(
    redlock: Redlock,
    cfg: ClientConfig,
    store: Arc<dyn Store>,
    log: HistoryLog,
) -> ClientStats {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut stats = ClientStats::default();
    while Instant::now() < cfg.until && cfg.resources.len() >= 2 {
        let i = rng.random_range(0..cfg.resources.len());
        let j = (i + rng.random_range(1..cfg.resources.len())) % cfg.resources.len();
        let (a, b) = (&cfg.resources[i], &cfg.resources[j]);
        let ttl = a.1.min(b.1);
        stats.sections += 1;
        let (acquired, writes) =
            many_section(&redlock, &cfg, &store, &log, &mut rng, [&a.0, &b.0], ttl).await;
        stats.acquired += u64::from(acquired);
        stats.writes += writes;
        tokio::time::sleep(rand_dur(&mut rng, ttl / 4)).await;
    }
    stats
}

/// One critical section of [`run_many_client`].
pub(super) async fn many_section(
    redlock: &Redlock,
    cfg: &ClientConfig,
    store: &Arc<dyn Store>,
    log: &HistoryLog,
    rng: &mut StdRng,
    set: [&str; 2],
    ttl: Duration,
) -> (bool, u64) {
    let t0 = now_ns();
    let r = match redlock.mutex_many(set) {
        Ok(both) => both.acquire_with(ttl, &cfg.retry).await,
        Err(e) => Err(e),
    };
    let t1 = now_ns();
    let mut lock = match r {
        Ok(l) => l,
        Err(e) => {
            for res in set {
                log.push(Event::AcquireFailed {
                    client: cfg.name.clone(),
                    res: res.to_owned(),
                    t0,
                    t1,
                    error: short_error(&e),
                });
            }
            return (false, 0);
        }
    };
    let token = lock.token().to_owned();
    let resources: Vec<String> = lock.resources().iter().map(|r| (*r).to_owned()).collect();
    for res in &resources {
        log.push(Event::Acquire {
            client: cfg.name.clone(),
            res: res.clone(),
            token: token.clone(),
            mode: Mode::Manual,
            t0,
            t1,
            started: Some(instant_ns(lock.started_at())),
            valid_until: instant_ns(lock.valid_until()),
            ttl_ns: duration_ns(ttl),
            loss_margin_ns: None,
        });
    }
    let holders: Vec<Holder<'_>> = resources
        .iter()
        .map(|res| Holder {
            client: &cfg.name,
            res,
            token: &token,
        })
        .collect();
    let steps = rng.random_range(1..=2);
    let mut writes = 0;
    'steps: for step in 0..steps {
        if step > 0 && lock.remaining() < ttl / 2 {
            let t0 = now_ns();
            let r = lock.extend(ttl).await;
            let t1 = now_ns();
            let ok = r.is_ok();
            let error = r.err().map(|e| short_error(&e));
            for res in &resources {
                log.push(Event::Extend {
                    client: cfg.name.clone(),
                    res: res.clone(),
                    token: token.clone(),
                    t0,
                    t1,
                    started: ok.then(|| instant_ns(lock.started_at())),
                    valid_until: ok.then(|| instant_ns(lock.valid_until())),
                    ttl_ns: duration_ns(ttl),
                    error: error.clone(),
                });
            }
            if !ok {
                for h in &holders {
                    log.push(h.skip("extension failed"));
                }
                break;
            }
        }
        let mut reads = Vec::new();
        for res in &resources {
            let s = Arc::clone(store);
            let r = res.clone();
            reads.push(blocking(move || s.read(&r)).await);
        }
        tokio::time::sleep(rand_dur(rng, ttl / 3)).await;
        for (h, read) in holders.iter().zip(reads) {
            if !h.write(store, log, read, lock.valid_until()).await {
                break 'steps;
            }
            writes += 1;
        }
    }
    for h in &holders {
        log.push(h.release(lock.extensions()));
    }
    let _ = lock.unlock().await;
    (true, writes)
}
