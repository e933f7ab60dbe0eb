//! The local waiter queue: first come first served, waiters that give up, a node restarted while waiting, the hand-over of a renewed holder.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{LockOptions, Redlock, RetryPolicy};
use redlock_tests::{Cluster, timing};

use super::*;

/// Waiters of one process are served in the order they came, each making its
/// attempt as soon as the one before releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn local_waiters_are_served_first_come_first_served() {
    const WAITERS: usize = 6;
    const HOLD: Duration = Duration::from_millis(5);
    let cluster = Cluster::start(3);
    // The subject is the queue's order, not a slow node: every call answered.
    let rl = cluster.patient_redlock();
    // Six hand-overs, each a release and the next waiter's attempt (a node
    // round each) and its hold.
    let handovers = timing::liveness((2 * timing::PATIENT_NODE_TIMEOUT + HOLD) * WAITERS as u32);
    // Neither a poll nor the first holder's expiry comes within that: far
    // beyond it.
    let far = 2 * handovers;
    let poll = RetryPolicy::deadline(2 * far)
        .with_delay(far)
        .with_jitter(Duration::ZERO);
    let first = rl.mutex("waiting:fifo").try_acquire(far).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (rl, order, poll) = (rl.clone(), Arc::clone(&order), poll.clone());
        tasks.push(spawn_queued(async move {
            let lock = rl
                .mutex("waiting:fifo")
                .acquire_with(Duration::from_secs(10), &poll)
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(HOLD).await;
            rl.unlock(lock).await.unwrap();
        }));
    }
    rl.unlock(first).await.unwrap();
    let served = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    assert!(
        tokio::time::timeout(handovers, served).await.is_ok(),
        "six hand-overs took over {handovers:?}: a waiter waited for a poll or an expiry"
    );
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
}

/// A waiter dropped at the head of the queue and one that timed out behind it
/// leave without taking the turn along: the next is served at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn waiters_that_give_up_do_not_block_the_next() {
    let cluster = Cluster::start(3);
    // The subject is the queue, not a slow node: every call answered.
    let rl = cluster.patient_redlock();
    // Held and polled far beyond the wake-up's bound: only the release can
    // serve the last waiter within it.
    let holder = rl.mutex("waiting:drop").try_acquire(far()).await.unwrap();
    let head = {
        let rl = rl.clone();
        spawn_queued(async move {
            let _ = rl
                .mutex("waiting:drop")
                .acquire_with(Duration::from_secs(10), &never_polls())
                .await;
        })
    };
    let timed_out = {
        let rl = rl.clone();
        spawn_queued(async move {
            tokio::time::timeout(
                ms(200),
                rl.mutex("waiting:drop")
                    .acquire_with(Duration::from_secs(10), &never_polls()),
            )
            .await
            .is_err()
        })
    };
    let last = {
        let rl = rl.clone();
        spawn_queued(async move {
            let lock = rl
                .mutex("waiting:drop")
                .acquire_with(Duration::from_secs(10), &never_polls())
                .await;
            (Instant::now(), lock)
        })
    };
    head.abort();
    assert!(
        timed_out.await.unwrap(),
        "the second waiter should have timed out"
    );
    rl.unlock(holder).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = tokio::time::timeout(woken_within(), last)
        .await
        .unwrap_or_else(|_| panic!("not served within {:?} of the release", woken_within()))
        .unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(after < woken_within(), "served {after:?} after the release");
    rl.unlock(lock.unwrap()).await.unwrap();
}

/// A node dies while a waiter waits: the waiter is woken by the lost
/// subscription (one more attempt, found busy), subscribes again when the
/// node is back, and is still woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_node_killed_and_restarted_while_waiting() {
    let cluster = Cluster::start(3);
    // The subject is a node killed, not a slow one: every call is answered.
    let (holder, waiter) = (cluster.patient_redlock(), cluster.patient_redlock());
    let node_timeout = redlock_tests::timing::PATIENT_NODE_TIMEOUT;
    // Far beyond every bound below: the holder's key outlives the kill and
    // the restart on a loaded machine, so the waiter can only be served by
    // the release.
    let ttl = Duration::from_secs(60);
    let asked = Instant::now();
    let lock = holder
        .mutex("waiting:restart")
        .try_acquire(ttl)
        .await
        .unwrap();
    // The holder's lock returned at quorum; its last node's write may still
    // be on its way. Had the waiter's first attempt taken that node first,
    // the kill below would leave the holder a single node, and the restarted
    // empty node and that one would be a quorum for the waiter: Redlock's
    // restart without delay (the distlock page), not this test's subject.
    // Seen once in 15 runs under stress, before this wait.
    held_everywhere(&cluster, "waiting:restart", lock.token());
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let lock = waiter
                .mutex("waiting:restart")
                .acquire_with(
                    Duration::from_secs(10),
                    // The safety-net poll is far beyond every bound below,
                    // so each wake-up seen is a real one, on a loaded machine.
                    &RetryPolicy::deadline(ms(240_000))
                        .with_delay(Duration::from_secs(120))
                        .with_jitter(Duration::ZERO),
                )
                .await;
            (Instant::now(), lock)
        })
    };
    // An attempt, then the subscriptions.
    assert!(
        cluster.wait_until(redlock_tests::timing::liveness(node_timeout * 2), |c| (0
            ..3)
            .all(|n| subscribers(c, n, "waiting:restart") == 1)),
        "the waiter never subscribed on every node"
    );
    // Part of the scenario: the attempt that follows the subscriptions has
    // likely run by now (one after the read below only makes the check
    // that follows pass sooner, never fail).
    tokio::time::sleep(ms(100)).await;
    let sets = set_calls(&cluster, 0);
    cluster.node(2).kill();
    // The lost subscription wakes the waiter for one more attempt, well
    // before its 30 s poll.
    assert!(
        cluster.wait_until(
            redlock_tests::timing::liveness(node_timeout),
            |c| set_calls(c, 0) > sets
        ),
        "no attempt after the node's subscription was lost"
    );
    cluster.node(2).restart();
    // The subscriber reconnects after its backoff (at most 2 s), then
    // subscribes.
    let resubscribed = cluster.wait_until(
        redlock_tests::timing::liveness(Duration::from_secs(2) + node_timeout * 2),
        |c| subscribers(c, 2, "waiting:restart") == 1,
    );
    if !resubscribed {
        // Seen once in a loaded full-suite run: what the node saw.
        let node = cluster.node(2);
        let clients: String = node.raw(&["CLIENT", "LIST"]).unwrap_or_default();
        let channels: Vec<String> = node.raw(&["PUBSUB", "CHANNELS"]).unwrap_or_default();
        let stats: String = node.raw(&["INFO", "stats"]).unwrap_or_default();
        let accepted = stats
            .lines()
            .find(|l| l.starts_with("total_connections_received"))
            .unwrap_or_default();
        let since = asked.elapsed();
        let outcome = if waiting.is_finished() {
            let (at, lock) = waiting.await.expect("the waiter's task");
            format!(
                "it ended {:?} after it asked with {lock:?}",
                at.saturating_duration_since(asked)
            )
        } else {
            "it still waits".to_owned()
        };
        panic!(
            "the waiter did not subscribe again on the restarted node ({outcome}; {since:?} \
             since it asked); its clients:\n{clients}channels: {channels:?}; {accepted}"
        );
    }
    holder.unlock(lock).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    // The holder's keys expire no sooner than the TTL after `asked`, the poll
    // is 30 s away: served before that, only the release served it.
    assert!(
        acquired < asked + ttl,
        "served {after:?} after the release, at the holder's expiry"
    );
    waiter.unlock(lock.unwrap()).await.unwrap();
}

/// A guarded lock renewed for several of its TTLs keeps its local waiters
/// queued: they make no attempt while it is held (its turn used to end with
/// its first validity, and the next waiter then contended, trying again at
/// every PTTL), and its release hands the lock to the next waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_renewed_holder_keeps_its_local_waiters_queued_for_the_hand_over() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(250))
        .build()
        .unwrap();
    let key = "waiting:renewed";
    let ttl = ms(1000);
    let guard = rl
        .mutex(key)
        .guard(&LockOptions::new(ttl).retry(slow_poll(ms(20_000))))
        .await
        .unwrap();
    let handle = guard.handle();
    held_everywhere(&cluster, key, handle.token());
    let first = handle.valid_until();
    let sets = || (0..3).map(|n| set_calls(&cluster, n)).sum::<u64>();
    let before = sets();
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl
                .mutex(key)
                .acquire_with(Duration::from_secs(10), &slow_poll(ms(20_000)))
                .await;
            (Instant::now(), lock)
        })
    };
    assert!(
        cluster.wait_until(ms(15_000), |_| handle.valid_until() > first + 3 * ttl),
        "the guard did not renew for three TTLs"
    );
    assert!(!handle.is_lost());
    assert_eq!(
        sets(),
        before,
        "the local waiter attempted while the holder renewed its lock"
    );
    let released = Instant::now();
    // The keys live at least until the holder's last validity ends.
    let last = handle.valid_until();
    guard.release().await.unwrap();
    let (acquired, lock) = waiter.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    // Without the hand-over the waiter would wait for the keys to expire,
    // which is no sooner than the holder's last validity: served before it,
    // it was handed the lock.
    assert!(
        acquired < last,
        "served {after:?} after the release, {:?} past the holder's last validity",
        acquired.saturating_duration_since(last)
    );
    rl.unlock(lock.unwrap()).await.unwrap();
}
