//! Waiters woken by releases: no overlap, wake-ups long before the poll, no wake-up by a partial clean-up, and the fallbacks for what no message announces.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock_core::deadpool_redis::redis::{self, AsyncCommands};
use redlock_core::{Redlock, RetryPolicy};
use redlock_tests::Cluster;

use super::*;

/// 16 clients (two handles of 8, so both the local queue and the wake-ups
/// across handles are in play) take turns on one key, each doing a
/// read-modify-write of a counter in Redis with a pause in the middle: a
/// lost update or an overlap would show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn most_clients_wait_and_none_overlap() {
    let cluster = Cluster::start(3);
    // The subject is exclusion, not a slow node; and a TTL no hold outlives
    // on a loaded machine, so that the overlap check judges the library.
    let handles = [cluster.patient_redlock(), cluster.patient_redlock()];
    let counter = redis::Client::open(cluster.node(0).url()).unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    const ROUNDS: u64 = 8;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let rl = handles[i % 2].clone();
        let inside = Arc::clone(&inside);
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = counter.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..ROUNDS {
                let lock = rl
                    .mutex("waiting:counter")
                    .acquire_with(ms(10_000), &RetryPolicy::deadline(ms(30_000)))
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                let n: u64 = conn
                    .get::<_, Option<u64>>("counter")
                    .await
                    .unwrap()
                    .unwrap_or(0);
                tokio::time::sleep(ms(1)).await;
                let _: () = conn.set("counter", n + 1).await.unwrap();
                inside.store(false, Ordering::SeqCst);
                rl.unlock(lock).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        cluster.node(0).get("counter"),
        Some((16 * ROUNDS).to_string())
    );
    // Every waiter unsubscribed when it stopped waiting.
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3).all(|n| subscribers(
            c,
            n,
            "waiting:counter"
        ) == 0)),
        "subscriptions left behind"
    );
}

/// Holds `key` from `holder` (for [`far`]), releases it once `waiter` has
/// made its first attempt (or after `hold`, for a waiter of the holder's own
/// handle, which waits in the local queue without one), and returns how long
/// after the release was sent `waiter` took the lock.
pub(super) async fn release_to_acquire(
    cluster: &Cluster,
    holder: &Redlock,
    waiter: &Redlock,
    key: &str,
    retry: RetryPolicy,
    hold: Duration,
) -> Duration {
    let lock = holder.mutex(key).try_acquire(far()).await.unwrap();
    let sets = || (0..3).map(|n| set_calls(cluster, n)).sum::<u64>();
    let base = sets();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.to_owned());
        tokio::spawn(async move {
            let lock = waiter
                .mutex(&key)
                .acquire_with(Duration::from_secs(10), &retry)
                .await;
            (Instant::now(), lock)
        })
    };
    if std::ptr::eq(holder, waiter) {
        tokio::time::sleep(hold).await;
    } else {
        assert!(
            redlock_tests::util::eventually(timing::settled(), || sets() >= base + 3).await,
            "{key}: the waiter never attempted"
        );
    }
    let released = Instant::now();
    holder.unlock(lock).await.unwrap();
    let (acquired, lock) = waiting.await.unwrap();
    waiter.unlock(lock.unwrap()).await.unwrap();
    acquired.saturating_duration_since(released)
}

/// The holder's TTL and the waiter's poll are both [`far`]: only the release
/// message (from another handle) or the local release (same handle) can hand
/// the lock over within [`woken_within`]. With wake-ups off, the same waiter
/// is not served before its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_wakes_the_waiter_long_before_its_poll() {
    let cluster = Cluster::start(3);
    let (a, b) = (cluster.patient_redlock(), cluster.patient_redlock());
    let across =
        release_to_acquire(&cluster, &a, &b, "waiting:across", never_polls(), ms(200)).await;
    assert!(
        across < woken_within(),
        "woken {across:?} after the release (other handle)"
    );
    let local = release_to_acquire(&cluster, &a, &a, "waiting:local", never_polls(), ms(200)).await;
    assert!(
        local < woken_within(),
        "woken {local:?} after the release (same handle)"
    );

    let polling = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .wake_on_release(false)
        .build()
        .unwrap();
    let retry = RetryPolicy::deadline(ms(20_000))
        .with_delay(ms(1500))
        .with_jitter(Duration::ZERO);
    let polled = release_to_acquire(&cluster, &a, &polling, "waiting:polled", retry, ms(200)).await;
    assert!(
        polled > ms(1000),
        "a polling waiter was served {polled:?} after the release"
    );
}

/// A release announced on too few nodes to free a quorum (another waiter's
/// failed attempt cleaning up the one node it took) does not send the waiter
/// against a lock still held on the others: with three contending processes,
/// waking on every such message cost ten `SET`s per node per acquisition.
/// The holder's own release still wakes it at once.
///
/// The premise is a lock held on all three nodes and a waiter that found all
/// three busy. On a loaded machine the holder sometimes held two: `try_lock`
/// returns once a quorum answered, and its `SET` on the third node was late
/// (or, with a 100 ms node timeout on a cold connection, never sent). The
/// waiter then took the third node in each attempt (and released it), and
/// one more node's announcement rightly made a quorum with the node it took:
/// the failure seen on a fresh clone. Hence patient handles, and a waiter
/// that starts once the holder holds every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_clean_up_on_one_node_does_not_wake_the_waiters_of_a_held_lock() {
    let cluster = Cluster::start(3);
    let (a, b) = (cluster.patient_redlock(), cluster.patient_redlock());
    let key = "waiting:cleanup";
    let sets = || (0..3).map(|n| set_calls(&cluster, n)).sum::<u64>();
    let held = a.mutex(key).try_acquire(far()).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let base = sets();
    let waiter = tokio::spawn(async move {
        let lock = b
            .mutex(key)
            .acquire_with(Duration::from_secs(10), &never_polls())
            .await;
        (Instant::now(), lock, b)
    });
    // Its first attempt, then its second once subscribed on every node: it
    // sleeps after that until news.
    assert!(
        cluster.wait_until(timing::settled(), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 1)
            && sets() >= base + 6),
        "the waiter never subscribed and tried again ({} SETs)",
        sets() - base
    );
    let before = sets();
    assert_eq!(before, base + 6, "more than two attempts before any news");
    cluster.node(0).cmd(&["PUBLISH", &channel(key), "1"]);
    // Time for a wrong wake-up to show (it would follow within a round trip).
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        sets(),
        before,
        "the waiter attempted after a release heard on one node of three"
    );
    let released = Instant::now();
    a.unlock(held).await.unwrap();
    let (acquired, lock, b) = waiter.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < woken_within(),
        "woken {after:?} after the holder's release"
    );
    b.unlock(lock.unwrap()).await.unwrap();
}

/// What no message announces: a key that expires (the waiter wakes at the
/// holder's PTTL), and a key deleted without the release script (the waiter's
/// safety-net poll finds it free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn expiry_and_silent_deletes_are_found_by_the_fallbacks() {
    let cluster = Cluster::start(3);
    let rl = cluster.patient_redlock();
    // Set after `start`: no quorum is free before 700 ms from it.
    let start = Instant::now();
    for node in cluster.nodes() {
        node.cmd(&["SET", "waiting:expiry", "foreign", "PX", "700"]);
    }
    let lock = rl
        .mutex("waiting:expiry")
        .acquire_with(Duration::from_secs(10), &never_polls())
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(
        took >= ms(600) && took < ms(700) + woken_within(),
        "PTTL fallback: {took:?}"
    );
    rl.unlock(lock).await.unwrap();

    for node in cluster.nodes() {
        node.cmd(&[
            "SET",
            "waiting:silent",
            "foreign",
            "PX",
            &far().as_millis().to_string(),
        ]);
    }
    let retry = RetryPolicy::deadline(far())
        .with_delay(ms(300))
        .with_jitter(Duration::ZERO);
    let waiting = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl
                .mutex("waiting:silent")
                .acquire_with(Duration::from_secs(10), &retry)
                .await;
            (Instant::now(), lock)
        })
    };
    tokio::time::sleep(ms(400)).await;
    for node in cluster.nodes() {
        node.cmd(&["DEL", "waiting:silent"]);
    }
    let deleted = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(deleted);
    assert!(
        after < ms(300) + woken_within(),
        "safety-net poll: {after:?} after the delete"
    );
    rl.unlock(lock.unwrap()).await.unwrap();
}
