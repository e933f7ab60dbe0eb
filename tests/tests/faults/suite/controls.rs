//! The negative controls the checkers must catch (a restart without delay, an early expiry), and the holder-stall pair.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{LockOptions, RetryPolicy};
use redlock_tests::history::{Event, FaultKind, HistoryLog, Mode, duration_ns, instant_ns, now_ns};
use redlock_tests::nemesis::{Rig, clock_event, meta, redlock_for};
use redlock_tests::workload::{MemoryStore, Store, log_finals};

use super::*;

/// Negative control 1: holder A gets a bare quorum (nodes 0, 1) because node 2 is
/// blackholed during its acquire; node 1 is then killed and restarted at once with
/// no persistence (breaking the restart-delay rule), so B gets nodes 1 and 2
/// while A's validity runs. Both read the counter, then both write.
pub(super) async fn negative_restart_without_delay(seed: u64) -> Vec<Event> {
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
        .mutex(res)
        .acquire_with(ttl, &RetryPolicy::attempts(10).with_delay(ms(20)))
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
pub(super) async fn b_takes_over(
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
        .mutex(res)
        .acquire_with(ttl, &RetryPolicy::attempts(10).with_delay(ms(20)))
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
pub(super) async fn negative_early_expiry(seed: u64) -> Vec<Event> {
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
        .mutex(res)
        .acquire_with(ttl, &RetryPolicy::attempts(10).with_delay(ms(20)))
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
pub(super) async fn holder_stall_pair(seed: u64, deadline_check: bool) -> Vec<Event> {
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
                    .mutex(res).run(&options, |h| async move {
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
        .mutex(res)
        .acquire_with(
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
