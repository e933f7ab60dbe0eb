//! The fault suite's workload: clients that contend for a few resources with
//! short TTLs, and do a non-atomic read, sleep, write+1 on a fault-free store while
//! they hold the lock.
//!
//! # Exact counting
//!
//! The store ([`Store`]) runs the holder's validity check and the write as one
//! step under its own lock: it reads [`Instant::now`] and compares it with the
//! library's `valid_until` *inside* that lock, and writes only if the validity has
//! not run out. A write therefore happens at an instant that is inside its lock's
//! validity, or not at all, and a holder that stalled past its validity skips the
//! write and does not count it. With no overlap of validity intervals the writes
//! are serialized, so the final count equals the number of counted writes, exactly.
//!
//! Two stores: [`MemoryStore`] (a mutex) for clients that are tasks of one
//! process, and [`FileStore`] (one file per resource under `flock`) for clients in
//! separate OS processes. Both read the same `CLOCK_MONOTONIC`. A Redis store would
//! not do: it cannot compare against the clients' monotonic clock, so a write
//! could land after the check passed and after the validity ended, and the count
//! would no longer be exact.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::{LockHandle, LockOptions, Redlock, RetryPolicy};

use crate::history::{Event, FaultKind, HistoryLog, Mode, duration_ns, instant_ns, now_ns};

/// A fault-free counter store with an exact validity check.
pub trait Store: Send + Sync {
    /// Reads the counter of `res`. Returns the value and when it was read.
    fn read(&self, res: &str) -> (u64, u64);

    /// Writes `value` if `Instant::now() < valid_until`, both under the store's
    /// lock. `Ok(at)`: written at `at`; `Err(at)`: the validity had run out.
    fn write_if_valid(&self, res: &str, value: u64, valid_until: Instant) -> Result<u64, u64>;

    /// Writes `value` with no check at all (the holder-view workload, whose
    /// writes are judged by the holder's own `is_lost()` check). Returns when it
    /// wrote, under the store's lock.
    fn write(&self, res: &str, value: u64) -> u64;

    /// The counter of `res` (0 if never written).
    fn count(&self, res: &str) -> u64;
}

/// A [`Store`] in memory, for clients that are tasks of one process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    values: Mutex<HashMap<String, u64>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn read(&self, res: &str) -> (u64, u64) {
        let values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        (values.get(res).copied().unwrap_or(0), now_ns())
    }

    fn write_if_valid(&self, res: &str, value: u64, valid_until: Instant) -> Result<u64, u64> {
        let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        // `at` is read first, so `at <= now < valid_until` for a write.
        let at = now_ns();
        let now = Instant::now();
        if now < valid_until {
            values.insert(res.to_owned(), value);
            Ok(at)
        } else {
            Err(at)
        }
    }

    fn write(&self, res: &str, value: u64) -> u64 {
        let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        let at = now_ns();
        values.insert(res.to_owned(), value);
        at
    }

    fn count(&self, res: &str) -> u64 {
        self.read(res).0
    }
}

/// A [`Store`] of one file per resource under `flock`, shared by processes.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// A store in `dir` (created if missing).
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).expect("create the store dir");
        Self { dir }
    }

    fn open_locked(&self, res: &str) -> std::fs::File {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(format!("{res}.count")))
            .expect("open the store file");
        f.lock().expect("flock the store file");
        f
    }

    fn value(f: &mut std::fs::File) -> u64 {
        let mut s = String::new();
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.read_to_string(&mut s).expect("read the store file");
        s.trim().parse().unwrap_or(0)
    }
}

impl Store for FileStore {
    fn read(&self, res: &str) -> (u64, u64) {
        let mut f = self.open_locked(res);
        let v = Self::value(&mut f);
        (v, now_ns())
    }

    fn write_if_valid(&self, res: &str, value: u64, valid_until: Instant) -> Result<u64, u64> {
        let mut f = self.open_locked(res);
        let at = now_ns();
        let now = Instant::now();
        if now >= valid_until {
            return Err(at);
        }
        f.set_len(0).expect("truncate");
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.write_all(value.to_string().as_bytes()).expect("write");
        f.flush().expect("flush");
        Ok(at)
    }

    fn write(&self, res: &str, value: u64) -> u64 {
        let mut f = self.open_locked(res);
        let at = now_ns();
        f.set_len(0).expect("truncate");
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.write_all(value.to_string().as_bytes()).expect("write");
        f.flush().expect("flush");
        at
    }

    fn count(&self, res: &str) -> u64 {
        self.read(res).0
    }
}

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

fn short_error(e: &redlock_core::Error) -> String {
    let s = e.to_string();
    match s.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

fn rand_dur(rng: &mut StdRng, max: Duration) -> Duration {
    let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(if us == 0 { 0 } else { rng.random_range(0..=us) })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
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

fn take_stall(cfg: &ClientConfig) -> bool {
    cfg.stalls.as_ref().is_some_and(|s| {
        s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    })
}

/// One client holding one resource: the events it logs.
struct Holder<'a> {
    client: &'a str,
    res: &'a str,
    token: &'a str,
}

impl Holder<'_> {
    fn skip(&self, reason: &str) -> Event {
        Event::Skip {
            client: self.client.to_owned(),
            res: self.res.to_owned(),
            token: self.token.to_owned(),
            at: now_ns(),
            reason: reason.to_owned(),
        }
    }

    fn release(&self, extensions: u32) -> Event {
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
    async fn write(
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
async fn manual_section(
    redlock: &Redlock,
    cfg: &ClientConfig,
    store: &Arc<dyn Store>,
    log: &HistoryLog,
    rng: &mut StdRng,
    res: &str,
    ttl: Duration,
) -> (bool, u64) {
    let t0 = now_ns();
    let r = redlock.lock_with(res, ttl, &cfg.retry).await;
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
async fn guard_section(
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
    let r = redlock.lock_guard(res, &options).await;
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
fn observe(client: &str, res: &str, h: &LockHandle, ttl: Duration) -> Event {
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
async fn watch_loss(h: LockHandle, log: HistoryLog, client: String, res: String, ttl: Duration) {
    h.lost().await;
    log.push(observe(&client, &res, &h, ttl));
}

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

/// Runs a holder-view client until `cfg.until`: [`Redlock::with_lock`] with
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
struct Outcome {
    acquired: bool,
    released: bool,
    token: String,
    writes: u64,
    watcher: Option<tokio::task::JoinHandle<()>>,
}

async fn holder_section(
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
            .with_lock(resource, &options, move |h| async move {
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

async fn max_hold_section(
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
    let r = redlock.lock_guard(res, &options).await;
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

/// After the faults healed: takes and releases every resource once, each within
/// `TTL + budget`, and logs the outcome as [`Event::Liveness`].
pub async fn probe_liveness(
    redlock: &Redlock,
    resources: &[(String, Duration)],
    budget: Duration,
    healed_at: u64,
    log: &HistoryLog,
) -> bool {
    let probes = resources.iter().map(|(res, ttl)| async move {
        let bound = *ttl + budget;
        let policy = RetryPolicy::deadline(bound)
            .with_delay(Duration::from_millis(10))
            .with_jitter(Duration::from_millis(10));
        let t0 = now_ns();
        let r = redlock.lock_with(res, *ttl, &policy).await;
        let t1 = now_ns();
        let acquired_at = r.as_ref().ok().map(|_| t1);
        match r {
            Ok(lock) => {
                log.push(Event::Acquire {
                    client: "probe".into(),
                    res: res.clone(),
                    token: lock.token().to_owned(),
                    mode: Mode::Probe,
                    t0,
                    t1,
                    started: Some(instant_ns(lock.started_at())),
                    valid_until: instant_ns(lock.valid_until()),
                    ttl_ns: duration_ns(*ttl),
                    loss_margin_ns: None,
                });
                log.push(Event::Release {
                    client: "probe".into(),
                    res: res.clone(),
                    token: lock.token().to_owned(),
                    at: now_ns(),
                    extensions: 0,
                });
                let _ = lock.unlock().await;
            }
            Err(e) => log.push(Event::AcquireFailed {
                client: "probe".into(),
                res: res.clone(),
                t0,
                t1,
                error: short_error(&e),
            }),
        }
        log.push(Event::Liveness {
            res: res.clone(),
            healed_at,
            acquired_at,
            bound_ns: duration_ns(bound),
        });
        acquired_at.is_some_and(|a| a.saturating_sub(healed_at) <= duration_ns(bound))
    });
    let mut ok = true;
    for r in futures_util::future::join_all(probes).await {
        ok &= r;
    }
    ok
}

/// Appends each resource's final count to the history.
pub fn log_finals(store: &dyn Store, resources: &[(String, Duration)], log: &HistoryLog) {
    for (res, _) in resources {
        log.push(Event::Final {
            res: res.clone(),
            count: store.count(res),
        });
    }
}

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
async fn many_section(
    redlock: &Redlock,
    cfg: &ClientConfig,
    store: &Arc<dyn Store>,
    log: &HistoryLog,
    rng: &mut StdRng,
    set: [&str; 2],
    ttl: Duration,
) -> (bool, u64) {
    let t0 = now_ns();
    let r = redlock.lock_many_with(set, ttl, &cfg.retry).await;
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
