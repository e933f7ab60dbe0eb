//! Node faults on real `redis-server` processes: every fault shows up as the
//! exact per-node [`NodeError`] in the error's report (seen on a one-node
//! Redlock, where the fault decides the outcome), and a three-node Redlock still
//! acquires while only one node is faulty. Also whole-node failures on five nodes:
//! a minority down is tolerated, a majority down is `NoQuorum`, and a paused node
//! does not slow an acquire down.

use std::time::{Duration, Instant};

use redlock_core::{Error, NodeError, Redlock};
use redlock_tests::RedisNode;
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};

mod per_node;
mod reconnects;
mod secondary;
mod whole_node;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn build(urls: Vec<String>, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(urls)
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// Polls `f` every 10 ms until it holds or `timeout` passes.
fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(ms(10));
    }
}

/// A three-node Redlock over `urls` (one of them faulty) still takes the lock:
/// both healthy nodes hold the token. The lock is then released from them.
async fn quorum_survives(urls: Vec<String>, healthy: [&RedisNode; 2], key: &str) {
    // The healthy nodes answer every call; the faulty one's call is left
    // pending at quorum whatever the node timeout.
    let rl = build(urls, PATIENT_NODE_TIMEOUT);
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("one faulty node of three must not fail the lock: {e}"));
    let token = lock.token().to_owned();
    assert!(
        wait_for(timing::settled(), || healthy
            .iter()
            .all(|n| n.get(key).as_deref() == Some(token.as_str()))),
        "the healthy nodes do not hold the token"
    );
    // Decided at quorum: one faulty node of three does not fail the release,
    // and the healthy nodes' keys are all deleted (in the background for the
    // one not yet answered then).
    match rl.unlock(lock).await {
        Ok(r) => assert!(r.deleted + r.report().pending_count() >= 2, "{r:?}"),
        Err(e) => panic!("unexpected release error {e:?}"),
    }
    assert!(wait_for(timing::settled(), || healthy
        .iter()
        .all(|n| n.get(key).is_none())));
    for n in healthy {
        assert_eq!(n.get(key), None);
    }
}

/// What a one-node Redlock reports when its only node is faulty: the operation
/// error and the node's error.
async fn single_node_fault(url: String, key: &str, node_timeout: Duration) -> (Error, NodeError) {
    let rl = build(vec![url], node_timeout);
    let err = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .expect_err("a faulty single node cannot grant the lock");
    let report = err
        .report()
        .unwrap_or_else(|| panic!("no report in {err:?}"));
    let errors: Vec<NodeError> = report.errors().map(|(_, e)| e.clone()).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(report.ok_count(), 0);
    (err.clone(), errors[0].clone())
}
