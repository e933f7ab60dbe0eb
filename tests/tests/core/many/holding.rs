//! Holding a set: renewal of every key, one fencing token per resource, deduplication and the limit, batched renewal.

use std::time::Duration;

use redlock_core::{Error, FencingMode, LockOptions, MAX_RESOURCES, Redlock};
use redlock_tests::Cluster;

use redlock_tests::timing;

use super::*;

/// A guard on a set renews every key: held for three TTLs, not lost, and
/// both keys still hold the token; the release deletes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_guard_renews_every_key() {
    let cluster = Cluster::start(3);
    // Every renewal answered: the subject is that each key is renewed.
    let ttl = ms(2_000);
    let rl = redlock(&cluster, timing::patient_node_timeout_for(ttl));
    rl.check_nodes().await.unwrap();
    let guard = rl
        .mutex_many(["ga", "gb"])
        .unwrap()
        .guard(&LockOptions::new(ttl))
        .await
        .unwrap();
    // Part of the scenario: three TTLs pass.
    tokio::time::sleep(3 * ttl).await;
    assert!(!guard.is_lost());
    let token_a = cluster.node(0).get("ga").unwrap();
    assert_eq!(cluster.node(0).get("gb"), Some(token_a.clone()));
    assert!(
        cluster.count_holding("ga", &token_a) >= 2 && cluster.count_holding("gb", &token_a) >= 2
    );
    guard.release().await.unwrap();
    eventually_only_foreign(&cluster, &[], &["ga", "gb"]).unwrap();
    let n = rl
        .mutex_many(["ga", "gb"])
        .unwrap()
        .run(&LockOptions::new(ttl), |h| async move {
            assert!(!h.is_lost());
            7
        })
        .await
        .unwrap();
    assert_eq!(n, 7);
}

/// With fencing on, a lock on a set carries one token per resource, each
/// larger than every earlier holder's token for that resource, whether that
/// holder locked the resource alone or in a set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn fencing_gives_one_monotone_token_per_resource() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::patient_node_timeout_for(ms(2000)))
        .fencing(FencingMode::Durable)
        .build()
        .unwrap();
    rl.check_nodes().await.unwrap();
    let first = rl
        .mutex_many(["fb", "fa"])
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let t1: Vec<(String, u64)> = first
        .fencing_tokens()
        .iter()
        .map(|(r, t)| (r.to_string(), t.get()))
        .collect();
    assert_eq!(
        t1.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["fa", "fb"]
    );
    rl.unlock(first).await.unwrap();
    // A alone three times: A's counter moves on, B's does not.
    let mut last_a = t1[0].1;
    for _ in 0..3 {
        let lock = rl
            .mutex("fa")
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap();
        let t = lock.fencing_token().unwrap().get();
        assert!(t > last_a, "fa: {t} after {last_a}");
        last_a = t;
        rl.unlock(lock).await.unwrap();
    }
    let second = rl
        .mutex_many(["fa", "fb"])
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let t2: Vec<u64> = second
        .fencing_tokens()
        .iter()
        .map(|(_, t)| t.get())
        .collect();
    assert!(t2[0] > last_a, "fa: {} after {last_a}", t2[0]);
    assert!(t2[1] > t1[1].1, "fb: {} after {}", t2[1], t1[1].1);
    rl.unlock(second).await.unwrap();
    // A guard's handle tells the code under the lock each resource's token.
    let guard = rl
        .mutex_many(["fb", "fa"])
        .unwrap()
        .guard(&LockOptions::new(ms(2000)))
        .await
        .unwrap();
    let h = guard.handle();
    let t3 = h.fencing_tokens();
    assert_eq!(t3.iter().map(|(r, _)| *r).collect::<Vec<_>>(), ["fa", "fb"]);
    assert!(
        t3[0].1.get() > t2[0] && t3[1].1.get() > t2[1],
        "{t3:?} after {t2:?}"
    );
    assert_eq!(h.fencing_token(), Some(t3[0].1));
    guard.release().await.unwrap();
}

/// The set is deduplicated and ordered by key; one distinct resource is an
/// ordinary lock; an empty set, an empty name and more than `MAX_RESOURCES`
/// are refused when the value is made, before any node is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn dedup_order_and_the_limit() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .key_prefix("p:")
        .build()
        .unwrap();
    rl.check_nodes().await.unwrap();
    let lock = rl
        .mutex_many(["d2", "d1", "d2", "d3", "d1"])
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lock.resources(), ["d1", "d2", "d3"]);
    assert_eq!(lock.keys(), ["p:d1", "p:d2", "p:d3"]);
    assert_eq!(lock.resource(), "{d1, d2, d3}");
    assert!(cluster.wait_until(timing::settled(), |c| {
        ["p:d1", "p:d2", "p:d3"]
            .iter()
            .all(|k| c.count_holding(k, lock.token()) == 3)
    }));
    rl.unlock(lock).await.unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| {
        ["p:d1", "p:d2", "p:d3"]
            .iter()
            .all(|k| c.count_with_key(k) == 0)
    }));

    let one = rl
        .mutex_many(["solo", "solo"])
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(one.resources(), ["solo"]);
    assert_eq!(one.resource(), "solo");
    rl.unlock(one).await.unwrap();

    let at_limit: Vec<String> = (0..MAX_RESOURCES).map(|i| format!("lim:{i}")).collect();
    let lock = rl
        .mutex_many(&at_limit)
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lock.resources().len(), MAX_RESOURCES);
    rl.unlock(lock).await.unwrap();
    let past: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("lim:{i}")).collect();
    let err = rl.mutex_many(&past).unwrap_err();
    assert!(
        matches!(err, Error::TooManyResources { max } if max == MAX_RESOURCES),
        "{err:?}"
    );
    let none: [&str; 0] = [];
    assert!(matches!(rl.mutex_many(none), Err(Error::NoResources)));
    assert!(matches!(
        rl.mutex_many(["x", ""]),
        Err(Error::EmptyResource)
    ));
    // Nothing was sent for the refused sets.
    assert_eq!(cluster.count_with_key("p:lim:64"), 0);
    assert_eq!(cluster.count_with_key("p:x"), 0);
}

/// Guards renewed together by the handle's schedule (one batch script per
/// node over many locks) keep every key of a lock on several resources: the
/// batch script extends one key per lock, so such a lock is renewed by its
/// own script. (Merged as first written, the batch renewed only the set's
/// first key: its other keys expired while the guard said "held".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn guards_renewed_in_one_batch_keep_every_key_of_a_set() {
    let cluster = Cluster::start(3);
    // The subject is the batch, not a slow node: every renewal answered, with
    // a TTL the node timeout fits in.
    let rl = cluster.patient_redlock();
    let ttl = redlock_tests::timing::PATIENT_NODE_TIMEOUT * 2;
    let options = LockOptions::new(ttl);
    let names: Vec<String> = (0..4).map(|i| format!("bs{i}")).collect();
    let set = rl.mutex_many(["bx", "by"]).unwrap();
    let (singles, set) = tokio::join!(
        futures_util::future::join_all(names.iter().map(|name| {
            let (single, options) = (rl.mutex(name), &options);
            async move { single.guard(options).await }
        })),
        set.guard(&options),
    );
    let singles: Vec<_> = singles.into_iter().map(Result::unwrap).collect();
    let set = set.unwrap();
    let taken = std::time::Instant::now();
    // Past the TTL from the acquire (a key never renewed is gone by then),
    // after two renewals of the set.
    let renewed = redlock_tests::util::eventually(redlock_tests::timing::liveness(ttl * 2), || {
        set.handle().extensions() >= 2 && taken.elapsed() > ttl
    })
    .await;
    assert!(renewed, "the set was not renewed twice");
    assert!(!set.is_lost(), "the set's guard lost its lock");
    let token = cluster.node(0).get("bx").unwrap();
    for key in ["bx", "by"] {
        assert!(
            cluster.count_holding(key, &token) >= 2,
            "{key} is gone from a quorum while the guard says held (remaining {:?})",
            set.remaining()
        );
    }
    for guard in singles {
        assert!(!guard.is_lost());
        guard.release().await.unwrap();
    }
    set.release().await.unwrap();
}
