//! The fault-injection safety suite: mutual exclusion of `redlock-core` under node
//! crashes, pauses, slow and broken networks, clock jumps and client stalls, on
//! real `redis-server` processes behind fault proxies — and proof that its
//! checkers catch a real violation.
//!
//! One test, [`fault_suite`], runs the scenarios in turn and prints ONE summary
//! line (`fault-suite seed=… acquisitions=… faults[… holder_stall=… max_hold=…]
//! overlaps=… lost_updates=… negative_controls_caught=3/3 … stalled_after_check=…`):
//!
//! 1. **Negative controls** (must be caught): a node restarted at once, without
//!    persistence, under a holder's bare quorum; and a node that loses the key
//!    early (a forward clock jump) while another node was unreachable during the
//!    holder's acquire. Each yields a second holder, and the overlap checker must
//!    report it (the lost-update checker too). Third, **a holder stall without
//!    the deadline check**: holder A (`with_lock` on a current-thread runtime)
//!    blocks its own thread for 2×TTL before its `is_lost()` check while B
//!    acquires and writes; with `without_deadline_check_for_tests` (the old
//!    behaviour: only the starved renewal task could report the loss) A's check
//!    passes and its write lands inside B's hold, which the holder-view checker
//!    must report (a lost update too). The same pair with the deadline check
//!    (`holder-stall-pair`) must pass: A sees the loss and skips its write.
//! 2. **Ghost keys**: a `SET` that a paused node, or a proxy that held it, runs
//!    after the client gave up, and one whose reply came too late, all expire
//!    within the TTL.
//! 3. **In-process run**: 6 client tasks, 3 resources (TTL 250–400 ms), 5 nodes,
//!    and the seeded nemesis (`redlock_tests::nemesis`): kill/restart, pause,
//!    proxy faults, clock jumps, stalls. Alongside, on the same nodes:
//!    * 3 **holder-view clients**, each on its own OS thread with a
//!      current-thread runtime (resources `h0`, `h1`, TTL 250–300 ms): inside
//!      `with_lock` they read, work, check `is_lost()`, then write to a store
//!      that checks nothing. The nemesis's **holder_stall** blocks such a thread
//!      (`std::thread::sleep`, 1.2–2.5×TTL, so the renewal task cannot run)
//!      either before the check — the library's deadline check must then say
//!      "lost" — or between the check and the write, which no client-side check
//!      can catch (counted as `stalled_after_check`: the baseline that fencing
//!      must bring to zero);
//!    * 2 **max_hold clients** (resource `m0`, TTL 600 ms, `max_hold` 83–97% of
//!      the TTL) reaching the nodes through a second set of proxies with 20–40 ms
//!      of latency each way (node timeout 100 ms): their renewals near `max_hold`
//!      shorten the keys and answer late. Their writes are holder-view writes too.
//!
//!    Then heal, probe liveness, and sweep for keys that outlived their TTL.
//! 4. **Multi-process run**: 3 client processes (`fault_client`, 2 clients each),
//!    2 resources, 3 nodes; stalls are `SIGSTOP`s of a client process.
//!
//! The **holder-view checker** (`redlock_tests::history`) judges every write a
//! holder made after its own `is_lost()` check: if the check passed and the write
//! followed it without a stall, the write must fall inside no other holder's
//! interval (and inside its own), and must not lose an update; those count in
//! `overlaps` and `lost_updates` of the summary. Writes stalled between the
//! check and the write are counted as `stalled_after_check`, not failed.
//! `max_hold_shortened` counts the guards whose holder saw its validity lowered.
//!
//! Every history is written as JSON lines under `$REDLOCK_HISTORY_DIR` (default
//! `target/tmp/fault-histories/<seed>/`) and can be checked again with
//! `cargo run -p redlock-tests --bin fault_recheck -- <dir>`.
//!
//! Environment: `REDLOCK_SEED` replays a schedule; `REDLOCK_SOAK_SECS` runs the two
//! randomized scenarios for that long in all (60% in-process, 40% multi-process)
//! instead of the CI lengths (35 s and 20 s).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use redlock_core::{LockOptions, Redlock, RetryPolicy};
use redlock_tests::history::{
    Event, FaultKind, HistoryLog, Mode, Summary, Verdict, check, duration_ns, history_dir,
    instant_ns, now_ns, read_jsonl, write_jsonl,
};
use redlock_tests::nemesis::{
    DRIFT_FACTOR, FIXED_DRIFT, Nemesis, NemesisConfig, Rig, StallTarget, clock_event, meta,
    redlock_for, watch_ghost,
};
use redlock_tests::proxy::Direction;
use redlock_tests::workload::{
    ClientConfig, FileStore, HolderConfig, HolderStalls, MaxHoldConfig, MemoryStore, Store,
    log_finals, probe_liveness, run_client, run_many_client, run_max_hold_client,
    spawn_holder_thread,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The acquire retry budget of the workload and of the liveness bound.
const BUDGET: Duration = Duration::from_secs(1);

fn retry() -> RetryPolicy {
    RetryPolicy::deadline(BUDGET)
        .with_delay(ms(10))
        .with_jitter(ms(20))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking call")
}

fn acquire_event(client: &str, lock: &redlock_core::Lock, t0: u64, t1: u64) -> Event {
    Event::Acquire {
        client: client.into(),
        res: lock.resource().into(),
        token: lock.token().into(),
        mode: Mode::Manual,
        t0,
        t1,
        started: Some(instant_ns(lock.started_at())),
        valid_until: instant_ns(lock.valid_until()),
        ttl_ns: duration_ns(lock.ttl()),
        loss_margin_ns: None,
    }
}

/// A holder's read-then-write with the store's exact validity check.
fn write_event(
    store: &MemoryStore,
    client: &str,
    lock: &redlock_core::Lock,
    read: (u64, u64),
) -> Event {
    match store.write_if_valid(lock.resource(), read.0 + 1, lock.valid_until()) {
        Ok(at) => Event::Write {
            client: client.into(),
            res: lock.resource().into(),
            token: lock.token().into(),
            read_at: read.1,
            at,
            read: read.0,
            wrote: read.0 + 1,
        },
        Err(at) => Event::Skip {
            client: client.into(),
            res: lock.resource().into(),
            token: lock.token().into(),
            at,
            reason: "validity ran out".into(),
        },
    }
}

fn release_event(client: &str, lock: &redlock_core::Lock) -> Event {
    Event::Release {
        client: client.into(),
        res: lock.resource().into(),
        token: lock.token().into(),
        at: now_ns(),
        extensions: lock.extensions(),
    }
}

/// Makes `rl` hold open connections to all `n` nodes, so its next acquire runs on
/// every node at once. On a fresh connection the first call may outlast the 30 ms
/// node timeout, and the key of such a failed attempt may then stay on a node
/// until its TTL (the library's late release runs on a fresh connection under the
/// same timeout), making the next attempts busy.
async fn warm_up(rl: &redlock_core::Redlock, n: usize) {
    for _ in 0..50 {
        if let Ok(lock) = rl.try_lock("warm-up", ms(500)).await
            && lock
                .unlock()
                .await
                .is_ok_and(|r| r.report().ok_count() + r.report().pending_count() == n)
        {
            return;
        }
        tokio::time::sleep(ms(20)).await;
    }
    panic!("the client could not reach all {n} nodes");
}

/// A fresh client of the rig, warmed up.
async fn warmed_up_client(rig: &Rig) -> redlock_core::Redlock {
    let rl = redlock_for(&rig.urls());
    warm_up(&rl, rig.len()).await;
    rl
}

/// Negative control 1: holder A gets a bare quorum (nodes 0, 1) because node 2 is
/// blackholed during its acquire; node 1 is then killed and restarted at once with
/// no persistence (breaking the restart-delay rule), so B gets nodes 1 and 2
/// while A's validity runs. Both read the counter, then both write.
async fn negative_restart_without_delay(seed: u64) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("nc-restart-without-delay", seed, 3, true));
    log.push(clock_event("parent"));
    let rig = Rig::start(3, &log).await;
    let store = MemoryStore::new();
    let (res, ttl) = ("nc-restart", Duration::from_secs(3));

    let a = warmed_up_client(&rig).await;
    let dropped_before = rig.proxy(2).stats().dropped_chunks;
    rig.proxy(2).blackhole();
    log.push(Event::Fault {
        kind: FaultKind::Proxy,
        node: Some(2),
        at: now_ns(),
        detail: "blackhole during A's acquire".into(),
    });
    let t0 = now_ns();
    let lock_a = a
        .lock_with(res, ttl, &RetryPolicy::attempts(10).with_delay(ms(20)))
        .await
        .expect("A acquires on nodes 0 and 1");
    log.push(acquire_event("A", &lock_a, t0, now_ns()));
    let read_a = store.read(res);
    // A returns at the quorum of nodes 0 and 1, maybe before the proxy's
    // forwarding task has come to A's `SET` for node 2: healed then, it would
    // pass the `SET` on, and A would hold node 2 too (seen once: "B acquires
    // on nodes 1 and 2: Busy", node 2 holding a key 6 ms younger than A's).
    // The control needs that `SET` dropped, so wait for the drop.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.proxy(2).stats().dropped_chunks == dropped_before {
        assert!(
            Instant::now() < deadline,
            "the blackhole never dropped A's SET for node 2"
        );
        tokio::time::sleep(ms(1)).await;
    }
    rig.proxy(2).heal();

    let n1 = Arc::clone(rig.node(1));
    blocking(move || n1.restart()).await;
    log.push(Event::Fault {
        kind: FaultKind::Kill,
        node: Some(1),
        at: now_ns(),
        detail: "kill -9 and restart at once, no persistence (outside the model)".into(),
    });

    b_takes_over(&rig, &log, &store, (res, ttl), lock_a, read_a).await
}

/// The end of both negative controls: B acquires on nodes 1 and 2 while A still
/// believes it holds the lock, both "write" what they read, both release.
async fn b_takes_over(
    rig: &Rig,
    log: &HistoryLog,
    store: &MemoryStore,
    (res, ttl): (&str, Duration),
    lock_a: redlock_core::Lock,
    read_a: (u64, u64),
) -> Vec<Event> {
    let b = warmed_up_client(rig).await;
    let t0 = now_ns();
    let lock_b = b
        .lock_with(res, ttl, &RetryPolicy::attempts(10).with_delay(ms(20)))
        .await
        .expect("B acquires on nodes 1 and 2");
    log.push(acquire_event("B", &lock_b, t0, now_ns()));
    let read_b = store.read(res);
    log.push(write_event(store, "A", &lock_a, read_a));
    log.push(write_event(store, "B", &lock_b, read_b));
    log.push(release_event("A", &lock_a));
    let _ = lock_a.unlock().await;
    log.push(release_event("B", &lock_b));
    let _ = lock_b.unlock().await;
    log_finals(store, &[(res.to_owned(), ttl)], log);
    log.snapshot()
}

/// Negative control 2: node 2 refuses connections during A's acquire (A holds
/// nodes 0 and 1), then node 1 loses A's key early (`PEXPIRE key 1`, a forward
/// clock jump), so B gets nodes 1 and 2 while A's validity runs.
async fn negative_early_expiry(seed: u64) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("nc-early-expiry-while-unreachable", seed, 3, true));
    log.push(clock_event("parent"));
    let rig = Rig::start(3, &log).await;
    let store = MemoryStore::new();
    let (res, ttl) = ("nc-early", Duration::from_secs(3));

    let a = warmed_up_client(&rig).await;
    // Unreachable: open connections are reset, new ones refused.
    rig.proxy(2).refuse(true);
    rig.proxy(2).reset();
    log.push(Event::Fault {
        kind: FaultKind::Proxy,
        node: Some(2),
        at: now_ns(),
        detail: "reset and refuse connections during A's acquire".into(),
    });
    let t0 = now_ns();
    let lock_a = a
        .lock_with(res, ttl, &RetryPolicy::attempts(10).with_delay(ms(20)))
        .await
        .expect("A acquires on nodes 0 and 1");
    log.push(acquire_event("A", &lock_a, t0, now_ns()));
    let read_a = store.read(res);
    rig.proxy(2).heal();

    let (n1, token) = (Arc::clone(rig.node(1)), lock_a.token().to_owned());
    let jumped: i64 = blocking(move || {
        n1.raw(&[
            "EVAL",
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], 1) end return 0",
            "1",
            "nc-early",
            &token,
        ])
        .expect("PEXPIRE on node 1")
    })
    .await;
    assert_eq!(jumped, 1, "node 1 must hold A's key");
    log.push(Event::Fault {
        kind: FaultKind::Clock,
        node: Some(1),
        at: now_ns(),
        detail: "forward jump on A's bare quorum: PEXPIRE key 1 (outside the model)".into(),
    });
    tokio::time::sleep(ms(5)).await;

    b_takes_over(&rig, &log, &store, (res, ttl), lock_a, read_a).await
}

/// Holder A and holder B, one resource (TTL 300 ms), 3 healthy nodes. A runs
/// `with_lock` on a current-thread runtime on its own thread, reads, then blocks
/// its thread (`std::thread::sleep`) for 2×TTL and until B has written, so its
/// renewal task cannot run and its keys expire; B (another thread) acquires,
/// reads, writes, and holds on until A is done. Then A checks `is_lost()` and
/// writes if it says "not lost".
///
/// With the library's deadline check A sees the loss and skips: the history must
/// pass. Without it (`without_deadline_check_for_tests`, the old behaviour:
/// only the starved renewal task could say "lost") A's check passes and its
/// write lands inside B's hold, having read a stale value: the negative control,
/// which the holder-view checker must catch.
async fn holder_stall_pair(seed: u64, deadline_check: bool) -> Vec<Event> {
    let scenario = if deadline_check {
        "holder-stall-pair"
    } else {
        "nc-holder-stall-without-deadline-check"
    };
    let log = HistoryLog::new();
    log.push(meta(scenario, seed, 3, !deadline_check));
    log.push(clock_event("parent"));
    let rig = Rig::start(3, &log).await;
    let store = Arc::new(MemoryStore::new());
    let (res, ttl) = ("holder-pair", ms(300));
    let a_acquired = Arc::new(AtomicBool::new(false));
    let b_wrote = Arc::new(AtomicBool::new(false));
    let a_done = Arc::new(AtomicBool::new(false));

    let a = {
        let (urls, log, store) = (rig.urls(), log.clone(), Arc::clone(&store));
        let (a_acquired, b_wrote, a_done) = (
            Arc::clone(&a_acquired),
            Arc::clone(&b_wrote),
            Arc::clone(&a_done),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("A's runtime");
            rt.block_on(async move {
                let rl = redlock_for(&urls);
                warm_up(&rl, 3).await;
                let mut options =
                    LockOptions::new(ttl).retry(RetryPolicy::attempts(20).with_delay(ms(20)));
                if !deadline_check {
                    options = options.without_deadline_check_for_tests();
                }
                let t0 = now_ns();
                let done = Arc::clone(&a_done);
                let r = rl
                    .with_lock(res, &options, |h| async move {
                        let token = h.token().to_owned();
                        log.push(Event::Acquire {
                            client: "A".into(),
                            res: res.into(),
                            token: token.clone(),
                            mode: Mode::Guard,
                            t0,
                            t1: now_ns(),
                            started: None,
                            valid_until: instant_ns(h.valid_until()),
                            ttl_ns: duration_ns(ttl),
                            loss_margin_ns: Some(duration_ns(h.loss_margin())),
                        });
                        a_acquired.store(true, Ordering::Release);
                        let (value, read_at) = store.read(res);
                        log.push(Event::Fault {
                            kind: FaultKind::HolderStall,
                            node: None,
                            at: now_ns(),
                            detail: "A blocks its thread 2×TTL, and until B wrote, before its is_lost() check".into(),
                        });
                        let cap = Instant::now() + ttl * 2 + Duration::from_secs(5);
                        std::thread::sleep(ttl * 2);
                        while !b_wrote.load(Ordering::Acquire) && Instant::now() < cap {
                            std::thread::sleep(ms(5));
                        }
                        let check_at = now_ns();
                        let lost = h.is_lost();
                        log.push(Event::Observe {
                            client: "A".into(),
                            res: res.into(),
                            token: token.clone(),
                            at: check_at,
                            valid_until: instant_ns(h.valid_until()),
                            lost,
                            ttl_ns: duration_ns(ttl),
                        });
                        if lost {
                            log.push(Event::Skip {
                                client: "A".into(),
                                res: res.into(),
                                token: token.clone(),
                                at: now_ns(),
                                reason: "the holder saw its lock lost".into(),
                            });
                        } else {
                            let at = store.write(res, value + 1);
                            log.push(Event::HolderWrite {
                                client: "A".into(),
                                res: res.into(),
                                token: token.clone(),
                                read_at,
                                read: value,
                                check_at,
                                at,
                                wrote: value + 1,
                                stalled_after_check: false,
                                ttl_ns: duration_ns(ttl),
                            });
                        }
                        done.store(true, Ordering::Release);
                        log.push(Event::Release {
                            client: "A".into(),
                            res: res.into(),
                            token,
                            at: now_ns(),
                            extensions: h.extensions(),
                        });
                    })
                    .await;
                // Whatever happened, B must not wait for ever.
                a_done.store(true, Ordering::Release);
                r
            })
        })
    };

    let deadline = Instant::now() + Duration::from_secs(10);
    while !a_acquired.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "A never acquired");
        tokio::time::sleep(ms(5)).await;
    }
    let b = warmed_up_client(&rig).await;
    let t0 = now_ns();
    let lock_b = b
        .lock_with(
            res,
            ms(3000),
            &RetryPolicy::attempts(200)
                .with_delay(ms(10))
                .with_jitter(ms(10)),
        )
        .await
        .expect("B acquires once A's keys expired");
    log.push(acquire_event("B", &lock_b, t0, now_ns()));
    let (value, read_at) = store.read(res);
    let check_at = now_ns();
    assert!(lock_b.remaining() > Duration::ZERO, "B's lock is valid");
    let at = store.write(res, value + 1);
    log.push(Event::HolderWrite {
        client: "B".into(),
        res: res.into(),
        token: lock_b.token().into(),
        read_at,
        read: value,
        check_at,
        at,
        wrote: value + 1,
        stalled_after_check: false,
        ttl_ns: duration_ns(lock_b.ttl()),
    });
    b_wrote.store(true, Ordering::Release);
    while !a_done.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "A never finished");
        tokio::time::sleep(ms(5)).await;
    }
    log.push(release_event("B", &lock_b));
    let _ = lock_b.unlock().await;
    let _ = blocking(move || a.join().expect("A's thread")).await;
    log_finals(&*store, &[(res.to_owned(), ttl)], &log);
    log.snapshot()
}

/// Ghost keys: nodes 0 and 1 hold a foreign value, so every attempt fails; node
/// 2's `SET` runs only after the client gave up (a paused node, a proxy holding
/// the request), or runs at once but its reply comes too late. Each key must be
/// gone within the TTL of when the node could run it.
async fn ghost_keys(seed: u64) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("ghost-keys", seed, 3, false));
    log.push(clock_event("parent"));
    let rig = Rig::start(3, &log).await;
    let ttl = ms(300);
    let rl = redlock_for(&rig.urls());
    const FOREIGN: &str = "foreign-holder";
    for key in ["ghost-paused", "ghost-held", "ghost-late-reply"] {
        for i in 0..2 {
            let n = Arc::clone(rig.node(i));
            blocking(move || n.cmd(&["SET", key, FOREIGN, "PX", "20000"])).await;
        }
    }
    let fault = |detail: &str| {
        log.push(Event::Fault {
            kind: FaultKind::Proxy,
            node: Some(2),
            at: now_ns(),
            detail: detail.to_owned(),
        });
    };

    // Each case starts on open connections, so the SET is sent at once (a new
    // connection would stop at its handshake instead).

    // A paused node runs the queued SET when it is resumed.
    warm_up(&rl, 3).await;
    rig.node(2).pause();
    log.push(Event::Fault {
        kind: FaultKind::Pause,
        node: Some(2),
        at: now_ns(),
        detail: "SIGSTOP while the client tries".into(),
    });
    assert!(rl.try_lock("ghost-paused", ttl).await.is_err());
    tokio::time::sleep(ms(150)).await; // the client's background release gives up too
    let set_after = now_ns();
    rig.node(2).resume();
    log.push(watch_ghost(&rig, 2, "ghost-paused", ttl, set_after, FOREIGN).await);

    // A proxy holds the request, then flushes it.
    warm_up(&rl, 3).await;
    rig.proxy(2).hold(Direction::Request);
    fault("hold requests while the client tries");
    assert!(rl.try_lock("ghost-held", ttl).await.is_err());
    tokio::time::sleep(ms(150)).await;
    let set_after = now_ns();
    rig.proxy(2).flush();
    log.push(watch_ghost(&rig, 2, "ghost-held", ttl, set_after, FOREIGN).await);

    // The SET runs at once, its reply arrives after the client gave up.
    warm_up(&rl, 3).await;
    rig.proxy(2)
        .delay(Direction::Reply, ms(200), Duration::ZERO);
    fault("reply latency 200 ms while the client tries");
    let set_after = now_ns();
    assert!(rl.try_lock("ghost-late-reply", ttl).await.is_err());
    log.push(watch_ghost(&rig, 2, "ghost-late-reply", ttl, set_after, FOREIGN).await);
    rig.proxy(2).heal();
    log.snapshot()
}

/// After the workload and the nemesis stopped: heal, log the final counts, probe
/// liveness, then wait out every TTL (lengthened ones too) and report any lock key
/// still on a node as a ghost.
async fn finish(
    rig: &Rig,
    nemesis: &mut Nemesis<'_>,
    store: &dyn Store,
    resources: &[(String, Duration)],
    ttl_max: Duration,
    log: &HistoryLog,
) {
    let healed_at = nemesis.heal_all().await;
    log_finals(store, resources, log);
    let probe = redlock_for(&rig.urls());
    probe_liveness(&probe, resources, BUDGET, healed_at, log).await;
    // Lengthened keys live up to 3×TTL from before the heal; every other key at
    // most one TTL from the heal.
    let lifetime = ttl_max * 3;
    let wait = duration_ns(lifetime + ms(200)).saturating_sub(now_ns() - healed_at);
    tokio::time::sleep(Duration::from_nanos(wait)).await;
    let keys: Vec<String> = resources.iter().map(|(r, _)| r.clone()).collect();
    for (node, key) in rig.leftover_keys(&keys).await {
        let n = Arc::clone(rig.node(node));
        let k = key.clone();
        let pttl: i64 = blocking(move || n.pttl(&k)).await;
        log.push(Event::Ghost {
            node,
            key,
            ttl_ns: duration_ns(lifetime),
            set_after: healed_at,
            max_pttl_ms: pttl,
            last_present: Some(now_ns()),
        });
    }
}

/// The node timeout of the `max_hold` clients: above the slow path's round trip
/// (40–80 ms), below their TTL.
const SLOW_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// A Redlock for the slow path (the library's default drift, like the others).
fn slow_redlock(urls: &[String]) -> Redlock {
    Redlock::builder()
        .urls(urls.iter().cloned())
        .node_timeout(SLOW_NODE_TIMEOUT)
        .drift_factor(DRIFT_FACTOR)
        .fixed_drift(FIXED_DRIFT)
        .build()
        .expect("build the slow path's Redlock")
}

/// The randomized run with clients as tasks of this process, plus holder-view
/// clients on their own threads (current-thread runtimes, resources `h0`, `h1`)
/// and `max_hold` clients through slow proxies (resource `m0`).
async fn randomized_in_process(seed: u64, run_for: Duration) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("in-process", seed, 5, false));
    log.push(clock_event("parent"));
    let mut rig = Rig::start(5, &log).await;
    let resources: Vec<(String, Duration)> = vec![
        ("r0".into(), ms(250)),
        ("r1".into(), ms(300)),
        ("r2".into(), ms(400)),
    ];
    let holder_resources: Vec<(String, Duration)> =
        vec![("h0".into(), ms(300)), ("h1".into(), ms(250))];
    let max_hold_resources: Vec<(String, Duration)> = vec![("m0".into(), ms(600))];
    let all_resources: Vec<(String, Duration)> = resources
        .iter()
        .chain(&holder_resources)
        .chain(&max_hold_resources)
        .cloned()
        .collect();
    let ttl_max = ms(400);
    let slow_urls = rig.start_slow_path(seed, &log).await;
    let holder_stalls = Arc::new(HolderStalls::new());
    let stalls = Arc::new(AtomicU32::new(0));
    let store = Arc::new(MemoryStore::new());
    let until = Instant::now() + run_for;
    let clients: Vec<_> = (0..6u64)
        .map(|i| {
            let cfg = ClientConfig {
                name: format!("c{i}"),
                resources: resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(31).wrapping_add(i),
                guard_share: 0.3,
                stalls: Some(Arc::clone(&stalls)),
            };
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(run_client(
                redlock_for(&rig.urls()),
                cfg,
                store,
                log.clone(),
            ))
        })
        .collect();
    // Two clients lock pairs of the same resources (`lock_many`): every key of
    // a pair is checked against every other holder of that key.
    let many_clients: Vec<_> = (0..2u64)
        .map(|i| {
            let cfg = ClientConfig {
                name: format!("k{i}"),
                resources: resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(43).wrapping_add(i),
                guard_share: 0.0,
                stalls: None,
            };
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(run_many_client(
                redlock_for(&rig.urls()),
                cfg,
                store,
                log.clone(),
            ))
        })
        .collect();
    let holders: Vec<_> = (0..3u64)
        .map(|i| {
            let cfg = HolderConfig {
                name: format!("h{i}"),
                resources: holder_resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(37).wrapping_add(i),
                stalls: Some(Arc::clone(&holder_stalls)),
                deadline_check: true,
            };
            let store: Arc<dyn Store> = store.clone();
            spawn_holder_thread(redlock_for(&rig.urls()), cfg, store, log.clone())
        })
        .collect();
    let max_holders: Vec<_> = (0..2u64)
        .map(|i| {
            let cfg = MaxHoldConfig {
                name: format!("m{i}"),
                resources: max_hold_resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(41).wrapping_add(i),
                max_hold: (0.83, 0.97),
                path: format!(
                    "through the slow proxies, node timeout {} ms",
                    SLOW_NODE_TIMEOUT.as_millis()
                ),
            };
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(run_max_hold_client(
                slow_redlock(&slow_urls),
                cfg,
                store,
                log.clone(),
            ))
        })
        .collect();
    let mut nemesis = Nemesis::new(
        &rig,
        NemesisConfig {
            seed,
            ttl_max,
            keys: all_resources.iter().map(|(r, _)| r.clone()).collect(),
            gap: (ms(100), ms(400)),
            stall: StallTarget::InProcess(Arc::clone(&stalls)),
            ttl_longest: ms(600),
            holder_stalls: Some(Arc::clone(&holder_stalls)),
        },
        log.clone(),
    );
    nemesis.run_until(until).await;
    for c in clients.into_iter().chain(max_holders) {
        c.await.expect("client task");
    }
    for c in many_clients {
        let stats = c.await.expect("multi-key client task");
        println!(
            "  multi-key client: sections={} acquired={} writes={}",
            stats.sections, stats.acquired, stats.writes
        );
    }
    for h in holders {
        blocking(move || h.join().expect("holder thread")).await;
    }
    finish(&rig, &mut nemesis, &*store, &all_resources, ttl_max, &log).await;
    log.snapshot()
}

/// Client processes: killed (and continued, so a stopped one dies) on drop.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The randomized run with clients in separate OS processes.
async fn randomized_processes(seed: u64, run_for: Duration, dir: &Path) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("multi-process", seed, 3, false));
    log.push(clock_event("parent"));
    let rig = Rig::start(3, &log).await;
    let resources: Vec<(String, Duration)> = vec![("p0".into(), ms(300)), ("p1".into(), ms(400))];
    let ttl_max = ms(400);
    let work = tempfile::Builder::new()
        .prefix("redlock-fault-")
        .tempdir()
        .expect("temp dir");
    let store = FileStore::new(work.path().join("store"));
    let urls = rig.urls().join(",");
    let res_arg: Vec<String> = resources
        .iter()
        .map(|(r, t)| format!("{r}:{}", t.as_millis()))
        .collect();
    let mut children = Children(Vec::new());
    let mut files = Vec::new();
    for p in 0..3u64 {
        let history = dir.join(format!("multi-process-client-p{p}.jsonl"));
        let _ = std::fs::remove_file(&history);
        let child = Command::new(env!("CARGO_BIN_EXE_fault_client"))
            .args(["--name", &format!("p{p}")])
            .args(["--nodes", &urls])
            .args(["--resources", &res_arg.join(",")])
            .args(["--store", &work.path().join("store").to_string_lossy()])
            .args(["--history", &history.to_string_lossy()])
            .args(["--secs", &format!("{:.3}", run_for.as_secs_f64())])
            .args(["--tasks", "2"])
            .args(["--seed", &seed.wrapping_mul(7).wrapping_add(p).to_string()])
            .args(["--guard-share", "0.3"])
            .args(["--budget-ms", &BUDGET.as_millis().to_string()])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn fault_client");
        children.0.push(child);
        files.push(history);
    }
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    let until = Instant::now() + run_for;
    let mut nemesis = Nemesis::new(
        &rig,
        NemesisConfig {
            seed,
            ttl_max,
            keys: resources.iter().map(|(r, _)| r.clone()).collect(),
            gap: (ms(100), ms(400)),
            stall: StallTarget::Processes(pids),
            ttl_longest: ttl_max,
            holder_stalls: None,
        },
        log.clone(),
    );
    nemesis.run_until(until).await;
    // Stalled clients are continued before waiting for them.
    nemesis.heal_all().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for c in &mut children.0 {
        loop {
            match c.try_wait().expect("wait for a client") {
                Some(status) => {
                    assert!(status.success(), "fault_client failed: {status}");
                    break;
                }
                None if Instant::now() > deadline => panic!("a fault_client did not finish"),
                None => tokio::time::sleep(ms(50)).await,
            }
        }
    }
    for f in &files {
        log.extend(read_jsonl(f).expect("read a client's history"));
        let _ = std::fs::remove_file(f);
    }
    finish(&rig, &mut nemesis, &store, &resources, ttl_max, &log).await;
    log.snapshot()
}

/// The validity checker on a real history: a manual acquisition whose deadline is
/// moved 1 µs past `first sighting + ttl − drift`, and an extension whose deadline
/// is moved 1 µs past `start + ttl − drift`, must both be reported.
fn stale_validity_mutations_caught(events: &[Event]) -> (usize, usize) {
    let allowed = |ttl_ns: u64| {
        let ttl = Duration::from_nanos(ttl_ns);
        duration_ns(ttl - ttl.mul_f64(DRIFT_FACTOR) - FIXED_DRIFT)
    };
    let first_seen = |token: &str| {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Sighting { token: t, at, .. } if t == token => Some(*at),
                _ => None,
            })
            .min()
    };
    let base = check(events).stale_validity.len();
    let (mut tried, mut caught) = (0, 0);
    let acquire = events.iter().position(|e| {
        matches!(e, Event::Acquire { mode: Mode::Manual, token, .. } if first_seen(token).is_some())
    });
    let extend = events
        .iter()
        .position(|e| matches!(e, Event::Extend { error: None, .. }));
    for i in [acquire, extend].into_iter().flatten() {
        let mut mutated = events.to_vec();
        match &mut mutated[i] {
            Event::Acquire {
                token,
                valid_until,
                ttl_ns,
                ..
            } => {
                let first = first_seen(token).expect("a sighting");
                *valid_until = first + allowed(*ttl_ns) + 1_000;
            }
            Event::Extend {
                started: Some(s),
                valid_until: Some(v),
                ttl_ns,
                ..
            } => *v = *s + allowed(*ttl_ns) + 1_000,
            _ => continue,
        }
        tried += 1;
        caught += usize::from(check(&mutated).stale_validity.len() > base);
    }
    (tried, caught)
}

fn save_and_check(dir: &Path, name: &str, events: &[Event]) -> Verdict {
    let path = dir.join(format!("{name}.jsonl"));
    write_jsonl(&path, events).expect("write a history");
    let v = check(events);
    println!(
        "  {name}: acquisitions={} extensions={} writes={} skipped={} overlaps={} lost_updates={} \
         stale_validity={} late_writes={} ghosts(violations/checked/seen)={}/{}/{} liveness={} \
         holder_view[writes={} judged={} overlaps={} lost_updates={} stalled_after_check={} \
         (inside another hold: {}) shortened_validities={}] history={}",
        v.acquisitions,
        v.extensions,
        v.writes,
        v.skips,
        v.overlaps.len(),
        v.lost_updates,
        v.stale_validity.len(),
        v.late_writes.len(),
        v.ghost_violations.len(),
        v.ghosts_checked,
        v.ghosts_seen,
        v.liveness_ok.map_or("n/a".to_owned(), |b| b.to_string()),
        v.holder_writes,
        v.holder_checked,
        v.holder_overlaps.len(),
        v.holder_lost_updates,
        v.stalled_after_check,
        v.stalled_overlapping,
        v.shortened,
        path.display()
    );
    if !v.passed() || v.expect_violation {
        print!("{}", v.describe(5));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_suite() {
    // The fenced workloads wait for their turn meanwhile (see `crate::HEAVY`).
    let _turn = crate::HEAVY.write().await;
    let started = Instant::now();
    let seed =
        env_u64("REDLOCK_SEED").unwrap_or_else(|| rand::rng().random_range(1..1_000_000_000));
    let soak = env_u64("REDLOCK_SOAK_SECS").map(Duration::from_secs);
    println!(
        "fault suite: seed {seed} (replay the schedule with REDLOCK_SEED={seed}){}",
        soak.map_or(String::new(), |s| format!(" soak={}s", s.as_secs()))
    );
    let (in_process, processes) = match soak {
        Some(s) => (s.mul_f64(0.6), s.mul_f64(0.4)),
        None => (Duration::from_secs(35), Duration::from_secs(20)),
    };
    let dir: PathBuf = history_dir(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("fault-histories"))
        .join(seed.to_string());
    std::fs::create_dir_all(&dir).expect("create the history dir");

    let mut summary = Summary {
        seed,
        processes: 3,
        ..Summary::default()
    };
    let mut verdicts = Vec::new();
    let h = negative_restart_without_delay(seed).await;
    verdicts.push(save_and_check(&dir, "nc-restart-without-delay", &h));
    let h = negative_early_expiry(seed).await;
    verdicts.push(save_and_check(
        &dir,
        "nc-early-expiry-while-unreachable",
        &h,
    ));
    let h = holder_stall_pair(seed, false).await;
    verdicts.push(save_and_check(
        &dir,
        "nc-holder-stall-without-deadline-check",
        &h,
    ));
    let h = holder_stall_pair(seed, true).await;
    verdicts.push(save_and_check(&dir, "holder-stall-pair", &h));
    let h = ghost_keys(seed).await;
    verdicts.push(save_and_check(&dir, "ghost-keys", &h));
    let h = randomized_in_process(seed, in_process).await;
    verdicts.push(save_and_check(&dir, "in-process", &h));
    // The multi-key clients' acquisitions: one `Acquire` per key of a set.
    summary.multi_key_acquisitions = h
        .iter()
        .filter(|e| matches!(e, Event::Acquire { client, .. } if client.starts_with('k')))
        .count() as u64
        / 2;
    let (tried, caught) = stale_validity_mutations_caught(&h);
    println!("  stale-validity mutations of the in-process history caught: {caught}/{tried}");
    assert!(
        tried > 0 && caught == tried,
        "the validity checker missed an overstated validity"
    );
    let h = randomized_processes(seed, processes, &dir).await;
    verdicts.push(save_and_check(&dir, "multi-process", &h));

    for v in &verdicts {
        summary.add(v);
    }
    summary.secs = started.elapsed().as_secs_f64();
    // Straight to the process's stderr, past libtest's capture: the summary line
    // shows in CI logs even when the test passes.
    {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "{}", summary.line());
    }
    for v in verdicts.iter().filter(|v| v.expect_violation) {
        assert!(
            v.caught(),
            "negative control {} was NOT caught: the checker cannot fail",
            v.scenario
        );
        assert!(
            v.all_lost_updates() > 0,
            "negative control {}: the lost-update checker missed the lost write",
            v.scenario
        );
    }
    assert!(
        summary.passed(),
        "fault suite failed (seed {seed}, histories in {}):\n{}",
        dir.display(),
        verdicts
            .iter()
            .filter(|v| !v.passed())
            .map(|v| format!("{}:\n{}", v.scenario, v.describe(10)))
            .collect::<String>()
    );
    // Coverage, not a property: the multi-key clients must have taken their
    // sets at least once. Under the nemesis they lose most races to the
    // single-key clients, and in the 20 s Valkey soak they took 3–12 sets
    // (seed 154949092 gave 3 in one CI run, 9 and 12 when run again), so a
    // higher floor made the suite flaky.
    assert!(
        summary.multi_key_acquisitions >= 1,
        "the multi-key workload never took a set: {}",
        summary.line()
    );
    assert!(
        summary.acquisitions > 100,
        "the workload barely ran: {}",
        summary.line()
    );
}
