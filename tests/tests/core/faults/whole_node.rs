//! Whole nodes down or paused: a quorum of the rest still locks, a minority does not.

use std::time::{Duration, Instant};

use redlock_core::{Error, NodeError, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::timing;

use super::*;

// ------------------------------------------------------- whole-node failures

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn two_of_five_nodes_down_still_locks() {
    let cluster = Cluster::start(5);
    // The live nodes answer every call; the dead ones refuse at once.
    let rl = build(cluster.urls(), timing::PATIENT_NODE_TIMEOUT);
    cluster.node(3).kill();
    cluster.node(4).kill();
    let key = "down-2-of-5";
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_holding(key, lock.token())
            == 3)
    );
    // The release is confirmed on the three live nodes: `Ok`, with the two
    // dead ones in the report, not an error.
    match rl.unlock(lock).await {
        Ok(r) => {
            redlock_tests::util::assert_released(&r, 3);
            assert!(r.report().failed_count() <= 2, "{r:?}");
        }
        other => panic!("expected Ok with 2 dead nodes, got {other:?}"),
    }
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn three_of_five_nodes_down_is_no_quorum() {
    let cluster = Cluster::start(5);
    // The live nodes answer (every error is the dead nodes' refusal); the
    // dead ones refuse at once.
    let node_timeout = timing::PATIENT_NODE_TIMEOUT;
    let rl = build(cluster.urls(), node_timeout);
    for i in 2..5 {
        cluster.node(i).kill();
    }
    let key = "down-3-of-5";
    let policy = RetryPolicy::attempts(3)
        .with_delay(ms(50))
        .with_jitter(Duration::ZERO);
    let t0 = Instant::now();
    let err = rl
        .mutex(key)
        .acquire_with(Duration::from_secs(10), &policy)
        .await
        .unwrap_err();
    let took = t0.elapsed();
    match &err {
        Error::NoQuorum {
            ok, quorum, report, ..
        } => {
            assert!(*ok <= 2, "{ok}");
            assert_eq!(*quorum, 3);
            assert!(report.failed_count() >= 1, "{report}");
            for (_, e) in report.errors() {
                assert!(matches!(e, NodeError::Connect(_)), "{e:?}");
            }
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // Each attempt: at most one node timeout to acquire and one to release.
    let budget = 3 * 2 * node_timeout + 2 * ms(50);
    assert!(
        took < timing::liveness(budget),
        "took {took:?}, budget {budget:?}"
    );
    // Answers still in flight when the failure was decided are released as they
    // arrive, in the background.
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0),
        "a failed attempt left keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn one_paused_node_does_not_slow_the_acquire() {
    let cluster = Cluster::start(5);
    // Patient: the four running nodes answer whatever the load, and waiting
    // for the paused one would take all of this (beyond what a quorum of
    // answering nodes needs on a loaded machine).
    let node_timeout = timing::liveness(timing::PATIENT_NODE_TIMEOUT);
    let rl = build(cluster.urls(), node_timeout);
    let lock = rl
        .mutex("warm-up")
        .try_acquire(Duration::from_secs(60))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    cluster.node(4).pause();
    let key = "paused-1-of-5";
    let ttl = Duration::from_secs(60);
    let t0 = Instant::now();
    let result = rl.mutex(key).try_acquire(ttl).await;
    let took = t0.elapsed();
    let lock = result.unwrap();
    // Waiting for the paused node would take its node timeout.
    assert!(
        took < node_timeout,
        "acquire waited for the paused node: {took:?}"
    );
    // The validity is the TTL less the time since the acquire began (and
    // the drift allowance).
    let remaining = lock.remaining();
    let since = t0.elapsed();
    let drift = ttl.mul_f64(0.01) + ms(2);
    assert!(
        remaining + since + drift + ms(1) >= ttl && remaining <= ttl,
        "remaining {remaining:?} {since:?} after the acquire began"
    );
    cluster.node(4).resume();
    let token = lock.token().to_owned();
    assert!(cluster.wait_until(timing::settled(), |c| c.count_holding(key, &token) >= 3));
    drop(lock);
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0));
}
