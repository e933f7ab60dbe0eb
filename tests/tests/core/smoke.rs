//! A first end-to-end check: lock, busy, extend, unlock on three real nodes.

use std::time::Duration;

use redlock_core::{Error, Redlock};
use redlock_tests::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_busy_extend_unlock() {
    let cluster = Cluster::start(3);
    let a = Redlock::from_urls(cluster.urls()).unwrap();
    let b = Redlock::from_urls(cluster.urls()).unwrap();
    let ttl = Duration::from_secs(2);
    let mut lock = a.try_lock("smoke", ttl).await.unwrap();
    // Acquire returns at quorum; the third SET lands a moment later.
    assert!(cluster.wait_until(
        Duration::from_secs(2),
        |c| c.count_holding("smoke", lock.token()) == 3
    ));
    let err = b.try_lock("smoke", ttl).await.unwrap_err();
    match &err {
        Error::Busy { retry_after, .. } => {
            let ra = retry_after.expect("busy nodes report their pttl");
            assert!(ra <= ttl && ra > Duration::from_millis(500), "{ra:?}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    a.extend(&mut lock, Duration::from_secs(10)).await.unwrap();
    // extend returns at quorum; every node has the new TTL a moment later.
    assert!(cluster.wait_until(Duration::from_secs(2), |c| {
        c.nodes().iter().all(|n| n.pttl("smoke") > 5000)
    }));
    redlock_tests::util::assert_released(&a.unlock(lock).await.unwrap(), 3);
    // Decided at quorum: the last node may finish in the background.
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key("smoke") == 0));
    let lock = b.try_lock("smoke", ttl).await.unwrap();
    drop(lock);
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key("smoke") == 0));
}
