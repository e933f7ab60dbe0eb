//! The release channels and their subscriptions: databases, down nodes, dead subscriptions, the waiters flag, ACLs.

use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_core::deadpool_redis::redis::{self, AsyncCommands};
use redlock_tests::Cluster;
use redlock_tests::proxy::{DirFault, Direction, FaultProxy, Flow};
use redlock_tests::util::eventually;

use super::*;

/// `PUBLISH` reaches every database of a server: the same key taken and
/// released in database 1, flagged there as if a waiter of database 1 waited
/// (so that its release announces itself, by the script for databases other
/// than 0), does not wake its waiter in database 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_in_another_database_wakes_no_waiter() {
    let cluster = Cluster::start(3);
    let (holder, waiter) = (cluster.patient_redlock(), cluster.patient_redlock());
    let db1 = Redlock::builder()
        .urls(cluster.urls().iter().map(|u| format!("{u}/1")))
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap();
    let key = "waiting:db";
    let sets = || (0..3).map(|n| set_calls(&cluster, n)).sum::<u64>();
    let held = holder.mutex(key).try_acquire(far()).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let base = sets();
    let waiting = tokio::spawn(async move {
        let lock = waiter
            .mutex(key)
            .acquire_with(Duration::from_secs(10), &never_polls())
            .await;
        (Instant::now(), lock, waiter)
    });
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 1)
            && sets() >= base + 6),
        "the waiter never subscribed and tried again"
    );
    assert_eq!(sets(), base + 6, "more than two attempts before any news");
    let other = db1
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap();
    for url in cluster.urls() {
        let mut conn = redis::Client::open(format!("{url}/1"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = conn
            .set_options(
                flag(key),
                1,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(60_000)),
            )
            .await
            .unwrap();
    }
    let announced: Vec<u64> = (0..3).map(|n| publishes(&cluster, n)).collect();
    db1.unlock(other).await.unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| publishes(c, n) == announced[n] + 1)),
        "database 1's release did not announce itself on every node"
    );
    // Database 1's acquire is a bare `SET` (no `TYPE`): the count is still
    // the waiter's two attempts. (It used to wait here for `base + 9`, which
    // only the waiter's 5 s poll made.)
    let before = base + 6;
    // Time for a wrong wake-up to show (it would follow within a round trip).
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        sets(),
        before,
        "a release in database 1 woke the waiter of database 0"
    );
    let released = Instant::now();
    holder.unlock(held).await.unwrap();
    let (acquired, lock, waiter) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(after < woken_within(), "woken {after:?} after the release");
    waiter.unlock(lock.unwrap()).await.unwrap();
}

/// `holder` holds `key` while `waiter` waits for it until subscribed on every
/// node, then releases; `waiter` takes the lock and releases it, and its
/// subscriptions are gone.
pub(super) async fn one_wait(
    cluster: &Cluster,
    holder: &Redlock,
    waiter: &Redlock,
    key: &'static str,
) {
    let held = holder.mutex(key).try_acquire(far()).await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .mutex(key)
                .acquire_with(Duration::from_secs(10), &never_polls())
                .await
        })
    };
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 1)),
        "the waiter never subscribed on every node"
    );
    holder.unlock(held).await.unwrap();
    waiter
        .unlock(waiting.await.unwrap().unwrap())
        .await
        .unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 0)),
        "subscriptions left behind"
    );
}

/// With no waiter, a node's pub/sub task makes no connection: a node that went
/// down is not tried again for nobody (it was, every 2 s at most, forever),
/// and the next waiter makes the task connect and subscribe again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn without_waiters_a_down_node_is_not_retried() {
    let cluster = Cluster::start(3);
    let proxy = FaultProxy::start(2, cluster.node(2).port(), None)
        .await
        .unwrap();
    let waiter = Redlock::builder()
        .urls([cluster.node(0).url(), cluster.node(1).url(), proxy.url()])
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap();
    let holder = cluster.patient_redlock();
    one_wait(&cluster, &holder, &waiter, "waiting:idle").await;
    // Nobody waits: the task has unsubscribed; wait until it has also closed
    // its connection (no client of node 2 is in pub/sub mode), so that the
    // kill below meets an idle task.
    let pubsub_clients = |c: &Cluster| -> usize {
        let list: String = c.node(2).raw(&["CLIENT", "LIST"]).unwrap_or_default();
        list.lines()
            .filter(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("flags="))
                    .is_some_and(|f| f.contains('P'))
            })
            .count()
    };
    assert!(
        cluster.wait_until(redlock_tests::timing::settled(), |c| pubsub_clients(c) == 0),
        "the pub/sub connection stayed open with no waiter"
    );
    let accepted = proxy.stats().accepted;
    cluster.node(2).kill();
    // The subscription's connection closes with the node; nobody waits.
    assert!(
        !cluster.wait_until(ms(3000), |_| proxy.stats().accepted > accepted),
        "the pub/sub task connected again with no waiter ({} connections)",
        proxy.stats().accepted - accepted
    );
    cluster.node(2).restart();
    one_wait(&cluster, &holder, &waiter, "waiting:idle").await;
    assert!(proxy.stats().accepted > accepted);
}

/// A subscription whose connection died without a word (here the path drops
/// what the node sends on it, and, as TCP after a lost segment, never
/// delivers on it again) is found out by a `PING` and replaced: the waiter is
/// then woken by the holder's release, not by its 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_silently_dead_subscription_is_replaced() {
    let cluster = Cluster::start(1);
    let proxy = FaultProxy::start(0, cluster.node(0).port(), None)
        .await
        .unwrap();
    let waiter = Redlock::builder()
        .urls([proxy.url()])
        .node_timeout(ms(500))
        .build()
        .unwrap();
    let holder = cluster.patient_redlock();
    let key = "waiting:dead-sub";
    let sets = || set_calls(&cluster, 0);
    let held = holder
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    let base = sets();
    // A poll beyond the whole scenario: no attempt of the waiter's comes from
    // it before `spawned + poll`, so one served sooner was woken.
    let poll = Duration::from_secs(60);
    let policy = RetryPolicy::deadline(poll * 2)
        .with_delay(poll)
        .with_jitter(Duration::ZERO);
    let spawned = Instant::now();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let lock = waiter
                .mutex(key)
                .acquire_with(Duration::from_secs(10), &policy)
                .await;
            (Instant::now(), lock)
        })
    };
    assert!(
        cluster.wait_until(ms(10_000), |c| subscribers(c, 0, key) == 1
            && sets() >= base + 2),
        "the waiter never subscribed and tried again"
    );
    let accepted = proxy.stats().accepted;
    // What the node sends on the subscription from now on is lost: the
    // announcement below, and the connection's every later byte.
    proxy.set(
        Direction::Reply,
        DirFault {
            flow: Flow::Blackhole,
            ..DirFault::default()
        },
    );
    cluster.node(0).cmd(&["PUBLISH", &channel(key), "1"]);
    assert!(
        cluster.wait_until(ms(5000), |_| proxy.stats().dropped_chunks > 0),
        "the announcement was not dropped"
    );
    proxy.set(Direction::Reply, DirFault::default());
    assert!(
        cluster.wait_until(ms(10_000), |_| proxy.stats().accepted > accepted),
        "the dead subscription was never replaced"
    );
    // The new one answers its `PING`s, and is kept.
    let replaced = proxy.stats().accepted;
    assert!(
        !cluster.wait_until(ms(2500), |_| proxy.stats().accepted > replaced),
        "a live subscription was replaced"
    );
    let released = Instant::now();
    holder.unlock(held).await.unwrap();
    let (acquired, lock) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(
        acquired < spawned + poll,
        "served {after:?} after the release, by its poll"
    );
    waiter.unlock(lock.unwrap()).await.unwrap();
}

/// How many `PUBLISH`es `node` has run (the release script's among them).
pub(super) fn publishes(cluster: &Cluster, node: usize) -> u64 {
    calls(cluster, node, "publish")
}

/// The key of `key`'s waiters flag.
pub(super) fn flag(key: &str) -> String {
    format!("{{{key}}}:redlock-waiters")
}

/// A release that nobody waits for announces nothing: the node runs no
/// `PUBLISH` (issue 21, server CPU). A waiter first leaves the waiters flag
/// on every node; the next release deletes it with the key and announces
/// itself, which wakes the waiter long before its poll and the holder's
/// TTL (both [`far`]). The waiter's own release, nobody waiting any more, leaves no
/// flag behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_announces_itself_only_when_a_waiter_flagged_the_key() {
    let cluster = Cluster::start(3);
    let (a, b) = (cluster.patient_redlock(), cluster.patient_redlock());
    let key = "waiting:flag";
    let all_publishes = |c: &Cluster| -> Vec<u64> { (0..3).map(|n| publishes(c, n)).collect() };

    // Nobody waits: the key is deleted everywhere, and nothing published.
    let before = all_publishes(&cluster);
    let lock = a
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    held_everywhere(&cluster, key, lock.token());
    a.unlock(lock).await.unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0),
        "the release did not reach every node"
    );
    assert_eq!(
        all_publishes(&cluster),
        before,
        "a release nobody waited for published"
    );

    // A waiter flags the key on every node before its attempt after subscribing.
    let held = a.mutex(key).try_acquire(far()).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let waiter = tokio::spawn(async move {
        let lock = b
            .mutex(key)
            .acquire_with(Duration::from_secs(10), &never_polls())
            .await;
        (Instant::now(), lock, b)
    });
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 1 && c.node(n).pttl(&flag(key)) > 0)),
        "the waiter never subscribed and flagged the key"
    );
    let before = all_publishes(&cluster);
    let released = Instant::now();
    a.unlock(held).await.unwrap();
    let (acquired, lock, b) = waiter.await.unwrap();
    let lock = lock.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < woken_within(),
        "woken {after:?} after the release (the poll is far later)"
    );
    assert!(
        eventually(timing::settled(), || all_publishes(&cluster)
            .iter()
            .zip(&before)
            .all(|(now, was)| *now == was + 1))
        .await,
        "one announcement per node expected: {:?} -> {:?}",
        before,
        all_publishes(&cluster)
    );

    // The waiter's release deletes its key and the flag its last attempt
    // set. Its lock was decided at a quorum: on a node where the holder's
    // release landed after the waiter's `SET`, it was busy and holds no key
    // (seen in a quiet run), so a quorum holds its token, not every node.
    held_on_quorum(&cluster, key, lock.token());
    b.unlock(lock).await.unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| c
            .nodes()
            .iter()
            .all(|n| n.keys().is_empty())),
        "keys left: {:?}",
        cluster.nodes().iter().map(|n| n.keys()).collect::<Vec<_>>()
    );
}

/// A user whose ACL allows the lock keys but not their waiters flags still
/// releases, one key or a set (the releases without the flags, after the
/// flagged script's `ERR`: by `EVAL` on the first release, which finds the
/// script not loaded, and by `EVALSHA` on the later ones), and a waiter of
/// that user is still woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_user_refused_the_flag_key_still_releases_and_wakes() {
    let cluster = Cluster::start(3);
    let mut urls = Vec::new();
    for node in cluster.nodes() {
        // `acl:?` matches the lock key `acl:k`, not `acl:k:redlock-waiters`.
        node.cmd(&[
            "ACL", "SETUSER", "narrow", "on", ">secret", "~acl:?", "&*", "+@all",
        ]);
        urls.push(format!("redis://narrow:secret@127.0.0.1:{}", node.port()));
    }
    let handle = || {
        Redlock::builder()
            .urls(urls.clone())
            .node_timeout(timing::PATIENT_NODE_TIMEOUT)
            .build()
            .unwrap()
    };
    let (a, b) = (handle(), handle());
    let key = "acl:k";
    let lock = a
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    held_everywhere(&cluster, key, lock.token());
    let released = a.unlock(lock).await.unwrap();
    assert!(released.deleted >= 2, "{}", released.report());
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0),
        "the release did not reach every node"
    );
    // A set's release, too.
    let set = a
        .mutex_many(["acl:a", "acl:b"])
        .unwrap()
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    let released = a.unlock(set).await.unwrap();
    assert!(released.deleted >= 2, "{}", released.report());
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key("acl:a") == 0
            && c.count_with_key("acl:b") == 0),
        "the set's release did not reach every node"
    );

    let held = a.mutex(key).try_acquire(far()).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let waiter = tokio::spawn(async move {
        let lock = b
            .mutex(key)
            .acquire_with(Duration::from_secs(10), &never_polls())
            .await;
        (Instant::now(), lock)
    });
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 1)),
        "the waiter never subscribed"
    );
    let released = Instant::now();
    a.unlock(held).await.unwrap();
    let (acquired, lock) = waiter.await.unwrap();
    assert!(lock.is_ok(), "{lock:?}");
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < woken_within(),
        "woken {after:?} after the release (the poll is far later)"
    );
    for node in cluster.nodes() {
        assert_eq!(
            node.keys()
                .iter()
                .filter(|k| k.ends_with("waiters"))
                .count(),
            0
        );
    }
}
