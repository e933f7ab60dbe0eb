//! A first end-to-end check: lock, busy, extend, unlock on three real nodes.

use std::time::{Duration, Instant};

use redlock_core::Error;
use redlock_tests::{Cluster, timing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_busy_extend_unlock() {
    let cluster = Cluster::start(3);
    let (a, b) = (cluster.patient_redlock(), cluster.patient_redlock());
    // A TTL the node timeout fits in.
    let ttl = timing::PATIENT_NODE_TIMEOUT * 2;
    let asked = Instant::now();
    let mut lock = a.mutex("smoke").try_acquire(ttl).await.unwrap();
    // Acquire returns at quorum; the third SET lands a moment later.
    assert!(cluster.wait_until(
        timing::settled(),
        |c| c.count_holding("smoke", lock.token()) == 3
    ));
    let err = b.mutex("smoke").try_acquire(ttl).await.unwrap_err();
    match &err {
        Error::Busy { retry_after, .. } => {
            let ra = retry_after.expect("busy nodes report their pttl");
            // The keys were set after `asked`, for the TTL.
            let left = ttl.saturating_sub(asked.elapsed() + Duration::from_millis(1));
            assert!(ra <= ttl && ra >= left, "{ra:?}, at least {left:?}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    a.extend(&mut lock, Duration::from_secs(10)).await.unwrap();
    // extend returns at quorum; every node has the new TTL (longer than the
    // old one) a moment later.
    let old = i64::try_from(ttl.as_millis()).unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| n.pttl("smoke") > old)
    }));
    redlock_tests::util::assert_released(&a.unlock(lock).await.unwrap(), 3);
    // Decided at quorum: the last node may finish in the background.
    assert_eq!(cluster.settled_count("smoke", 0).await, 0);
    let lock = b.mutex("smoke").try_acquire(ttl).await.unwrap();
    drop(lock);
    assert_eq!(cluster.settled_count("smoke", 0).await, 0);
}
