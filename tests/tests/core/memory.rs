//! Nodes out of memory, on real `redis-server` processes (issue 18 item 5):
//! `check_nodes` reports eviction policies that can evict lock keys or
//! fencing counters, an `OOM` answer is a node error of its own (never
//! "busy", never "free"), and a fail-open request policy still refuses to run
//! a request unlocked when nodes are full.

use std::time::Duration;

use redlock_core::request::{self, LockPolicy, Rejection, StatusCode};
use redlock_core::{Error, EvictionCheck, FencingMode, NodeError, Redlock};
use redlock_tests::Cluster;

fn redlock(cluster: &Cluster, fencing: Option<FencingMode>) -> Redlock {
    let mut b = Redlock::builder()
        .urls(cluster.urls())
        // Every node's answer is in: the subject is what the full nodes
        // answer, not a slow node.
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT);
    if let Some(mode) = fencing {
        b = b.fencing(mode);
    }
    b.build().unwrap()
}

/// Node `i` refuses every write: `noeviction` and a 1-byte `maxmemory`.
fn fill(cluster: &Cluster, i: usize) {
    let node = cluster.node(i);
    node.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    node.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let refused = node.raw::<String>(&["SET", "probe", "x"]);
    assert!(
        refused.as_ref().is_err_and(|e| e.code() == Some("OOM")),
        "{refused:?}"
    );
}

/// A quorum of nodes full: every attempt fails with `OutOfMemory` naming
/// those nodes (not busy), with and without fencing, and a fail-open request
/// policy answers 503 instead of running the request unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quorum_fails_closed_even_when_failing_open() {
    let cluster = Cluster::start(3);
    fill(&cluster, 0);
    fill(&cluster, 1);
    for fencing in [None, Some(FencingMode::Hybrid)] {
        let rl = redlock(&cluster, fencing);
        let err = rl
            .mutex("oom")
            .try_acquire(Duration::from_secs(10))
            .await
            .unwrap_err();
        let Error::NoQuorum { ref report, .. } = err else {
            panic!("{fencing:?}: {err:?}");
        };
        assert_eq!(report.busy_count(), 0, "{err}");
        assert_eq!(report.out_of_memory_count(), 2, "{err}");
        let full: Vec<usize> = report
            .errors()
            .filter(|(_, e)| **e == NodeError::OutOfMemory)
            .map(|(n, _)| n.index)
            .collect();
        assert_eq!(full, [0, 1], "{err}");
        let text = err.to_string();
        for n in &report.nodes[..2] {
            assert!(text.contains(&format!("{}: OOM", n.node)), "{text}");
        }
        // The free node's key was released with the failed attempt.
        assert!(cluster.wait_until(
            redlock_tests::timing::settled(),
            |c| c.count_with_key("oom") == 0
        ));

        let policy = LockPolicy::default().fail_open();
        let outcome = request::acquire(Some(&rl), Some("oom".into()), &policy).await;
        match outcome {
            Err(r @ Rejection::Unavailable { .. }) => {
                assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            }
            other => panic!(
                "{fencing:?}: fail-open with full nodes: {:?}",
                other.map(|l| l.is_some())
            ),
        }
    }
    // Nodes that do not answer at all still fail open, as documented.
    cluster.node(0).pause();
    cluster.node(1).pause();
    let rl = redlock(&cluster, None);
    let policy = LockPolicy::default().fail_open();
    let outcome = request::acquire(Some(&rl), Some("oom-down".into()), &policy).await;
    cluster.node(0).resume();
    cluster.node(1).resume();
    assert!(
        matches!(outcome, Ok(None)),
        "{:?}",
        outcome.map(|l| l.is_some())
    );
}

/// `check_nodes` reads each node's eviction policy: `noeviction` is sound
/// (with the OOM note where `maxmemory` is set), a `volatile-*` policy can
/// evict lock keys, an `allkeys-*` one also the durable fencing counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_nodes_reports_policies_that_evict_lock_keys() {
    let cluster = Cluster::start(3);
    cluster
        .node(0)
        .cmd(&["CONFIG", "SET", "maxmemory", "100mb"]);
    cluster
        .node(1)
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    cluster
        .node(2)
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    cluster
        .node(2)
        .cmd(&["CONFIG", "SET", "maxmemory", "100mb"]);
    let infos = redlock(&cluster, Some(FencingMode::Durable))
        .check_nodes()
        .await
        .unwrap();
    assert_eq!(
        infos[0].maxmemory,
        Some(100 * 1024 * 1024),
        "{:?}",
        infos[0]
    );
    assert_eq!(infos[0].maxmemory_policy.as_deref(), Some("noeviction"));
    match &infos[0].eviction {
        Some(EvictionCheck::Sound { note }) => assert!(note.contains("OOM"), "{note}"),
        other => panic!("{other:?}"),
    }
    match &infos[1].eviction {
        Some(EvictionCheck::Unsound { reason }) => {
            assert!(reason.contains("volatile-lru"), "{reason}");
            assert!(reason.contains("lock keys"), "{reason}");
            // Durable counters carry no TTL: a volatile policy leaves them.
            assert!(!reason.contains("fencing counters"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match &infos[2].eviction {
        Some(EvictionCheck::Unsound { reason }) => {
            assert!(reason.contains("allkeys-lru"), "{reason}");
            assert!(reason.contains("fencing counters"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!infos[1].eviction.as_ref().unwrap().is_sound());
}

/// A user refused `CONFIG` (as managed services often are) still gets the
/// policy, from `INFO memory`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_nodes_reads_the_policy_without_config() {
    let cluster = Cluster::start(3);
    let mut urls = Vec::new();
    for node in cluster.nodes() {
        node.cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"]);
        node.cmd(&[
            "ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*", "+@all", "-config",
        ]);
        urls.push(format!("redis://locker:secret@127.0.0.1:{}", node.port()));
    }
    let rl = Redlock::builder().urls(urls).build().unwrap();
    for info in rl.check_nodes().await.unwrap() {
        assert!(info.error.is_none(), "{info:?}");
        assert_eq!(info.appendfsync, None, "CONFIG is refused: {info:?}");
        assert_eq!(
            info.maxmemory_policy.as_deref(),
            Some("allkeys-lfu"),
            "{info:?}"
        );
        assert_eq!(info.maxmemory, Some(0), "{info:?}");
        match &info.eviction {
            Some(EvictionCheck::Unsound { reason }) => {
                assert!(reason.contains("maxmemory is 0"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
