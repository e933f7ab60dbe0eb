//! Acquiring several resources: no deadlock nor overlap, a node counts only with every key, partial acquires released.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redlock_core::{Error, RetryPolicy};
use redlock_tests::Cluster;

use redlock_tests::timing;

use super::*;

/// Two clients (each its own handle, as two processes would be) lock {A, B}
/// and {B, A} in a loop, and a third locks A alone: every acquire succeeds
/// within its deadline (no deadlock, no livelock), and no key ever has two
/// holders at once (checked inside each holder's validity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn opposite_orders_never_deadlock_nor_overlap() {
    const ITERATIONS: usize = 300;
    const CLIENTS: u32 = 3;
    // The locks' TTL, a setting the patient node timeout fits in.
    const TTL: Duration = Duration::from_secs(5);
    let node_timeout = timing::PATIENT_NODE_TIMEOUT;
    // An acquire outwaits the other clients' holds, each an acquire and a
    // release round at most (the hold itself is a yield), then makes its own
    // attempt: without deadlock nor livelock it has the set within that.
    let allowed = (CLIENTS - 1) * 2 * node_timeout + node_timeout;
    let retry = RetryPolicy::deadline(timing::liveness(allowed));
    // A client's iterations: each an acquire and a release round.
    let hung = timing::liveness((allowed + node_timeout) * ITERATIONS as u32);
    let cluster = Cluster::start(3);
    let holders = Arc::new(Holders::default());
    let begin = Instant::now();
    let mut tasks = Vec::new();
    for (client, set) in [vec!["A", "B"], vec!["B", "A"], vec!["A"]]
        .into_iter()
        .enumerate()
    {
        // Every call answered: the subject is the order of the keys.
        let rl = cluster.patient_redlock();
        rl.check_nodes().await.unwrap();
        let (holders, retry) = (Arc::clone(&holders), retry.clone());
        tasks.push(tokio::spawn(async move {
            for done in 0..ITERATIONS {
                let lock = rl
                    .mutex_many(&set)
                    .unwrap()
                    .acquire_with(TTL, &retry)
                    .await
                    .unwrap_or_else(|e| panic!("client {client} ({set:?}), iteration {done}: {e}"));
                let held = lock.resources();
                assert_eq!(held.len(), set.len());
                holders.enter(&held);
                tokio::task::yield_now().await;
                // Only an overlap inside the validity would break the promise.
                assert!(
                    lock.is_valid(),
                    "client {client}: validity ran out while held"
                );
                holders.leave(&held);
                rl.unlock(lock).await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(hung, t)
            .await
            .expect("a client hung")
            .expect("a client panicked");
    }
    let overlaps = holders.overlaps.load(Ordering::SeqCst);
    println!(
        "many: {ITERATIONS} iterations per client ({{A,B}}, {{B,A}}, {{A}}) in {:?}, {overlaps} overlaps",
        begin.elapsed()
    );
    assert_eq!(overlaps, 0);
}

/// A node where one of the keys is held by someone else does not count, even
/// though each key alone is free on a quorum: node 0 has a foreign A, node 1 a
/// foreign B, so only node 2 could set both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_node_holding_one_key_for_another_does_not_count() {
    let cluster = Cluster::start(3);
    let rl = cluster.patient_redlock();
    rl.check_nodes().await.unwrap();
    cluster.node(0).cmd(&["SET", "fa", FOREIGN, "PX", "30000"]);
    cluster.node(1).cmd(&["SET", "fb", FOREIGN, "PX", "30000"]);
    let err = rl
        .mutex_many(["fa", "fb"])
        .unwrap()
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // Node 2 set both and was released; nodes 0 and 1 set nothing.
    eventually_only_foreign(&cluster, &[(0, "fa"), (1, "fb")], &["fa", "fb"]).unwrap();
    // Each key alone is free on a quorum.
    for key in ["fa", "fb"] {
        let lock = rl
            .mutex(key)
            .try_acquire(Duration::from_secs(10))
            .await
            .unwrap();
        rl.unlock(lock).await.unwrap();
    }
}

/// For every way of putting a foreign value at A, at B, or at neither on each
/// node (3^N cases), locking {A, B} succeeds iff the nodes with neither form a
/// quorum; afterwards (unlocked, or failed) only the foreign values are left.
pub(super) async fn check_every_spread(n: usize) {
    let cluster = Cluster::start(n);
    let rl = cluster.patient_redlock();
    rl.check_nodes().await.unwrap();
    let quorum = n / 2 + 1;
    let (mut successes, mut failures) = (0, 0);
    for case in 0..3usize.pow(n as u32) {
        let (a, b) = (
            format!("spread:{n}:{case}:a"),
            format!("spread:{n}:{case}:b"),
        );
        let mut foreign: Vec<(usize, &str)> = Vec::new();
        let mut rest = case;
        for i in 0..n {
            match rest % 3 {
                1 => foreign.push((i, &a)),
                2 => foreign.push((i, &b)),
                _ => {}
            }
            rest /= 3;
        }
        for &(i, key) in &foreign {
            cluster.node(i).cmd(&["SET", key, FOREIGN, "PX", "30000"]);
        }
        let free = n - foreign.len();
        let what = format!("N={n}, foreign {foreign:?}");
        match rl
            .mutex_many([&a, &b])
            .unwrap()
            .try_acquire(Duration::from_secs(10))
            .await
        {
            Ok(lock) => {
                assert!(free >= quorum, "{what}: locked with {free} free nodes");
                successes += 1;
                let holding = cluster
                    .nodes()
                    .iter()
                    .filter(|node| {
                        node.get(&a).as_deref() == Some(lock.token())
                            && node.get(&b).as_deref() == Some(lock.token())
                    })
                    .count();
                assert!(
                    holding >= quorum && holding <= free,
                    "{what}: {holding} nodes hold both"
                );
                rl.unlock(lock).await.unwrap();
            }
            Err(e) => {
                assert!(free < quorum, "{what}: refused with {free} free nodes: {e}");
                assert!(matches!(e, Error::Busy { .. }), "{what}: {e:?}");
                failures += 1;
            }
        }
        eventually_only_foreign(&cluster, &foreign, &[&a, &b])
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    assert!(successes > 0 && failures > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn acquire_succeeds_iff_the_nodes_with_neither_key_are_a_quorum_three_nodes() {
    check_every_spread(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn acquire_succeeds_iff_the_nodes_with_neither_key_are_a_quorum_five_nodes() {
    check_every_spread(5).await;
}

/// An attempt that set both keys on a minority is released there: two of five
/// nodes are free, the other three hold one key or the other for someone
/// else; the two free nodes end with neither key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_partial_acquire_is_released_everywhere() {
    let cluster = Cluster::start(5);
    let rl = cluster.patient_redlock();
    rl.check_nodes().await.unwrap();
    let foreign = [(0, "pa"), (1, "pb"), (2, "pa"), (2, "pb")];
    for &(i, key) in &foreign {
        cluster.node(i).cmd(&["SET", key, FOREIGN, "PX", "30000"]);
    }
    let monitors: Vec<_> = [3, 4].iter().map(|&i| cluster.node(i).monitor()).collect();
    let err = rl
        .mutex_many(["pa", "pb"])
        .unwrap()
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    eventually_only_foreign(&cluster, &foreign, &["pa", "pb"]).unwrap();
    // The free nodes did take both keys before the release.
    for m in &monitors {
        let set_both = |m: &redlock_tests::monitor::Monitor| {
            let lines = m.lines();
            ["pa", "pb"].iter().all(|k| {
                lines
                    .iter()
                    .any(|l| l.contains(&format!("\"SET\" \"{k}\"")))
            })
        };
        assert!(
            cluster.wait_until(timing::settled(), |_| set_both(m)),
            "a free node never set both keys: {:?}",
            m.lines()
        );
    }
}

/// Extend counts a node only if every key still holds the token there: with
/// B taken by someone else on two of three nodes, the extend is refused, and
/// it did not push A's expiry on those nodes either. With B taken on one node
/// only, it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn extend_fails_when_one_key_was_stolen_on_a_quorum() {
    let cluster = Cluster::start(3);
    let rl = cluster.patient_redlock();
    rl.check_nodes().await.unwrap();
    let mut lock = rl
        .mutex_many(["xa", "xb"])
        .unwrap()
        .try_acquire(ms(5000))
        .await
        .unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_holding("xb", lock.token())
            == 3)
    );
    cluster.node(0).cmd(&["SET", "xb", FOREIGN, "PX", "30000"]);
    rl.extend(&mut lock, ms(5000)).await.unwrap();
    cluster.node(1).cmd(&["SET", "xb", FOREIGN, "PX", "30000"]);
    let err = rl.extend(&mut lock, ms(20_000)).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    // All or none on a node: A keeps its old expiry where B was taken.
    for i in [0, 1] {
        let pttl = cluster.node(i).pttl("xa");
        assert!(
            pttl <= 5000,
            "node {i}: xa pttl {pttl} after a refused extend"
        );
    }
    rl.unlock(lock).await.unwrap();
    eventually_only_foreign(&cluster, &[(0, "xb"), (1, "xb")], &["xa", "xb"]).unwrap();
}
