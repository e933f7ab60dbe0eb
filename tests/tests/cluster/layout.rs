//! Every key the library writes for one resource lands in one slot on a real
//! cluster, whatever the resource's characters: a fenced lock (its counter is
//! set by a script beside the lock key) and a waiter's flag, for resources
//! with braces in them.

use std::time::Duration;

use redlock_core::{FencingMode, Redlock};
use redlock_tests::RedisClusters;
use redlock_tests::timing;
use redlock_tests::util::poll_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_locks_keep_their_counter_in_the_lock_keys_slot() {
    let clusters = RedisClusters::start(3, 3, 0);
    let rl = clusters
        .clusters()
        .iter()
        .fold(Redlock::builder(), |b, c| b.cluster(c.seeds()))
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap();
    let mut last = None;
    for resource in ["plain", "a{b}", "{b}", "}{", "50%", "{"] {
        for _ in 0..2 {
            let lock = rl
                .mutex(resource)
                .try_acquire(Duration::from_secs(3))
                .await
                .unwrap();
            let token = lock.fencing_token().expect("a fencing token");
            assert!(last.is_none_or(|l| token > l), "{resource}: {token:?}");
            last = Some(token);
            rl.unlock(lock).await.unwrap();
        }
        // The lock key and its counter are on the same master of each
        // cluster. A lock returns once its fence reached a quorum, so a
        // cluster's counter may land after it, or (its call timed out on a
        // loaded machine) not at all: a quorum of the clusters has it in the
        // lock key's slot, polled for within the node timeout's settle time.
        let key = rl.key_for(resource);
        let in_slot = |c: &redlock_tests::RedisCluster| {
            let slot = c.slot_of(key.as_bytes());
            let Some(owner) = c.owner(slot) else {
                return false;
            };
            let counters: Vec<Vec<u8>> = owner
                .raw_bytes(&[b"KEYS", b"\xfffence:*"])
                .unwrap_or_default();
            counters.iter().any(|k| c.slot_of(k) == slot)
        };
        let landed = poll_until(timing::settle(timing::PATIENT_NODE_TIMEOUT), || {
            clusters.clusters().iter().filter(|c| in_slot(c)).count() >= 2
        });
        let found: Vec<bool> = clusters.clusters().iter().map(in_slot).collect();
        assert!(
            landed,
            "{resource}: the counter is in the lock key's slot on too few clusters: {found:?}"
        );
    }
}
