//! Releases of a set wake the waiters of each key, and a single key's release wakes a set's waiter.

use std::time::{Duration, Instant};

use redlock_core::{Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};

/// How soon a woken waiter holds the lock: the release announced and an
/// attempt made, each one node round at most.
fn woken_within() -> Duration {
    timing::liveness(2 * PATIENT_NODE_TIMEOUT)
}

/// Far beyond [`woken_within`]: the holder's TTL and the waiters' poll, so
/// that neither can be what served a waiter within that bound.
fn far() -> Duration {
    4 * woken_within()
}

/// A release deletes every key and announces each: a waiter on A alone and a
/// waiter on {B, C}, both polling every 5 s, are woken by the release of
/// {A, B} long before.
/// Two handles with checked nodes, and a policy whose poll ([`far`]) is far
/// too slow for the wake-up tests: only a release heard can pass them.
pub(super) async fn holder_waiter_and_slow_poll(
    cluster: &Cluster,
) -> (Redlock, Redlock, RetryPolicy) {
    let holder = cluster.patient_redlock();
    let waiter = cluster.patient_redlock();
    holder.check_nodes().await.unwrap();
    waiter.check_nodes().await.unwrap();
    let slow = RetryPolicy::deadline(2 * far())
        .with_delay(far())
        .with_jitter(Duration::ZERO);
    (holder, waiter, slow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn release_wakes_the_waiters_of_every_key() {
    let cluster = Cluster::start(3);
    let (holder, waiter, slow) = holder_waiter_and_slow_poll(&cluster).await;
    let lock = holder
        .mutex_many(["wa", "wb"])
        .unwrap()
        .try_acquire(far())
        .await
        .unwrap();
    let (w1, w2) = (waiter.clone(), waiter.clone());
    let (s1, s2) = (slow.clone(), slow.clone());
    let one = tokio::spawn(async move {
        w1.mutex("wa")
            .acquire_with(Duration::from_secs(5), &s1)
            .await
    });
    let set = tokio::spawn(async move {
        w2.mutex_many(["wc", "wb"])?
            .acquire_with(Duration::from_secs(5), &s2)
            .await
    });
    // Both waiters subscribed (after their first failed attempt) on every node.
    let subscribed = |key: &str| {
        cluster.nodes().iter().all(|n| {
            let v: Vec<redlock_core::deadpool_redis::redis::Value> = n
                .raw(&["PUBSUB", "NUMSUB", &format!("redlock:released:0:{{{key}}}")])
                .unwrap();
            matches!(
                v.get(1),
                Some(redlock_core::deadpool_redis::redis::Value::Int(1))
            )
        })
    };
    assert!(cluster.wait_until(timing::settled(), |_| subscribed("wa") && subscribed("wb")));
    let released = Instant::now();
    holder.unlock(lock).await.unwrap();
    let a = one.await.unwrap().unwrap();
    let s = set.await.unwrap().unwrap();
    let waited = released.elapsed();
    assert!(
        waited < woken_within(),
        "woken {waited:?} after the release"
    );
    assert_eq!(s.resources(), ["wb", "wc"]);
    waiter.unlock(a).await.unwrap();
    waiter.unlock(s).await.unwrap();
}

/// A set's waiter flags its keys before each attempt once subscribed, so the
/// release of a single-key lock on one of them (which announces itself only
/// to flagged keys) wakes it long before its 5 s poll and the holder's 15 s
/// TTL; the waiter's own release deletes its flags wherever it held the set.
/// Where it did not (the holder's release of `fb` reached that node after the
/// waiter's winning attempt, which still took a quorum), the release deletes
/// nothing, so the flag of `fc` stays there until its TTL: another waiter may
/// rely on it, and a flag nobody needs costs a later release one `PUBLISH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_single_key_release_wakes_the_waiter_of_a_set() {
    let cluster = Cluster::start(3);
    let (holder, waiter, slow) = holder_waiter_and_slow_poll(&cluster).await;
    let lock = holder.mutex("fb").try_acquire(far()).await.unwrap();
    let set = tokio::spawn(async move {
        // A TTL past the waits below: when the set's last node does not
        // join it, the wait for every node runs its whole bound (10 s under
        // the default slack), and a 5 s TTL let the set expire before it
        // was counted (a full loaded run: "held on" fewer than two nodes).
        waiter
            .mutex_many(["fc", "fb"])?
            .acquire_with(far(), &slow)
            .await
            .map(|l| (l, waiter))
    });
    // Subscribed, and its keys flagged on a quorum of nodes. Not on every
    // node: where the holder's `SET` of `fb` straggled in after the waiter's
    // first attempt (the holder's lock was decided at quorum), that attempt
    // took the set there, and its clean-up release deleted the keys and
    // their flags (seen once under load: no flag on one node, both on the
    // others). The nodes that refused the attempt are a quorum, and their
    // announcements alone wake the waiter.
    assert!(
        cluster.wait_until(timing::settled(), |c| c
            .nodes()
            .iter()
            .filter(|n| {
                n.pttl("{fb}:redlock-waiters") > 0 && n.pttl("{fc}:redlock-waiters") > 0
            })
            .count()
            >= 2),
        "the waiter never flagged its keys on a quorum: PTTLs of the flags and \
         whether the holder's fb is there {:?}, waiter done: {}",
        cluster
            .nodes()
            .iter()
            .map(|n| (
                n.pttl("{fb}:redlock-waiters"),
                n.pttl("{fc}:redlock-waiters"),
                n.get("fb").is_some()
            ))
            .collect::<Vec<_>>(),
        set.is_finished()
    );
    let released = Instant::now();
    holder.unlock(lock).await.unwrap();
    let (s, waiter) = set.await.unwrap().unwrap();
    let waited = released.elapsed();
    assert!(
        waited < woken_within(),
        "woken {waited:?} after the release"
    );
    assert_eq!(s.resources(), ["fb", "fc"]);
    // The nodes where the set was taken: both keys hold its token there
    // (the waiter's last node may answer after the quorum: wait for it, up
    // to when it must have answered).
    let held_on = |c: &Cluster| -> Vec<bool> {
        c.nodes()
            .iter()
            .map(|n| {
                n.get("fb").as_deref() == Some(s.token())
                    && n.get("fc").as_deref() == Some(s.token())
            })
            .collect()
    };
    cluster.wait_until(timing::settled(), |c| held_on(c).iter().all(|h| *h));
    let held = held_on(&cluster);
    assert!(held.iter().filter(|h| **h).count() >= 2, "held on {held:?}");
    eprintln!("the set was taken on nodes {held:?}");
    waiter.unlock(s).await.unwrap();
    // Only the flag of `fc` may stay, and only on a node where the set was not
    // taken (with its TTL, so it goes by itself).
    let may_stay = |i: usize, k: &str| !held[i] && k == "{fc}:redlock-waiters";
    assert!(
        cluster.wait_until(timing::settled(), |c| c.nodes().iter().enumerate().all(
            |(i, n)| n
                .keys()
                .iter()
                .all(|k| !k.starts_with('f') || (may_stay(i, k) && n.pttl(k) > 0))
        )),
        "keys left: {:?}, the set held on {held:?}",
        cluster.nodes().iter().map(|n| n.keys()).collect::<Vec<_>>()
    );
}
