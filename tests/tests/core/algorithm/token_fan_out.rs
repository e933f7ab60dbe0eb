//! Steps 1 and 2 of the distlock page: a fresh 128-bit token per attempt, and the fan-out that returns at quorum while late answers join or are released.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_tests::Cluster;

use super::*;

// ---------------------------------------------------------------- 1. token

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn token_stored_at_key_is_128_bit_hex_and_fresh_per_lock() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "token-stored";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    let first = lock.token().to_owned();
    assert!(is_token(&first), "token {first:?} is not 32 hex chars");
    for node in cluster.nodes() {
        assert_eq!(node.get(key).as_deref(), Some(first.as_str()));
    }
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    assert!(is_token(lock.token()));
    assert_ne!(lock.token(), first, "a new lock must get a new token");
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn every_retry_attempt_uses_a_fresh_token() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "token-per-attempt";
    occupy(&cluster, 0, key, "other");
    occupy(&cluster, 1, key, "other");
    let monitor = cluster.node(2).monitor();
    let policy = RetryPolicy::attempts(3)
        .with_delay(ms(20))
        .with_jitter(Duration::ZERO);
    let err = rl
        .mutex(key)
        .acquire_with(Duration::from_secs(5), &policy)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // Every attempt's key on the free node is released (maybe in the background).
    assert!(cluster.wait_until(timing::settled(), |c| c.node(2).get(key).is_none()));
    let cmds = stop_commands(monitor);
    let acquires = acquire_calls(&cmds, key);
    assert_eq!(acquires.len(), 3, "one acquire per attempt: {cmds:?}");
    let tokens: HashSet<&str> = acquires.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tokens.len(),
        3,
        "tokens reused across attempts: {acquires:?}"
    );
    for (token, ttl) in &acquires {
        assert!(is_token(token), "token {token:?} is not 32 hex chars");
        assert_eq!(ttl, "5000");
    }
    // Each failed attempt was released on the node where it landed.
    let released: HashSet<String> = release_calls(&cmds, key).into_iter().collect();
    for (token, _) in &acquires {
        assert!(released.contains(token), "attempt {token} not released");
    }
}

// ---------------------------------------------------------------- 2. fan-out

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn acquire_returns_at_quorum_and_late_sets_join_the_lock() {
    let cluster = Cluster::start(5);
    // Waiting for the paused nodes would take the whole node timeout: it is
    // set beyond what a quorum of answering nodes needs on a loaded machine.
    let node_timeout = timing::liveness(PATIENT_NODE_TIMEOUT);
    let rl = ready(&cluster, node_timeout).await;
    let key = "fan-out-ok";
    cluster.node(3).pause();
    cluster.node(4).pause();
    let t0 = Instant::now();
    let result = rl.mutex(key).try_acquire(Duration::from_secs(60)).await;
    let took = t0.elapsed();
    cluster.node(3).resume();
    cluster.node(4).resume();
    let lock = result.unwrap();
    assert!(
        took < node_timeout,
        "acquire waited for paused nodes: {took:?}"
    );
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(timing::settled(), |c| {
            c.node(3).get(key).as_deref() == Some(token.as_str())
                && c.node(4).get(key).as_deref() == Some(token.as_str())
        }),
        "late SETs did not land on the resumed nodes"
    );
    assert_eq!(cluster.count_holding(key, &token), 5);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 5);
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0));
}

/// On a fresh handle the connections are still being made when the two fastest
/// nodes decide the outcome; the slowest node's `SET` must still go out and land,
/// so the lock ends up on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn late_answers_on_a_fresh_handle_still_join_the_lock() {
    let cluster = Cluster::start(3);
    for round in 0..10 {
        // The subject is late answers, not a slow node: every call answered.
        let rl = cluster.patient_redlock();
        let key = format!("fresh-handle:{round}");
        let lock = rl
            .mutex(&key)
            .try_acquire(Duration::from_secs(30))
            .await
            .unwrap();
        let token = lock.token().to_owned();
        assert!(
            cluster.wait_until(timing::settled(), |c| c.count_holding(&key, &token) == 3),
            "round {round}: the lock never reached the third node: {:?}",
            cluster
                .nodes()
                .iter()
                .map(|n| n.get(&key))
                .collect::<Vec<_>>()
        );
        rl.unlock(lock).await.unwrap();
        assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(&key) == 0));
    }
}

/// A handle on pools whose connections carry at most `limit` commands at a
/// time (redis' `concurrency_limit`: a command waits for room until an
/// earlier one is answered), with no response timeout of redis' own.
pub(super) fn with_concurrency_limit(
    cluster: &Cluster,
    limit: usize,
    node_timeout: Duration,
) -> Redlock {
    use deadpool_redis::redis::{AsyncConnectionConfig, IntoConnectionInfo};
    cluster
        .urls()
        .iter()
        .fold(Redlock::builder(), |b, url| {
            let info = url.as_str().into_connection_info().unwrap();
            let config = AsyncConnectionConfig::new()
                .set_concurrency_limit(limit)
                .set_response_timeout(None);
            let manager = deadpool_redis::Manager::new_with_config(info, config).unwrap();
            let pool = deadpool_redis::Pool::builder(manager)
                .runtime(deadpool_redis::Runtime::Tokio1)
                .build()
                .unwrap();
            b.pool(pool)
        })
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// An acquire's `SET` that waits for room on its connection when the quorum
/// decides (redis' queue of 50 commands full under load, or a concurrency
/// limit) goes out later, and the release of the same lock, sent meanwhile
/// on that connection, can get the room first: it runs on the node before
/// the `SET`, finds nothing, and the late `SET` lands after it. That key must
/// still be released when its answer comes, not left to block the resource
/// for its whole TTL (seen in `bench concurrent`: dozens of such keys per run
/// with the default queue).
///
/// Node 4's connection carries one command at a time, and node 4 is paused
/// while the first lock's `SET` is in flight there: the second lock's `SET`
/// and then its release both wait for that room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_set_overtaken_by_its_release_is_released_again() {
    let cluster = Cluster::start(5);
    let rl = with_concurrency_limit(&cluster, 1, Duration::from_secs(2));
    warm_up(&cluster, &rl).await;
    let ttl = Duration::from_secs(120);
    let mut left = Vec::new();
    for round in 0..5 {
        let (first, second) = (
            format!("overtaken:{round}:a"),
            format!("overtaken:{round}:b"),
        );
        cluster.node(4).pause();
        let a = rl.mutex(&first).try_acquire(ttl).await.unwrap();
        let b = rl.mutex(&second).try_acquire(ttl).await.unwrap();
        let release = tokio::spawn({
            let rl = rl.clone();
            async move { rl.unlock(b).await }
        });
        // The release's own calls are out (nodes 0-3 answer) before node 4
        // gives the room back.
        assert!(
            cluster.wait_until(timing::settled(), |c| (0..4)
                .all(|i| c.node(i).get(&second).is_none())),
            "round {round}: the release did not reach nodes 0-3"
        );
        cluster.node(4).resume();
        release.await.unwrap().unwrap();
        rl.unlock(a).await.unwrap();
        let clean = cluster.wait_until(timing::settled(), |c| c.node(4).keys().is_empty());
        if !clean {
            left.push((round, cluster.node(4).keys()));
        }
    }
    assert!(
        left.is_empty(),
        "keys left on node 4 after their release: {left:?}"
    );
}

/// Nodes 0–2 hold `key` for someone else and node 4 is paused: a `try_lock` is
/// decided "busy" by the first answers. Returns how long it took and whether
/// the paused node was still pending at the decision (node 3 may be too: a
/// quorum of busy answers decides, not every answer), once node 4, resumed,
/// has had its late `SET` (if it ran) released in the background.
pub(super) async fn busy_with_a_paused_node(
    node_timeout: Duration,
    key: &str,
) -> (Duration, PausedPending) {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, node_timeout).await;
    for i in 0..3 {
        occupy(&cluster, i, key, "other");
    }
    cluster.node(4).pause();
    let t0 = Instant::now();
    let result = rl.mutex(key).try_acquire(Duration::from_secs(10)).await;
    let took = t0.elapsed();
    cluster.node(4).resume();
    let err = result.unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    let pending = err
        .report()
        .is_some_and(|r| matches!(r.nodes[4].status, redlock_core::NodeStatus::Pending));
    // Node 3 stored the token and is released with the failure's release
    // round, node 4 (late) in the background: wait for both, as the release
    // of node 3 may still be on its way when node 4's has landed (seen on
    // Valkey 9).
    let released = cluster.wait_until(redlock_tests::timing::settle(node_timeout), |c| {
        c.node(4).keys().is_empty() && c.node(3).get(key).is_none()
    });
    assert!(
        released,
        "node 3 kept {:?}, node 4 kept {:?}",
        cluster.node(3).get(key),
        cluster.node(4).get(key)
    );
    (took, pending)
}

/// Whether the paused node (4) was pending when a failure was decided.
type PausedPending = bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn failed_attempt_returns_early_and_late_set_is_released() {
    let (took, pending) = busy_with_a_paused_node(Duration::from_secs(2), "fan-out-busy").await;
    // Decided without the paused node: it was still pending then (had the
    // failure waited for it, it would have timed out).
    assert!(
        pending,
        "a decided failure waited for the paused node: {took:?}"
    );
}

/// The same failure with a node timeout below the 500 ms response timeout that
/// redis-rs applies on its own (see `core_faults::node_timeout_above_500ms_is_honoured`),
/// so that cap does not hide how long the failed attempt waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn failed_attempt_does_not_wait_for_unanswered_nodes() {
    let (took, pending) = busy_with_a_paused_node(ms(450), "fan-out-busy-pending").await;
    // The paused node was still pending at the decision: the failure did not
    // wait for its timeout (nor for redis-rs's 500 ms cap).
    assert!(
        pending,
        "Busy was decided by 3 fast answers, yet try_lock waited for the paused node: \
         {took:?} (node_timeout 450 ms)"
    );
}
