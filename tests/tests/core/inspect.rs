//! `Redlock::inspect` and `Redlock::release_token` on real `redis-server`
//! processes: the verdicts, the fingerprint in place of the token, and that an
//! inspection changes nothing.

use std::time::{Duration, Instant};

use redlock_core::{FencingMode, Redlock, Verdict, token_fingerprint};
use redlock_tests::Cluster;
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tells_free_held_and_inconsistent_and_never_the_token() {
    let cluster = Cluster::start(3);
    let rl = cluster.patient_redlock();

    let seen = rl.inspect("insp-a").await.unwrap();
    assert_eq!(seen.verdict, Verdict::Free, "{seen:?}");
    assert!(
        seen.nodes
            .iter()
            .all(|n| n.state.as_ref().is_ok_and(|s| !s.exists))
    );

    let ttl = Duration::from_secs(10);
    let asked = Instant::now();
    let lock = rl.mutex("insp-a").try_acquire(ttl).await.unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("insp-a") == 3));
    let before: Vec<i64> = cluster.nodes().iter().map(|n| n.pttl("insp-a")).collect();
    let seen = rl.inspect("insp-a").await.unwrap();
    // The keys were set after `asked`; PTTLs are whole milliseconds.
    let since = asked.elapsed() + Duration::from_millis(1);
    match &seen.verdict {
        Verdict::Held {
            holder,
            nodes,
            validity,
        } => {
            assert_eq!(*holder, token_fingerprint(lock.token()));
            assert_eq!(*nodes, 3);
            assert!(
                *validity + since >= ttl && *validity <= ttl,
                "validity {validity:?}, {since:?} after the lock was asked for"
            );
        }
        other => panic!("expected Held, got {other:?}"),
    }
    let shown = format!("{seen:?}");
    assert!(
        !shown.contains(lock.token()),
        "the token is a release capability: {shown}"
    );
    // Nothing changed: same value, PTTL not raised.
    let after: Vec<i64> = cluster.nodes().iter().map(|n| n.pttl("insp-a")).collect();
    for (b, a) in before.iter().zip(&after) {
        assert!(
            a <= b,
            "an inspection raised a PTTL: {before:?} -> {after:?}"
        );
    }
    assert_eq!(cluster.count_holding("insp-a", lock.token()), 3);

    // A node down: still held, on two.
    cluster.node(2).pause();
    let seen = rl.inspect("insp-a").await.unwrap();
    cluster.node(2).resume();
    assert!(
        matches!(seen.verdict, Verdict::Held { nodes: 2, .. }),
        "{:?}",
        seen.verdict
    );
    assert!(seen.nodes[2].state.is_err());
    rl.unlock(lock).await.unwrap();

    // A minority: one node holds a leftover.
    cluster
        .node(0)
        .cmd(&["SET", "insp-b", "leftover", "PX", "60000"]);
    let seen = rl.inspect("insp-b").await.unwrap();
    assert!(
        matches!(seen.verdict, Verdict::Inconsistent { .. }),
        "{:?}",
        seen.verdict
    );
    // Two holders.
    cluster
        .node(1)
        .cmd(&["SET", "insp-b", "another", "PX", "60000"]);
    cluster
        .node(2)
        .cmd(&["SET", "insp-b", "leftover", "PX", "60000"]);
    let seen = rl.inspect("insp-b").await.unwrap();
    match &seen.verdict {
        Verdict::Inconsistent { reason } => {
            assert!(reason.contains("2 different holders"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A foreign value.
    cluster.node(0).cmd(&["DEL", "insp-c"]);
    cluster.node(0).cmd(&["LPUSH", "insp-c", "x"]);
    let seen = rl.inspect("insp-c").await.unwrap();
    assert!(
        matches!(&seen.verdict, Verdict::Inconsistent { reason } if reason.contains("list")),
        "{:?}",
        seen.verdict
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_fencing_counter_and_release_token_deletes_only_that_holder() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap();
    let lock = rl
        .mutex("insp-f")
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap();
    let token = lock.fencing_token().unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("insp-f") == 3));
    let seen = rl.inspect("insp-f").await.unwrap();
    let counters: Vec<Option<u64>> = seen
        .nodes
        .iter()
        .map(|n| n.state.as_ref().unwrap().fencing_counter)
        .collect();
    assert!(
        counters.iter().filter(|c| **c == Some(token.get())).count() >= 2,
        "counters {counters:?}, token {token:?}"
    );

    // The escape hatch: a wrong token deletes nothing, the right one frees it.
    let wrong = rl.release_token("insp-f", "not-the-token").await.unwrap();
    assert_eq!(wrong.deleted, 0);
    assert_eq!(cluster.count_holding("insp-f", lock.token()), 3);
    let token_text = lock.token().to_owned();
    std::mem::forget(lock);
    let freed = rl.release_token("insp-f", &token_text).await.unwrap();
    assert!(freed.deleted >= 2, "{freed:?}");
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("insp-f") == 0));
}
