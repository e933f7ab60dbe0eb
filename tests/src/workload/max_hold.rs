//! The `max_hold` client: guards that must give up their lock at the limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::{LockOptions, Redlock, RetryPolicy};

use crate::history::{Event, FaultKind, HistoryLog, Mode, duration_ns, instant_ns, now_ns};

use super::*;

/// A client of guards with `max_hold` shorter than the TTL, meant to reach the
/// nodes through slow proxies: its renewals near `max_hold` shorten the keys and
/// their answers come late.
#[derive(Debug, Clone)]
pub struct MaxHoldConfig {
    /// The client's name in the history.
    pub name: String,
    /// The resources, each with its TTL (no other kind of client writes them).
    pub resources: Vec<(String, Duration)>,
    /// The acquire retry policy.
    pub retry: RetryPolicy,
    /// When to stop starting critical sections.
    pub until: Instant,
    /// The client's seed.
    pub seed: u64,
    /// `max_hold` as a fraction of the TTL, uniform in this range (below 1).
    pub max_hold: (f64, f64),
    /// Logged with each section (what makes the path slow).
    pub path: String,
}

/// Runs a `max_hold` client until `cfg.until`: `lock_guard` with
/// `max_hold < ttl`; mostly working in steps of read, work, `is_lost()` check,
/// unchecked write until the holder is told the lock is lost (past
/// `max_hold`), sometimes only one or two steps; `release`. Every write is a
/// holder-view write ([`Event::HolderWrite`]).
pub async fn run_max_hold_client(
    redlock: Redlock,
    cfg: MaxHoldConfig,
    store: Arc<dyn Store>,
    log: HistoryLog,
) -> ClientStats {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut stats = ClientStats::default();
    while Instant::now() < cfg.until {
        let (res, ttl) = cfg.resources[rng.random_range(0..cfg.resources.len())].clone();
        stats.sections += 1;
        let (acquired, writes) =
            max_hold_section(&redlock, &cfg, &*store, &log, &mut rng, &res, ttl).await;
        stats.acquired += u64::from(acquired);
        stats.writes += writes;
        tokio::time::sleep(rand_dur(&mut rng, ttl / 8)).await;
    }
    stats
}

pub(super) async fn max_hold_section(
    redlock: &Redlock,
    cfg: &MaxHoldConfig,
    store: &dyn Store,
    log: &HistoryLog,
    rng: &mut StdRng,
    res: &str,
    ttl: Duration,
) -> (bool, u64) {
    let max_hold = ttl.mul_f64(rng.random_range(cfg.max_hold.0..cfg.max_hold.1));
    let options = LockOptions::new(ttl)
        .max_hold(max_hold)
        .retry(cfg.retry.clone());
    let t0 = now_ns();
    let r = redlock.mutex(res).guard(&options).await;
    let t1 = now_ns();
    let guard = match r {
        Ok(g) => g,
        Err(e) => {
            log.push(Event::AcquireFailed {
                client: cfg.name.clone(),
                res: res.to_owned(),
                t0,
                t1,
                error: short_error(&e),
            });
            return (false, 0);
        }
    };
    let h = guard.handle();
    let token = h.token().to_owned();
    log.push(Event::Acquire {
        client: cfg.name.clone(),
        res: res.to_owned(),
        token: token.clone(),
        mode: Mode::Guard,
        t0,
        t1,
        started: None,
        valid_until: instant_ns(h.valid_until()),
        ttl_ns: duration_ns(ttl),
        loss_margin_ns: Some(duration_ns(h.loss_margin())),
    });
    log.push(Event::Fault {
        kind: FaultKind::MaxHold,
        node: None,
        at: now_ns(),
        detail: format!(
            "{} holds {res}: ttl {} ms, max_hold {} ms, {}",
            cfg.name,
            ttl.as_millis(),
            max_hold.as_millis(),
            cfg.path
        ),
    });
    let watcher = tokio::spawn(watch_loss(
        h.clone(),
        log.clone(),
        cfg.name.clone(),
        res.to_owned(),
        ttl,
    ));
    let holder = Holder {
        client: &cfg.name,
        res,
        token: &token,
    };
    let steps = if rng.random_bool(0.7) {
        usize::MAX
    } else {
        rng.random_range(1..=2)
    };
    let mut writes = 0;
    for _ in 0..steps {
        let (value, read_at) = store.read(res);
        tokio::time::sleep(ttl / 10 + rand_dur(rng, ttl / 6)).await;
        let check_at = now_ns();
        let lost = h.is_lost();
        let valid_until = h.valid_until();
        log.push(Event::Observe {
            client: cfg.name.clone(),
            res: res.to_owned(),
            token: token.clone(),
            at: check_at,
            valid_until: instant_ns(valid_until),
            lost,
            ttl_ns: duration_ns(ttl),
        });
        if lost {
            log.push(holder.skip("the holder saw its lock lost"));
            break;
        }
        let at = store.write(res, value + 1);
        log.push(Event::HolderWrite {
            client: cfg.name.clone(),
            res: res.to_owned(),
            token: token.clone(),
            read_at,
            read: value,
            check_at,
            at,
            wrote: value + 1,
            stalled_after_check: false,
            ttl_ns: duration_ns(ttl),
        });
        writes += 1;
    }
    log.push(observe(&cfg.name, res, &h, ttl));
    log.push(holder.release(h.extensions()));
    watcher.abort();
    let _ = guard.release().await;
    (true, writes)
}
