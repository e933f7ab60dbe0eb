//! Reconnects: slow handshakes, one connection attempt for concurrent callers, late failures on old connections.

use std::sync::Arc;
use std::time::Duration;

use redlock_core::{NodeError, Redlock};
use redlock_tests::{Cluster, RedisNode};

use super::*;

// ------------------------------------------------- reconnects (issue 10, A)

/// Through three proxies adding `one_way` each direction, a long-lived handle
/// with a 200 ms node timeout makes 20 `try_lock` + `unlock` attempts 100 ms
/// apart. Returns whether the first attempt acquired and how many of the
/// 19 others did; any failure must be the honest answer to a slow node (node
/// timeouts, nothing else).
pub(super) async fn acquired_through_latency(one_way: Duration) -> (bool, usize) {
    use redlock_tests::proxy::{Direction, FaultProxy};
    let cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        let proxy = FaultProxy::start(i, node.port(), None).await.unwrap();
        proxy.delay(Direction::Request, one_way, Duration::ZERO);
        proxy.delay(Direction::Reply, one_way, Duration::ZERO);
        proxies.push(proxy);
    }
    let rl = Redlock::builder()
        .urls(proxies.iter().map(|p| p.url()))
        .node_timeout(ms(200))
        .build()
        .unwrap();
    let mut outcomes = Vec::new();
    for i in 0..20 {
        let acquired = match rl
            .mutex(format!("rtt-{i}"))
            .try_acquire(Duration::from_secs(2))
            .await
        {
            Ok(lock) => {
                let _ = rl.unlock(lock).await;
                true
            }
            Err(e) => {
                eprintln!("{one_way:?} each way, attempt {i}: {e}");
                let report = e.report().unwrap_or_else(|| panic!("{e:?}"));
                assert!(
                    report
                        .errors()
                        .all(|(_, err)| matches!(err, redlock_core::NodeError::Timeout(_))),
                    "attempt {i}: a failure other than a node timeout: {e:?}"
                );
                false
            }
        };
        outcomes.push(acquired);
        tokio::time::sleep(ms(100)).await;
    }
    let rest = outcomes[1..].iter().filter(|a| **a).count();
    (outcomes[0], rest)
}

/// A connect + handshake (one round trip) plus the `SET` (another) take 240 ms
/// at 120 ms RTT, longer than the 200 ms node timeout: the first call times
/// out, but the connection it waited for must stay, so the later calls
/// (120 ms) succeed. A loaded machine may time out a later call too (an
/// honest answer: a node timeout); had the connection not been kept, every
/// later call would need a new handshake and time out, so most succeeding
/// is the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn reconnect_survives_a_handshake_longer_than_the_node_timeout() {
    let (first_80, rest_80) = acquired_through_latency(ms(40)).await;
    let (first_120, rest_120) = acquired_through_latency(ms(60)).await;
    eprintln!(
        "80 ms RTT: first {first_80}, {rest_80}/19 after; 120 ms RTT: first {first_120}, {rest_120}/19 after"
    );
    assert!(rest_80 > 19 / 2, "80 ms RTT: {rest_80} of 19 acquired");
    assert!(rest_120 > 19 / 2, "120 ms RTT: {rest_120} of 19 acquired");
}

/// `total_connections_received` on the node (the connection that asks counts).
pub(super) fn connections_received(node: &RedisNode) -> i64 {
    let info: String = node.raw(&["INFO", "stats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .expect("total_connections_received in INFO stats")
}

/// Concurrent callers on a cold node wait for one connection attempt instead of
/// each opening its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn concurrent_callers_on_a_cold_node_open_one_connection() {
    let node = RedisNode::start();
    let rl = build(vec![node.url()], ms(500));
    let before = connections_received(&node);
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (rl, barrier) = (rl.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let lock = rl
                    .mutex(format!("cold-{i}"))
                    .try_acquire(Duration::from_secs(5))
                    .await
                    .unwrap();
                rl.unlock(lock).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Less the connection that asked the second time.
    let opened = connections_received(&node) - before - 1;
    assert_eq!(
        opened, 1,
        "16 concurrent callers opened {opened} connections"
    );
}

/// A call that fails on an old connection after a newer one replaced it must
/// not drop the newer one. X and Y are sent on connection 1 into a blackhole;
/// X times out first and forgets connection 1; X's release opens connection 2
/// (new connections pass again); then Y times out on connection 1. The next
/// calls must still use connection 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_late_failure_on_an_old_connection_keeps_the_new_one() {
    use redlock_tests::proxy::{DirFault, Direction, FaultProxy};
    let node = RedisNode::start();
    let proxy = FaultProxy::start(0, node.port(), None).await.unwrap();
    let rl = build(vec![proxy.url()], ms(400));
    let lock = rl
        .mutex("warm-up")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    assert_eq!(proxy.stats().accepted, 1);

    proxy.blackhole();
    let x = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.mutex("late-x").try_acquire(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(ms(200)).await;
    let y = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.mutex("late-y").try_acquire(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(ms(50)).await;
    // New connections pass; connection 1 lost bytes, so it stays dead (no reset).
    proxy.set(Direction::Request, DirFault::default());
    proxy.set(Direction::Reply, DirFault::default());
    let x = x.await.unwrap().unwrap_err();
    assert!(x.report().is_some(), "{x:?}");
    assert!(
        wait_for(Duration::from_secs(1), || proxy.stats().accepted == 2),
        "X's release did not reconnect: {:?}",
        proxy.stats()
    );
    let y = y.await.unwrap().unwrap_err();
    let report = y.report().unwrap_or_else(|| panic!("{y:?}"));
    assert!(
        report
            .errors()
            .all(|(_, e)| matches!(e, NodeError::Timeout(_))),
        "{y}"
    );
    tokio::time::sleep(ms(100)).await;
    let lock = rl
        .mutex("after")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    assert_eq!(
        proxy.stats().accepted,
        2,
        "Y's late timeout dropped the newer connection"
    );
}

/// A `SET` that waits for a cold connection's handshake and the release sent
/// after it wait for the same handshake, and may go out in either order: the
/// release can run first on that node and find nothing. The late `OK` must then
/// be released again; otherwise its key blocks the resource there for its TTL.
/// Node 2 sits behind a proxy that holds its replies until the lock has been
/// taken and released on nodes 0 and 1; each round uses a new handle, so node
/// 2's connection is cold each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_late_set_behind_a_cold_handshake_is_not_left_by_the_release() {
    use redlock_tests::proxy::{Direction, FaultProxy};
    let cluster = Cluster::start(3);
    let proxy = FaultProxy::start(2, cluster.node(2).port(), None)
        .await
        .unwrap();
    let urls = vec![cluster.node(0).url(), cluster.node(1).url(), proxy.url()];
    let mut ghosts = Vec::new();
    for round in 0..20 {
        let key = format!("cold-{round}");
        proxy.hold(Direction::Reply);
        let rl = build(urls.clone(), ms(3000));
        let lock = rl
            .mutex(&key)
            .try_acquire(Duration::from_secs(60))
            .await
            .unwrap();
        rl.unlock(lock).await.unwrap();
        proxy.flush();
        // Both calls reach node 2 once the handshake is through; a key that
        // is still there long after that was left behind.
        let gone = wait_for(Duration::from_secs(5), || cluster.count_with_key(&key) == 0);
        if !gone {
            ghosts.push((round, cluster.node(2).pttl(&key)));
        }
    }
    assert!(
        ghosts.is_empty(),
        "keys left on node 2 after the release (round, PTTL ms): {ghosts:?}"
    );
}
