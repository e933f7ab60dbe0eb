//! Bad input to `redlock-core`, each refused with its exact error variant before
//! anything is written to the (real) nodes, and the node counts that are allowed:
//! the same server listed twice is refused by address or by `run_id`, an even
//! number of nodes works with a quorum of `N/2 + 1`.

use std::time::Duration;

use redlock_core::{Error, Redlock};
use redlock_tests::Cluster;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

fn no_keys_anywhere(cluster: &Cluster) -> bool {
    cluster.nodes().iter().all(|n| n.keys().is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_resource_is_refused() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(100));
    let err = rl
        .mutex("")
        .try_acquire(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::EmptyResource), "{err:?}");
    let err = rl
        .mutex("")
        .acquire(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::EmptyResource), "{err:?}");
    assert!(no_keys_anywhere(&cluster));
}

/// A key that ends like a waiters flag (`<key>:redlock-waiters`) would be
/// deleted by the release of the lock whose flag it is: refused, with or
/// without the prefix's help, in single and multi-resource locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_named_like_a_waiters_flag_is_refused() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(100));
    let ttl = Duration::from_secs(1);
    let err = rl
        .mutex("a:redlock-waiters")
        .try_acquire(ttl)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReservedResource { .. }), "{err:?}");
    // A set is refused when it is made.
    let err = rl.mutex_many(["b", "a:redlock-waiters"]).unwrap_err();
    assert!(matches!(err, Error::ReservedResource { .. }), "{err:?}");
    let prefixed = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(100))
        .key_prefix("x:redlock-wait")
        .build()
        .unwrap();
    let err = prefixed.mutex("ers").try_acquire(ttl).await.unwrap_err();
    assert!(matches!(err, Error::ReservedResource { .. }), "{err:?}");
    // Close, but not the suffix: taken.
    let lock = rl.mutex("a:redlock-waiter").try_acquire(ttl).await.unwrap();
    rl.unlock(lock).await.unwrap();
    let lock = prefixed.mutex("er").try_acquire(ttl).await.unwrap();
    prefixed.unlock(lock).await.unwrap();
    assert!(cluster.wait_until(Duration::from_secs(5), no_keys_anywhere));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_zero_below_min_or_above_max_is_invalid() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(50))
        .min_ttl(ms(100))
        .max_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    for ttl in [Duration::ZERO, ms(99), Duration::from_secs(61)] {
        let err = rl.mutex("ttl-bounds").try_acquire(ttl).await.unwrap_err();
        match err {
            Error::InvalidTtl {
                ttl: got, min, max, ..
            } => {
                assert_eq!(got, ttl);
                assert_eq!(min, ms(100));
                assert_eq!(max, Duration::from_secs(60));
            }
            other => panic!("ttl {ttl:?}: expected InvalidTtl, got {other:?}"),
        }
    }
    assert!(no_keys_anywhere(&cluster));
    // The bounds themselves are accepted: never refused as a TTL. The node
    // timeout must fit in the 100 ms bound, so a loaded machine may time a
    // node out: that honest answer (a node-level failure, with its report)
    // is accepted, as is a release it leaves incomplete.
    for ttl in [ms(100), Duration::from_secs(60)] {
        match rl.mutex("ttl-bounds").try_acquire(ttl).await {
            Ok(lock) => match rl.unlock(lock).await {
                Ok(_) | Err(Error::ReleaseIncomplete { .. }) => {}
                Err(e) => panic!("ttl {ttl:?}: release: {e:?}"),
            },
            Err(e) if e.report().is_some() => eprintln!("ttl {ttl:?}: {e}"),
            Err(e) => panic!("ttl {ttl:?}: refused: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_timeout_not_below_the_ttl_is_refused() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(500));
    for ttl in [ms(500), ms(300)] {
        let err = rl
            .mutex("timeout-vs-ttl")
            .try_acquire(ttl)
            .await
            .unwrap_err();
        match err {
            Error::NodeTimeoutTooLong {
                node_timeout,
                ttl: got,
                ..
            } => {
                assert_eq!(node_timeout, ms(500));
                assert_eq!(got, ttl);
            }
            other => panic!("ttl {ttl:?}: expected NodeTimeoutTooLong, got {other:?}"),
        }
    }
    assert!(no_keys_anywhere(&cluster));
    // A node timeout no shorter than the largest TTL is refused when building.
    let err = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .max_ttl(Duration::from_secs(2))
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::NodeTimeoutTooLong { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_nodes_are_refused() {
    let err = Redlock::builder().build().unwrap_err();
    assert!(matches!(err, Error::NoNodes), "{err:?}");
    let err = Redlock::from_urls(Vec::<String>::new()).unwrap_err();
    assert!(matches!(err, Error::NoNodes), "{err:?}");
    let err = Redlock::new(Vec::new()).unwrap_err();
    assert!(matches!(err, Error::NoNodes), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_url_twice_is_a_duplicate_by_address() {
    let cluster = Cluster::start(2);
    let url = cluster.node(0).url();
    let localhost = format!("redis://localhost:{}", cluster.node(0).port());
    for second in [url.clone(), localhost] {
        let err = Redlock::builder()
            .url(url.clone())
            .url(cluster.node(1).url())
            .url(second.clone())
            .build()
            .unwrap_err();
        match err {
            Error::DuplicateNode { by, .. } => assert_eq!(by, "address", "{second}"),
            other => panic!("{second}: expected DuplicateNode, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_server_via_two_pools_is_a_duplicate_by_run_id() {
    let cluster = Cluster::start(2);
    let pool = |url: String| {
        deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap()
    };
    let url = cluster.node(0).url();
    let rl = Redlock::builder()
        .labeled_pool("a", pool(url.clone()))
        .labeled_pool("b", pool(url))
        .node_timeout(ms(200))
        .build()
        .expect("labels differ, so the builder cannot tell");
    match rl.check_nodes().await.unwrap_err() {
        Error::DuplicateNode { first, second, by } => {
            assert_eq!(by, "run_id");
            assert_eq!((&*first, &*second), ("a", "b"));
        }
        other => panic!("expected DuplicateNode by run_id, got {other:?}"),
    }
    // Two different servers pass the same check.
    let rl = Redlock::builder()
        .labeled_pool("a", pool(cluster.node(0).url()))
        .labeled_pool("b", pool(cluster.node(1).url()))
        .node_timeout(ms(200))
        .build()
        .unwrap();
    let infos = rl.check_nodes().await.unwrap();
    assert_eq!(infos.len(), 2);
    assert!(
        infos
            .iter()
            .all(|i| i.run_id.is_some() && i.error.is_none())
    );
    assert_ne!(infos[0].run_id, infos[1].run_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_urls_are_refused_without_their_password() {
    for url in [
        "redis://:s3cret@127.0.0.1:99999",
        "redis://user:s3cret@127.0.0.1:abc/0",
        "redis://s3cret@127.0.0.1:99999",
        "redis://:s3cret@127.0.0.1/notadb",
        "http://:s3cret@127.0.0.1:6379",
    ] {
        let err = Redlock::builder()
            .url("redis://127.0.0.1:1")
            .url(url)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");
    }
    // Whether or not `%%%` is refused as a host (see the ignored test below), the
    // password never shows: not in the build error, nor in a connect error.
    match Redlock::builder()
        .url("redis://:s3cret@%%%")
        .node_timeout(ms(300))
        .build()
    {
        Err(err) => assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}"),
        Ok(rl) => {
            assert!(!format!("{rl:?}").contains("s3cret"), "{rl:?}");
            let err = rl
                .mutex("x")
                .try_acquire(Duration::from_secs(1))
                .await
                .unwrap_err();
            assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_with_an_invalid_host_is_refused_without_its_password() {
    let err = Redlock::builder()
        .url("redis://:s3cret@%%%")
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn even_node_count_builds_and_locks_with_a_majority() {
    let cluster = Cluster::start(4);
    let rl = redlock(&cluster, ms(200));
    assert_eq!(rl.node_count(), 4);
    assert_eq!(rl.quorum(), 3);
    let key = "even";
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap();
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(Duration::from_secs(2), |c| c.count_holding(key, &token)
            >= 3)
    );
    // Decided at quorum (3 answers): a node whose SET was still on its way may
    // answer "not held" first, while a holding node is still pending.
    let released = rl.unlock(lock).await.unwrap();
    assert!(
        released.deleted + released.report().pending_count() >= 3,
        "{released:?}"
    );
    assert!(cluster.wait_until(Duration::from_secs(3), |c| c.count_with_key(key) == 0));
    // Two free nodes of four are not a majority.
    let busy_key = "even-busy";
    for i in 0..2 {
        cluster
            .node(i)
            .cmd(&["SET", busy_key, "other", "PX", "10000"]);
    }
    let err = rl
        .mutex(busy_key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap_err();
    // Busy or NoQuorum, depending on which answers came first (see the ignored
    // test below).
    assert!(
        matches!(err, Error::Busy { .. } | Error::NoQuorum { .. }),
        "{err:?}"
    );
    assert!(
        cluster.wait_until(Duration::from_secs(3), |c| c
            .node(2)
            .get(busy_key)
            .is_none()
            && c.node(3).get(busy_key).is_none()),
        "the refused attempt left keys"
    );
}

/// Two holders' keys on four nodes make a quorum (3) impossible: that is "busy",
/// whatever order the answers come in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn even_node_count_half_busy_is_always_busy() {
    let cluster = Cluster::start(4);
    let rl = redlock(&cluster, ms(200));
    rl.check_nodes().await.unwrap();
    for round in 0..20 {
        let key = format!("even-half-busy:{round}");
        for i in 0..2 {
            cluster.node(i).cmd(&["SET", &key, "other", "PX", "10000"]);
        }
        let err = rl
            .mutex(&key)
            .try_acquire(Duration::from_secs(10))
            .await
            .unwrap_err();
        match &err {
            Error::Busy { retry_after, .. } => {
                assert!(retry_after.is_some(), "round {round}: {err:?}")
            }
            other => panic!("round {round}: expected Busy, got {other:?}"),
        }
    }
}
