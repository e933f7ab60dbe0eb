//! A release names the waiter that goes next (issue 48, item 7): each mutex
//! waiter writes its name in the key's waiters flag before each attempt,
//! the release announces the flag's value, and only the waiter it names
//! tries at once; the others leave it the turn, and try again at the next
//! release or after a poll delay of their policy. At a bare quorum, waiters
//! that all tried on the same release split the votes, and nobody held.

use std::time::{Duration, Instant};

use redlock_core::RetryPolicy;
use redlock_tests::util::eventually;
use redlock_tests::{Cluster, timing};

use super::channels::flag;
use super::*;

/// The waiter name each node's flag of `key` holds (`w` and 16 hex digits;
/// an attempt's flag adds `:` and its token), if every node holds the same.
fn named_everywhere(cluster: &Cluster, key: &str) -> Option<String> {
    let names: Vec<Option<String>> = cluster
        .nodes()
        .iter()
        .map(|n| {
            n.get(&flag(key))
                .and_then(|v| v.get(..17).map(str::to_owned))
        })
        .collect();
    match names.first() {
        Some(Some(first)) if names.iter().all(|n| n.as_deref() == Some(first)) => {
            Some(first.clone())
        }
        _ => None,
    }
}

/// Waits until every node's flag of `key` names the same waiter, other than
/// `not`, and returns that name: the latest waiter to flag has done so on
/// every node.
async fn until_named(cluster: &Cluster, key: &str, not: Option<&str>) -> String {
    let mut name = None;
    let named = eventually(timing::settled(), || {
        name = named_everywhere(cluster, key).filter(|n| Some(n.as_str()) != not);
        name.is_some()
    })
    .await;
    assert!(named, "no waiter named on every node of {key}");
    let name = name.unwrap_or_default();
    assert!(name.starts_with('w') && name.len() == 17, "{name}");
    name
}

/// A policy that waits by wake-up only (it does not poll within the
/// test), with some jitter (without jitter, nobody defers to a name).
fn wakes_only() -> RetryPolicy {
    RetryPolicy::deadline(2 * far())
        .with_delay(far())
        .with_jitter(ms(100))
}

/// Waits until every node has run `want` acquire attempts (`TYPE`s)
/// since `base`: each attempt has been answered.
async fn until_attempts(cluster: &Cluster, base: &[u64], want: u64) {
    let done = eventually(timing::settled(), || {
        (0..cluster.len()).all(|n| set_calls(cluster, n) >= base[n] + want)
    })
    .await;
    assert!(done, "the waiters did not make their {want} attempts");
}

/// Two waiters of other handles wait; the first to flag the key is named
/// on every node (a waiter's attempt writes its name only where the flag
/// is not there yet). The release hands it the lock: it holds while the
/// second, which defers to it until the next release or its poll (far
/// off), has not. Before names, both tried on the same release, and either
/// could hold first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_hands_the_mutex_to_the_waiter_it_names() {
    let cluster = Cluster::start(3);
    let (h, w1, w2) = (
        cluster.patient_redlock(),
        cluster.patient_redlock(),
        cluster.patient_redlock(),
    );
    let key = "named:mutex";
    let held = h.mutex(key).try_acquire(far()).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let base: Vec<u64> = (0..cluster.len()).map(|n| set_calls(&cluster, n)).collect();
    let policy = wakes_only();
    let first = {
        let policy = policy.clone();
        tokio::spawn(async move {
            let lock = w1.mutex(key).acquire_with(far(), &policy).await;
            (lock, w1)
        })
    };
    // Each waiter's first attempt, then the one after it subscribed, which
    // flags.
    until_attempts(&cluster, &base, 2).await;
    let n1 = until_named(&cluster, key, None).await;
    let second = tokio::spawn(async move {
        let lock = w2.mutex(key).acquire_with(far(), &policy).await;
        (lock, w2)
    });
    until_attempts(&cluster, &base, 4).await;
    assert_eq!(
        named_everywhere(&cluster, key).as_deref(),
        Some(n1.as_str()),
        "the second waiter's attempt took the name"
    );
    h.unlock(held).await.unwrap();
    let (lock, w1) = tokio::time::timeout(woken_within(), first)
        .await
        .expect("the named waiter was not handed the lock")
        .unwrap();
    let lock = lock.expect("the named waiter's acquire");
    assert!(
        !second.is_finished(),
        "the waiter the release did not name held too (or gave up)"
    );
    second.abort();
    w1.unlock(lock).await.unwrap();
}

/// The named waiter is gone (the flag names a waiter that no longer waits):
/// the waiter that is left holds after its poll delay at the earliest, and
/// within a poll and a wake-up. Before names, it tried at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_gone_named_waiter_costs_the_others_one_spread() {
    let cluster = Cluster::start(3);
    let (h, w) = (cluster.patient_redlock(), cluster.patient_redlock());
    let key = "named:gone";
    let held = h.mutex(key).try_acquire(far()).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let (delay, jitter) = (Duration::from_secs(1), ms(500));
    let policy = RetryPolicy::deadline(far())
        .with_delay(delay)
        .with_jitter(jitter);
    let waiter = tokio::spawn(async move {
        let lock = w.mutex(key).acquire_with(far(), &policy).await;
        (Instant::now(), lock, w)
    });
    let mine = until_named(&cluster, key, None).await;
    // A waiter that left many turns, so that it is the one named.
    let gone = if mine == "w00000000000000ff" {
        "w00000000000000fe00000100"
    } else {
        "w00000000000000ff00000100"
    };
    for node in cluster.nodes() {
        let set: Option<String> = node
            .raw(&["SET", &flag(key), gone, "XX", "KEEPTTL"])
            .unwrap();
        assert_eq!(set.as_deref(), Some("OK"));
    }
    let released = Instant::now();
    h.unlock(held).await.unwrap();
    let (at, lock, w) = tokio::time::timeout(delay + jitter + woken_within(), waiter)
        .await
        .expect("the waiter left was not served within a poll and a wake-up")
        .unwrap();
    let lock = lock.expect("the waiter's acquire");
    let after = at.saturating_duration_since(released);
    assert!(
        after >= delay,
        "the waiter the release did not name held {after:?} after it, before its poll delay"
    );
    w.unlock(lock).await.unwrap();
}

/// A waiter's attempt that takes the lock takes its own name off the flag
/// (the flag then names nobody, `1`, until a waiter writes another), so the
/// holder's release never names the holder, who waits no more: naming it
/// left every woken waiter deferring to nobody until its poll. Before, the
/// waiter's name stayed, and its release announced it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_never_names_its_own_holder() {
    let cluster = Cluster::start(1);
    let (h, w) = (cluster.patient_redlock(), cluster.patient_redlock());
    let key = "named:own";
    let held = h.mutex(key).try_acquire(far()).await.unwrap();
    let waiter = tokio::spawn(async move {
        let lock = w.mutex(key).acquire_with(far(), &wakes_only()).await;
        (lock, w)
    });
    until_named(&cluster, key, None).await;
    h.unlock(held).await.unwrap();
    let (lock, w) = tokio::time::timeout(woken_within(), waiter)
        .await
        .expect("the named waiter was not handed the lock")
        .unwrap();
    let lock = lock.expect("the waiter's acquire");
    // One node: the attempt's whole pipeline ran before it returned.
    assert_eq!(
        cluster.node(0).get(&flag(key)).as_deref(),
        Some("1"),
        "the holder's name is still on the flag"
    );
    let client = redlock_core::deadpool_redis::redis::Client::open(cluster.urls()[0].clone())
        .expect("client");
    let mut conn = client.get_connection().expect("subscriber's connection");
    conn.set_read_timeout(Some(timing::settled()))
        .expect("read timeout");
    let mut sub = conn.as_pubsub();
    sub.subscribe(channel(key)).expect("SUBSCRIBE");
    w.unlock(lock).await.unwrap();
    let message = sub.get_message().expect("the release's announcement");
    let payload: String = message.get_payload().expect("payload");
    assert_eq!(payload, "1");
}
