//! Multi-resource locks and batched renewal on cluster nodes: one script per
//! slot, and a cluster counts for a lock only when every key of the lock was
//! set (or extended) on it.

use std::time::Duration;

use redlock_core::{Error, FencingMode, LockOptions, Redlock};
use redlock_tests::RedisClusters;

use crate::handle;

/// How long the last node of a call that returned at quorum may take.
fn wait() -> Duration {
    redlock_tests::timing::settled()
}

/// Resources whose keys fall in many slots (and so on every master).
fn spread(prefix: &str) -> Vec<String> {
    (0..12).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_over_many_slots_is_taken_extended_and_released_whole() {
    let clusters = RedisClusters::start(3, 3, 0);
    let a = handle(&clusters);
    let b = handle(&clusters);
    let set = spread("set:");
    let mut lock = a
        .mutex_many(&set)
        .unwrap()
        .try_acquire(Duration::from_secs(3))
        .await
        .unwrap();
    for r in &set {
        let key = a.key_for(r);
        assert!(clusters.wait_until(wait(), |c| c.count_holding(&key, lock.token()) == 3));
    }
    // One resource of the set is enough to be refused.
    let err = b
        .mutex_many(["other", set[7].as_str()])
        .unwrap()
        .try_acquire(Duration::from_secs(3))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    assert!(clusters.wait_until(wait(), |c| c.count_with_key(&b.key_for("other")) == 0));
    a.extend(&mut lock, Duration::from_secs(20)).await.unwrap();
    for r in &set {
        let key = a.key_for(r);
        assert!(clusters.wait_until(wait(), |c| {
            c.clusters().iter().all(|c| c.pttl(key.as_bytes()) > 10_000)
        }));
    }
    a.unlock(lock).await.unwrap();
    for r in &set {
        assert!(clusters.wait_until(wait(), |c| c.count_with_key(&a.key_for(r)) == 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_missing_one_key_of_the_set_does_not_count() {
    let clusters = RedisClusters::start(3, 3, 0);
    let rl = handle(&clusters);
    let set = spread("part:");
    // Another holder has one resource of the set on two clusters of three.
    let taken = rl.key_for(&set[5]);
    for c in &clusters.clusters()[..2] {
        let owner = c.owner(c.slot_of(taken.as_bytes())).unwrap();
        let _: () = owner
            .raw(&["SET", &taken, "someone", "PX", "10000"])
            .unwrap();
    }
    // A TTL far longer than the wait below: keys left behind would stay.
    let err = rl
        .mutex_many(&set)
        .unwrap()
        .try_acquire(Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // The keys other slots' scripts set on the two busy clusters are taken
    // back with the failed attempt: nothing of it stays anywhere.
    for r in set.iter().filter(|r| **r != set[5]) {
        let key = rl.key_for(r);
        assert!(
            clusters.wait_until(wait(), |c| c.count_with_key(&key) == 0),
            "{key} stayed on {} clusters",
            clusters.count_with_key(&key)
        );
    }
    assert_eq!(clusters.count_holding(&taken, "someone"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_sets_and_batched_guards_on_clusters() {
    let clusters = RedisClusters::start(3, 3, 0);
    let rl = clusters
        .clusters()
        .iter()
        .fold(Redlock::builder(), |b, c| b.cluster(c.seeds()))
        .node_timeout(Duration::from_millis(500))
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap();
    let set = spread("fset:");
    let first = rl
        .mutex_many(&set)
        .unwrap()
        .try_acquire(Duration::from_secs(3))
        .await
        .unwrap();
    let tokens: Vec<_> = first.fencing_tokens().iter().map(|(_, t)| *t).collect();
    assert_eq!(tokens.len(), set.len());
    rl.unlock(first).await.unwrap();
    let second = rl
        .mutex_many(&set)
        .unwrap()
        .try_acquire(Duration::from_secs(3))
        .await
        .unwrap();
    for (before, (_, after)) in tokens.iter().zip(second.fencing_tokens()) {
        assert!(after > *before, "{after:?} after {before:?}");
    }
    rl.unlock(second).await.unwrap();
    // Guards renewed together (one batch per node, cut by slot on clusters)
    // and a guarded set keep every key past several TTLs.
    let options = LockOptions::new(Duration::from_millis(1200));
    let names = spread("g:");
    let mut guards = Vec::new();
    for name in &names {
        guards.push(rl.mutex(name).guard(&options).await.unwrap());
    }
    let set = rl
        .mutex_many(["gs:a", "gs:b", "gs:c"])
        .unwrap()
        .guard(&options)
        .await
        .unwrap();
    // What each guard says holds on the nodes: not lost means a quorum (2
    // of 3) holds its token (every cluster is not promised: a renewal that
    // missed one node's timeout leaves that key to expire, at quorum).
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(!set.is_lost());
    for (name, g) in names.iter().zip(&guards) {
        assert!(!g.is_lost(), "{name}");
        let token = g.handle().token().to_owned();
        let holding = clusters.count_holding(&rl.key_for(name), &token);
        assert!(holding >= 2, "{name}: {holding}");
    }
    let token = set.handle().token().to_owned();
    for r in ["gs:a", "gs:b", "gs:c"] {
        let holding = clusters.count_holding(&rl.key_for(r), &token);
        assert!(holding >= 2, "{r}: {holding}");
    }
}
