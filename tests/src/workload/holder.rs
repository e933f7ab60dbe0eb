//! The holder-view client: checks `is_lost()`, then writes unchecked, with planned stalls.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::{LockOptions, Redlock, RetryPolicy};

use crate::history::{Event, FaultKind, HistoryLog, Mode, duration_ns, instant_ns, now_ns};

use super::*;

/// A seeded stall the nemesis hands to a holder-view client: block the holder's
/// thread for `ttl_factor × TTL`, before its `is_lost()` check or between the
/// check and its write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HolderStallPlan {
    /// Between the check and the write (else before the check).
    pub after_check: bool,
    /// The stall, in TTLs (above 1, so it outlasts the validity).
    pub ttl_factor: f64,
}

/// The stalls the nemesis decided and the holder-view clients have not taken
/// yet (a few at most).
#[derive(Debug, Default)]
pub struct HolderStalls {
    plans: Mutex<std::collections::VecDeque<HolderStallPlan>>,
}

impl HolderStalls {
    /// Most stalls waiting at once; more are dropped.
    pub const MAX_PENDING: usize = 3;

    /// No stall pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a stall, unless [`Self::MAX_PENDING`] are waiting. Returns whether
    /// it was queued.
    pub fn push(&self, plan: HolderStallPlan) -> bool {
        let mut q = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= Self::MAX_PENDING {
            return false;
        }
        q.push_back(plan);
        true
    }

    /// The oldest stall waiting, if any.
    pub fn take(&self) -> Option<HolderStallPlan> {
        self.plans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }
}

/// A holder-view client: it runs on its own OS thread, on a current-thread
/// runtime shared with its renewal tasks, so a blocked thread starves them.
#[derive(Debug, Clone)]
pub struct HolderConfig {
    /// The client's name in the history.
    pub name: String,
    /// The resources, each with its TTL (no other client writes them).
    pub resources: Vec<(String, Duration)>,
    /// The acquire retry policy.
    pub retry: RetryPolicy,
    /// When to stop starting critical sections.
    pub until: Instant,
    /// The client's seed.
    pub seed: u64,
    /// Where the nemesis's stalls come from.
    pub stalls: Option<Arc<HolderStalls>>,
    /// The library's deadline check; `false` only to show what the checker
    /// finds without it (`without_deadline_check_for_tests`).
    pub deadline_check: bool,
}

/// Starts a holder-view client on a new OS thread with a current-thread Tokio
/// runtime (see [`run_holder_client`]).
///
/// # Panics
/// If the thread or its runtime cannot start.
pub fn spawn_holder_thread(
    redlock: Redlock,
    cfg: HolderConfig,
    store: Arc<dyn Store>,
    log: HistoryLog,
) -> std::thread::JoinHandle<ClientStats> {
    std::thread::Builder::new()
        .name(cfg.name.clone())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("build a current-thread runtime");
            rt.block_on(run_holder_client(redlock, cfg, store, log))
        })
        .expect("spawn a holder thread")
}

/// Runs a holder-view client until `cfg.until`: [`Primitive::run`](redlock_core::Primitive::run) with
/// auto-extension, and inside the work 1–3 steps of read; async work; (maybe a
/// thread stall); `is_lost()` check; (maybe a thread stall); unchecked write.
/// Call it on a current-thread runtime ([`spawn_holder_thread`]).
pub async fn run_holder_client(
    redlock: Redlock,
    cfg: HolderConfig,
    store: Arc<dyn Store>,
    log: HistoryLog,
) -> ClientStats {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut stats = ClientStats::default();
    while Instant::now() < cfg.until {
        let (res, ttl) = cfg.resources[rng.random_range(0..cfg.resources.len())].clone();
        stats.sections += 1;
        let (acquired, writes) =
            holder_section(&redlock, &cfg, &store, &log, &mut rng, &res, ttl).await;
        stats.acquired += u64::from(acquired);
        stats.writes += writes;
        tokio::time::sleep(rand_dur(&mut rng, ttl / 4)).await;
    }
    stats
}

/// What a [`holder_section`]'s work left behind.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) acquired: bool,
    pub(super) released: bool,
    pub(super) token: String,
    pub(super) writes: u64,
    pub(super) watcher: Option<tokio::task::JoinHandle<()>>,
}

pub(super) async fn holder_section(
    redlock: &Redlock,
    cfg: &HolderConfig,
    store: &Arc<dyn Store>,
    log: &HistoryLog,
    rng: &mut StdRng,
    res: &str,
    ttl: Duration,
) -> (bool, u64) {
    let mut options = LockOptions::new(ttl).retry(cfg.retry.clone());
    if !cfg.deadline_check {
        options = options.without_deadline_check_for_tests();
    }
    let works: Vec<Duration> = (0..rng.random_range(1..=3))
        .map(|_| rand_dur(rng, ttl * 4 / 5))
        .collect();
    let out = std::rc::Rc::new(std::cell::RefCell::new(Outcome::default()));
    let resource = res;
    let t0 = now_ns();
    let r = {
        let (out, store, log) = (std::rc::Rc::clone(&out), Arc::clone(store), log.clone());
        let (client, res) = (cfg.name.clone(), res.to_owned());
        let stalls = cfg.stalls.clone();
        redlock
            .mutex(resource).run(&options, move |h| async move {
                let t1 = now_ns();
                log.push(Event::Acquire {
                    client: client.clone(),
                    res: res.clone(),
                    token: h.token().to_owned(),
                    mode: Mode::Guard,
                    t0,
                    t1,
                    started: None,
                    valid_until: instant_ns(h.valid_until()),
                    ttl_ns: duration_ns(ttl),
                    loss_margin_ns: Some(duration_ns(h.loss_margin())),
                });
                {
                    let mut o = out.borrow_mut();
                    o.acquired = true;
                    o.token = h.token().to_owned();
                    o.watcher = Some(tokio::spawn(watch_loss(
                        h.clone(),
                        log.clone(),
                        client.clone(),
                        res.clone(),
                        ttl,
                    )));
                }
                let holder = Holder {
                    client: &client,
                    res: &res,
                    token: h.token(),
                };
                let plan = stalls.as_ref().and_then(|s| s.take());
                for (step, work) in works.into_iter().enumerate() {
                    let (value, read_at) = store.read(&res);
                    tokio::time::sleep(work).await;
                    let stall = plan.filter(|_| step == 0);
                    let stall_for = |p: HolderStallPlan| ttl.mul_f64(p.ttl_factor);
                    if let Some(p) = stall.filter(|p| !p.after_check) {
                        log.push(Event::Fault {
                            kind: FaultKind::HolderStall,
                            node: None,
                            at: now_ns(),
                            detail: format!(
                                "{client} blocks its thread {} ms before its is_lost() check, holding {res}",
                                stall_for(p).as_millis()
                            ),
                        });
                        std::thread::sleep(stall_for(p));
                    }
                    // The check, then the write: nothing between them yields.
                    let check_at = now_ns();
                    let lost = h.is_lost();
                    let valid_until = h.valid_until();
                    log.push(Event::Observe {
                        client: client.clone(),
                        res: res.clone(),
                        token: h.token().to_owned(),
                        at: check_at,
                        valid_until: instant_ns(valid_until),
                        lost,
                        ttl_ns: duration_ns(ttl),
                    });
                    if lost {
                        log.push(holder.skip("the holder saw its lock lost"));
                        break;
                    }
                    let after = stall.filter(|p| p.after_check);
                    if let Some(p) = after {
                        log.push(Event::Fault {
                            kind: FaultKind::HolderStall,
                            node: None,
                            at: now_ns(),
                            detail: format!(
                                "{client} blocks its thread {} ms between its is_lost() check and its write, holding {res}",
                                stall_for(p).as_millis()
                            ),
                        });
                        std::thread::sleep(stall_for(p));
                    }
                    let at = store.write(&res, value + 1);
                    log.push(Event::HolderWrite {
                        client: client.clone(),
                        res: res.clone(),
                        token: h.token().to_owned(),
                        read_at,
                        read: value,
                        check_at,
                        at,
                        wrote: value + 1,
                        stalled_after_check: after.is_some(),
                        ttl_ns: duration_ns(ttl),
                    });
                    out.borrow_mut().writes += 1;
                    if after.is_some() {
                        break;
                    }
                }
                log.push(observe(&client, &res, &h, ttl));
                log.push(holder.release(h.extensions()));
                out.borrow_mut().released = true;
            })
            .await
    };
    let mut o = out.borrow_mut();
    if let Some(w) = o.watcher.take() {
        w.abort();
    }
    match r {
        Err(e) if !o.acquired => log.push(Event::AcquireFailed {
            client: cfg.name.clone(),
            res: res.to_owned(),
            t0,
            t1: now_ns(),
            error: short_error(&e),
        }),
        // The work was dropped when the lock was lost; the library has released
        // it by now (the hold ended at the loss, logged by the watcher).
        _ if o.acquired && !o.released => log.push(Event::Release {
            client: cfg.name.clone(),
            res: res.to_owned(),
            token: o.token.clone(),
            at: now_ns(),
            extensions: 0,
        }),
        _ => {}
    }
    (o.acquired, o.writes)
}
