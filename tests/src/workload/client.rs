//! The main workload client: manual locks and auto-extended guards over a few resources.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::{LockHandle, LockOptions, Redlock, RetryPolicy};

use crate::history::{Event, FaultKind, HistoryLog, Mode, duration_ns, instant_ns, now_ns};

use super::*;

/// One client's settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The client's name in the history.
    pub name: String,
    /// The resources, each with its TTL.
    pub resources: Vec<(String, Duration)>,
    /// The acquire retry policy (the "retry budget").
    pub retry: RetryPolicy,
    /// When to stop starting critical sections.
    pub until: Instant,
    /// The client's seed.
    pub seed: u64,
    /// The share of critical sections held by an auto-extending guard.
    pub guard_share: f64,
    /// Pending stall requests from an in-process nemesis: a client takes one and
    /// stalls past its validity before its next write.
    pub stalls: Option<Arc<AtomicU32>>,
}

/// What one client did.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientStats {
    /// Critical sections started.
    pub sections: u64,
    /// Locks acquired.
    pub acquired: u64,
    /// Counted writes.
    pub writes: u64,
}

pub(super) fn short_error(e: &redlock_core::Error) -> String {
    let s = e.to_string();
    match s.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

pub(super) fn rand_dur(rng: &mut StdRng, max: Duration) -> Duration {
    let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(if us == 0 { 0 } else { rng.random_range(0..=us) })
}

pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("store call panicked")
}

/// Runs one client until `cfg.until`: pick a resource, take the lock (manual or
/// guard), do 1–3 read/sleep/write steps, release, think, repeat.
pub async fn run_client(
    redlock: Redlock,
    cfg: ClientConfig,
    store: Arc<dyn Store>,
    log: HistoryLog,
) -> ClientStats {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut stats = ClientStats::default();
    while Instant::now() < cfg.until {
        let (res, ttl) = cfg.resources[rng.random_range(0..cfg.resources.len())].clone();
        stats.sections += 1;
        let guard = rng.random_bool(cfg.guard_share);
        let (acquired, writes) = if guard {
            guard_section(&redlock, &cfg, &store, &log, &mut rng, &res, ttl).await
        } else {
            manual_section(&redlock, &cfg, &store, &log, &mut rng, &res, ttl).await
        };
        stats.acquired += u64::from(acquired);
        stats.writes += writes;
        tokio::time::sleep(rand_dur(&mut rng, ttl / 4)).await;
    }
    stats
}

pub(super) fn take_stall(cfg: &ClientConfig) -> bool {
    cfg.stalls.as_ref().is_some_and(|s| {
        s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    })
}

/// One client holding one resource: the events it logs.
pub(super) struct Holder<'a> {
    pub(super) client: &'a str,
    pub(super) res: &'a str,
    pub(super) token: &'a str,
}

impl Holder<'_> {
    pub(super) fn skip(&self, reason: &str) -> Event {
        Event::Skip {
            client: self.client.to_owned(),
            res: self.res.to_owned(),
            token: self.token.to_owned(),
            at: now_ns(),
            reason: reason.to_owned(),
        }
    }

    pub(super) fn release(&self, extensions: u32) -> Event {
        Event::Release {
            client: self.client.to_owned(),
            res: self.res.to_owned(),
            token: self.token.to_owned(),
            at: now_ns(),
            extensions,
        }
    }

    /// Writes `read + 1` if the store still sees the lock valid, and logs the
    /// write, or a skip when the validity ran out first. Returns whether it wrote.
    pub(super) async fn write(
        &self,
        store: &Arc<dyn Store>,
        log: &HistoryLog,
        (read, read_at): (u64, u64),
        valid_until: Instant,
    ) -> bool {
        let s = Arc::clone(store);
        let r = self.res.to_owned();
        match blocking(move || s.write_if_valid(&r, read + 1, valid_until)).await {
            Ok(at) => {
                log.push(Event::Write {
                    client: self.client.to_owned(),
                    res: self.res.to_owned(),
                    token: self.token.to_owned(),
                    read_at,
                    at,
                    read,
                    wrote: read + 1,
                });
                true
            }
            Err(_) => {
                log.push(self.skip("validity ran out before the write"));
                false
            }
        }
    }
}

/// `lock_with`, then 1–3 steps of read, work (up to half the TTL), write; before
/// each later step a manual `extend` when less than half the TTL is left; `unlock`.
pub(super) async fn manual_section(
    redlock: &Redlock,
    cfg: &ClientConfig,
    store: &Arc<dyn Store>,
    log: &HistoryLog,
    rng: &mut StdRng,
    res: &str,
    ttl: Duration,
) -> (bool, u64) {
    let t0 = now_ns();
    let r = redlock.mutex(res).acquire_with(ttl, &cfg.retry).await;
    let t1 = now_ns();
    let mut lock = match r {
        Ok(l) => l,
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
    let token = lock.token().to_owned();
    log.push(Event::Acquire {
        client: cfg.name.clone(),
        res: res.to_owned(),
        token: token.clone(),
        mode: Mode::Manual,
        t0,
        t1,
        started: Some(instant_ns(lock.started_at())),
        valid_until: instant_ns(lock.valid_until()),
        ttl_ns: duration_ns(ttl),
        loss_margin_ns: None,
    });
    let holder = Holder {
        client: &cfg.name,
        res,
        token: &token,
    };
    let stall = take_stall(cfg);
    let steps = rng.random_range(1..=3);
    let mut writes = 0;
    for step in 0..steps {
        if step > 0 && lock.remaining() < ttl / 2 {
            let t0 = now_ns();
            let r = lock.extend(ttl).await;
            let t1 = now_ns();
            let ok = r.is_ok();
            log.push(Event::Extend {
                client: cfg.name.clone(),
                res: res.to_owned(),
                token: token.clone(),
                t0,
                t1,
                started: ok.then(|| instant_ns(lock.started_at())),
                valid_until: ok.then(|| instant_ns(lock.valid_until())),
                ttl_ns: duration_ns(ttl),
                error: r.err().map(|e| short_error(&e)),
            });
            if !ok {
                log.push(holder.skip("extension failed"));
                break;
            }
        }
        let s = Arc::clone(store);
        let r = res.to_owned();
        let (value, read_at) = blocking(move || s.read(&r)).await;
        let mut work = rand_dur(rng, ttl / 2);
        if stall && step == 0 {
            // A GC pause: sleep past the validity before the write.
            work = lock.remaining() + Duration::from_millis(5) + rand_dur(rng, ttl / 2);
            log.push(Event::Fault {
                kind: FaultKind::Stall,
                node: None,
                at: now_ns(),
                detail: format!("{} stalls {} ms holding {res}", cfg.name, work.as_millis()),
            });
        }
        tokio::time::sleep(work).await;
        if !holder
            .write(store, log, (value, read_at), lock.valid_until())
            .await
        {
            break;
        }
        writes += 1;
    }
    log.push(holder.release(lock.extensions()));
    let _ = lock.unlock().await;
    (true, writes)
}

/// `lock_guard` with auto-extension (`max_hold` 3×TTL), writes checked against
/// the holder's deadline (the handle's validity less its loss margin: from then
/// on the library may release the keys), `release`.
pub(super) async fn guard_section(
    redlock: &Redlock,
    cfg: &ClientConfig,
    store: &Arc<dyn Store>,
    log: &HistoryLog,
    rng: &mut StdRng,
    res: &str,
    ttl: Duration,
) -> (bool, u64) {
    let options = LockOptions::new(ttl)
        .max_hold(ttl * 3)
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
    let holder = Holder {
        client: &cfg.name,
        res,
        token: &token,
    };
    let margin = h.loss_margin();
    let steps = rng.random_range(1..=3);
    let mut writes = 0;
    for _ in 0..steps {
        let s = Arc::clone(store);
        let r = res.to_owned();
        let (value, read_at) = blocking(move || s.read(&r)).await;
        // Long enough to need renewals.
        tokio::time::sleep(rand_dur(rng, ttl * 4 / 5)).await;
        let at = now_ns();
        let valid_until = h.valid_until();
        let lost = h.is_lost();
        log.push(Event::Observe {
            client: cfg.name.clone(),
            res: res.to_owned(),
            token: token.clone(),
            at,
            valid_until: instant_ns(valid_until),
            lost,
            ttl_ns: duration_ns(ttl),
        });
        if lost {
            log.push(holder.skip("lock lost"));
            break;
        }
        let deadline = valid_until.checked_sub(margin).unwrap_or(valid_until);
        if !holder.write(store, log, (value, read_at), deadline).await {
            break;
        }
        writes += 1;
    }
    // The last view before the release: a renewal near `max_hold` may have
    // lowered the validity since the last write.
    log.push(observe(&cfg.name, res, &h, ttl));
    log.push(holder.release(h.extensions()));
    let _ = guard.release().await;
    (true, writes)
}

/// The holder's view now, as an [`Event::Observe`].
pub(super) fn observe(client: &str, res: &str, h: &LockHandle, ttl: Duration) -> Event {
    let at = now_ns();
    let valid_until = h.valid_until();
    let lost = h.is_lost();
    Event::Observe {
        client: client.to_owned(),
        res: res.to_owned(),
        token: h.token().to_owned(),
        at,
        valid_until: instant_ns(valid_until),
        lost,
        ttl_ns: duration_ns(ttl),
    }
}

/// Logs the moment the holder is told its lock is lost (an [`Event::Observe`]
/// with `lost`), from a task of the holder's runtime: the library releases the
/// keys right after it signals the loss, so the hold ends there.
pub(super) async fn watch_loss(
    h: LockHandle,
    log: HistoryLog,
    client: String,
    res: String,
    ttl: Duration,
) {
    h.lost().await;
    log.push(observe(&client, &res, &h, ttl));
}
