//! Ghost keys: SETs that land after their client gave up expire within the TTL.

use std::sync::Arc;
use std::time::Duration;

use redlock_tests::history::{Event, FaultKind, HistoryLog, duration_ns, now_ns};
use redlock_tests::nemesis::{Nemesis, Rig, clock_event, meta, redlock_for, watch_ghost};
use redlock_tests::proxy::Direction;
use redlock_tests::workload::{Store, log_finals, probe_liveness};

use super::*;

/// Ghost keys: nodes 0 and 1 hold a foreign value, so every attempt fails; node
/// 2's `SET` runs only after the client gave up (a paused node, a proxy holding
/// the request), or runs at once but its reply comes too late. Each key must be
/// gone within the TTL of when the node could run it.
pub(super) async fn ghost_keys(seed: u64) -> Vec<Event> {
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
    assert!(rl.mutex("ghost-paused").try_acquire(ttl).await.is_err());
    tokio::time::sleep(ms(150)).await; // the client's background release gives up too
    let set_after = now_ns();
    rig.node(2).resume();
    log.push(watch_ghost(&rig, 2, "ghost-paused", ttl, set_after, FOREIGN).await);

    // A proxy holds the request, then flushes it.
    warm_up(&rl, 3).await;
    rig.proxy(2).hold(Direction::Request);
    fault("hold requests while the client tries");
    assert!(rl.mutex("ghost-held").try_acquire(ttl).await.is_err());
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
    assert!(rl.mutex("ghost-late-reply").try_acquire(ttl).await.is_err());
    log.push(watch_ghost(&rig, 2, "ghost-late-reply", ttl, set_after, FOREIGN).await);
    rig.proxy(2).heal();
    log.snapshot()
}

/// After the workload and the nemesis stopped: heal, log the final counts, probe
/// liveness, then wait out every TTL (lengthened ones too) and report any lock key
/// still on a node as a ghost.
pub(super) async fn finish(
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
