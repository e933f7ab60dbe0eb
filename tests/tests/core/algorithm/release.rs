//! Step 5: the compare-and-delete release, its fallbacks and the calls it leaves running.

use std::time::{Duration, Instant};

use redlock_core::{Error, Lock, Redlock};
use redlock_tests::Cluster;
use redlock_tests::monitor::Monitor;

use super::*;

// ---------------------------------------------------------------- 5. release

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn release_falls_back_to_eval_after_script_flush() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "release-noscript";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    for node in cluster.nodes() {
        node.cmd(&["SCRIPT", "FLUSH"]);
    }
    let monitor = cluster.node(1).monitor();
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    // Decided at quorum: the last node may finish in the background.
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0));
    let cmds = stop_commands(monitor);
    assert!(
        cmds.iter()
            .any(|c| c[0].eq_ignore_ascii_case("EVAL") && c.get(3).map(String::as_str) == Some(key)),
        "no EVAL fallback seen: {cmds:?}"
    );
}

/// Unlocks `lock` (of `key`, held on all five nodes) while nodes 3 and 4 are
/// paused, then asserts that it was decided by the other three (the paused
/// nodes still pending in its report, so it did not wait for them), and
/// that the paused nodes' compare-and-deletes ran once they resumed.
pub(super) async fn release_with_two_late(cluster: &Cluster, rl: &Redlock, lock: Lock, key: &str) {
    cluster.node(3).pause();
    cluster.node(4).pause();
    let t0 = Instant::now();
    let released = rl.unlock(lock).await;
    let took = t0.elapsed();
    cluster.node(3).resume();
    cluster.node(4).resume();
    let released = released.unwrap();
    redlock_tests::util::assert_released(&released, 3);
    let report = released.report();
    assert!(
        report.nodes[3..]
            .iter()
            .all(|n| n.status == redlock_core::NodeStatus::Pending),
        "{key}: the release waited for a paused node ({took:?}): {report}"
    );
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0),
        "{key}: a late node kept the key: {:?}",
        cluster
            .nodes()
            .iter()
            .map(|n| n.get(key))
            .collect::<Vec<_>>()
    );
}

/// A release returns at quorum, its caller not waiting for the calls still
/// out (the handle's background task drives them). The paused nodes'
/// compare-and-deletes must still run when they resume, whatever drives, or
/// stops driving, their calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_left_unawaited_still_runs_on_its_nodes() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    for round in 0..3 {
        let key = format!("unawaited:{round}");
        let lock = held_everywhere(&cluster, &rl, &key, Duration::from_secs(60)).await;
        release_with_two_late(&cluster, &rl, lock, &key).await;
    }
}

/// Two nodes restarted (their scripts gone, new connections), the others
/// as before: the restarted nodes' first release is late, and must be
/// awaited all the same, since it answers `NOSCRIPT` and only an awaited
/// call sends the `EVAL` after it (the answered nodes needed no fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_late_first_release_after_a_restart_still_falls_back_to_eval() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    cluster.node(3).restart();
    cluster.node(4).restart();
    let key = "first-release-late";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(60)).await;
    release_with_two_late(&cluster, &rl, lock, key).await;
}

/// After `SCRIPT FLUSH` on every node, a release's calls still out when it
/// is decided are awaited: the answered nodes needed the `EVAL` fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_late_release_after_a_script_flush_still_falls_back() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "flushed-release-late";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(60)).await;
    for node in cluster.nodes() {
        node.cmd(&["SCRIPT", "FLUSH"]);
    }
    release_with_two_late(&cluster, &rl, lock, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn unlock_counts_only_keys_actually_deleted() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "release-count";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    cluster.node(1).cmd(&["DEL", key]);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 2);
    // Decided at quorum: the last node may finish in the background.
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn release_is_a_script_never_a_bare_del() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "release-no-del";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    let token = lock.token().to_owned();
    let monitors: Vec<Monitor> = cluster.nodes().iter().map(|n| n.monitor()).collect();
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    // Decided at quorum: wait until every node's MONITOR shows its release
    // (reading the nodes instead would add this test's own commands there).
    let deadline = Instant::now() + timing::settled();
    while !monitors
        .iter()
        .all(|m| !release_calls(&m.client_commands(), key).is_empty())
    {
        assert!(Instant::now() < deadline, "a node never showed the release");
        tokio::time::sleep(ms(10)).await;
    }
    for (i, monitor) in monitors.into_iter().enumerate() {
        let cmds = stop_commands(monitor);
        assert!(
            !cmds.is_empty() && cmds.iter().all(|c| is_script_call(c)),
            "node {i}: client sent something other than EVAL/EVALSHA: {cmds:?}"
        );
        assert!(
            !cmds.iter().any(|c| c[0].eq_ignore_ascii_case("DEL")),
            "node {i}: bare DEL: {cmds:?}"
        );
        let releases = release_calls(&cmds, key);
        assert!(
            !releases.is_empty() && releases.iter().all(|t| *t == token),
            "node {i}: {releases:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn release_never_deletes_another_holders_key() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "release-foreign";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    let other = "0123456789abcdef0123456789abcdef";
    cluster.node(2).cmd(&["SET", key, other, "PX", "10000"]);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 2);
    // `unlock` may return with a node's answer still pending (the assert above
    // allows it): wait for the two deletions, then check the foreign value.
    assert!(
        cluster.wait_until(timing::settled(), |c| {
            c.node(0).get(key).is_none() && c.node(1).get(key).is_none()
        }),
        "the holder's own keys on nodes 0 and 1 were not deleted"
    );
    assert_eq!(cluster.node(2).get(key).as_deref(), Some(other));
}

// ---------------------------------------------------------------- 6. extend

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn extend_pushes_the_pttl_on_every_node() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "extend-grows";
    // Every node's PTTL after the extend is above what the first TTL can
    // leave, so only the extension explains it.
    let first = Duration::from_secs(5);
    let mut lock = held_everywhere(&cluster, &rl, key, first).await;
    for node in cluster.nodes() {
        assert!(node.pttl(key) <= 5000);
    }
    rl.extend(&mut lock, Duration::from_secs(30)).await.unwrap();
    // extend returns at quorum; the last node's PEXPIRE may land a moment later.
    assert!(
        cluster.wait_until(timing::settled(), |c| c
            .nodes()
            .iter()
            .all(|n| n.pttl(key) > 5000)),
        "pttls: {:?}",
        cluster
            .nodes()
            .iter()
            .map(|n| n.pttl(key))
            .collect::<Vec<_>>()
    );
    assert_eq!(lock.extensions(), 1);
    assert_eq!(lock.ttl(), Duration::from_secs(30));
    assert!(lock.remaining() > first);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

/// `extend` returns at quorum, but the other nodes must still be extended. Here
/// node 0 lost the library's connection, so its next call has to reconnect
/// first and is the last to answer: the extend is decided by nodes 1 and 2
/// before node 0's `PEXPIRE` is even written. That call used to be dropped with
/// the extend (and the redis connection skips a request nobody waits for), so
/// node 0's key kept its old TTL and would expire first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn an_extend_decided_at_quorum_still_reaches_the_slow_node() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "extend-everywhere";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(20)).await;

    // Cut node 0's connection; once its driver has seen the close, the next call
    // there fails at once and the library drops the connection.
    cluster.node(0).cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    tokio::time::sleep(ms(200)).await;
    rl.extend(&mut lock, Duration::from_secs(30)).await.unwrap();

    // Now node 0 must reconnect before it can run the extend.
    rl.extend(&mut lock, Duration::from_secs(60)).await.unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| c
            .nodes()
            .iter()
            .all(|n| n.pttl(key) > 50_000)),
        "pttls {:?}: a node missed the extend to 60 s",
        cluster
            .nodes()
            .iter()
            .map(|n| n.pttl(key))
            .collect::<Vec<_>>()
    );
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn extend_with_zero_ttl_is_refused_and_changes_nothing() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "extend-zero";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    let read = Instant::now();
    let before: Vec<i64> = cluster.nodes().iter().map(|n| n.pttl(key)).collect();
    let err = rl.extend(&mut lock, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
    let after: Vec<i64> = cluster.nodes().iter().map(|n| n.pttl(key)).collect();
    // Not pushed, and not cut either: down by no more than the time between
    // the two reads.
    let between = read.elapsed().as_millis() as i64 + 1;
    for (i, &pttl) in after.iter().enumerate() {
        assert!(
            pttl <= before[i] && pttl >= before[i] - between,
            "node {i}: pttl {pttl} vs {}",
            before[i]
        );
    }
    assert_eq!(cluster.count_holding(key, lock.token()), 3);
    assert_eq!(lock.extensions(), 0);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn extend_after_keys_lost_on_a_majority_is_not_held() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let key = "extend-not-held";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    cluster.node(0).cmd(&["DEL", key]);
    cluster.node(1).cmd(&["DEL", key]);
    let err = rl
        .extend(&mut lock, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    // A minority extension does not count.
    assert_eq!(lock.extensions(), 0);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn extend_after_validity_ran_out_is_expired() {
    let cluster = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let rl = ready(&cluster, timing::patient_node_timeout_for(ttl)).await;
    let key = "extend-expired";
    let mut lock = rl.mutex(key).try_acquire(ttl).await.unwrap();
    // Part of the scenario: the TTL passes, on the holder and on the nodes.
    tokio::time::sleep(ttl * 2).await;
    assert!(!lock.is_valid());
    let err = rl
        .extend(&mut lock, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");
    assert_eq!(cluster.count_with_key(key), 0, "expired keys came back");
}

// ---------------------------------------------------------------- 7. busy

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn busy_tells_when_to_retry() {
    let cluster = Cluster::start(3);
    // The subject is the busy answer, not a slow node: every call answered.
    let node_timeout = redlock_tests::timing::PATIENT_NODE_TIMEOUT;
    let a = ready(&cluster, node_timeout).await;
    let b = ready(&cluster, node_timeout).await;
    let key = "busy-info";
    // Held for the whole scenario (the node timeout fits in it many times).
    let ttl = node_timeout * 5;
    let asked = Instant::now();
    let held = held_everywhere(&cluster, &a, key, ttl).await;
    let err = b.mutex(key).try_acquire(ttl).await.unwrap_err();
    match &err {
        Error::Busy {
            retry_after: Some(d),
            report,
            ..
        } => {
            // The keys were set after `asked`, for the TTL.
            let left = ttl.saturating_sub(asked.elapsed() + ms(1));
            assert!(
                *d >= left && *d <= ttl,
                "retry_after {d:?}, at least {left:?}"
            );
            assert_eq!(report.ok_count(), 0);
        }
        other => panic!("expected Busy with retry_after, got {other:?}"),
    }
    assert!(err.retry_after().is_some());
    assert!(err.is_retryable());
    assert_eq!(cluster.count_holding(key, held.token()), 3);
    redlock_tests::util::assert_released(&a.unlock(held).await.unwrap(), 3);
}

/// Node 0's holder key expires in 2 s, node 1's in 8 s, node 2 is free: after
/// 2 s, nodes 0 and 2 make a quorum, so `retry_after` is about 2 s, whichever
/// answer came first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn busy_retry_after_is_the_earliest_expiry_that_frees_a_quorum() {
    let cluster = Cluster::start(3);
    // The subject is the busy answer, not a slow node: every call answered.
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    for round in 0..20 {
        let key = format!("busy-retry-after:{round}");
        let set = Instant::now();
        cluster.node(0).cmd(&["SET", &key, "other", "PX", "2000"]);
        cluster.node(1).cmd(&["SET", &key, "other", "PX", "8000"]);
        let err = match rl.mutex(&key).try_acquire(Duration::from_secs(10)).await {
            Err(err) => err,
            Ok(lock) => {
                // Only once node 0's holder key expired (a stalled machine).
                assert!(
                    set.elapsed() >= Duration::from_secs(2),
                    "round {round}: locked beside two holders"
                );
                redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 2);
                continue;
            }
        };
        assert!(matches!(err, Error::Busy { .. }), "{err:?}");
        let after = err.retry_after().expect("busy nodes report their pttl");
        assert!(
            after <= Duration::from_secs(2),
            "round {round}: retry_after {after:?}: {err}"
        );
    }
}
