//! Waiting by wake-up (issue 13) on real `redis-server` processes: mutual
//! exclusion when most clients wait, a release waking a waiter long before its
//! poll would, the fallbacks for what no message announces (expiry, a silent
//! delete), a clean-up heard on too few nodes waking nobody, first come first
//! served among the waiters of one process, waiters that give up without
//! blocking the next, a node killed and restarted while a waiter waits, a
//! renewed local holder keeping its waiters queued, releases kept to their
//! database, the pub/sub connection idle without waiters and replaced when
//! it dies without a word, and a releaser leaving the next turn to another
//! handle's waiter it woke.

use std::time::Duration;

use redlock_core::RetryPolicy;
use redlock_core::deadpool_redis::redis;
use redlock_tests::{Cluster, timing};

mod channels;
mod handoff;
mod named;
mod queue;
mod wake;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A policy whose polling alone would be far too slow for these tests: only a
/// wake-up (or the PTTL fallback) can make them pass.
fn slow_poll(deadline: Duration) -> RetryPolicy {
    RetryPolicy::deadline(deadline)
        .with_delay(Duration::from_secs(5))
        .with_jitter(Duration::ZERO)
}

/// How soon a waiter handed the lock by a wake-up (or by a fallback, after
/// the event it waits for) must hold it, with patient handles
/// ([`Cluster::patient_redlock`], for tests whose premise is that every node
/// answered every call): a release announced and an attempt made, each one
/// node round at most ([`timing::liveness`] of two node timeouts).
fn woken_within() -> Duration {
    timing::liveness(2 * timing::PATIENT_NODE_TIMEOUT)
}

/// Far beyond [`woken_within`]: a holder's TTL, a poll delay or a deadline
/// that cannot be what served a waiter within that bound, so that a wake-up
/// is told from a poll or an expiry by the clock whatever the load.
fn far() -> Duration {
    4 * woken_within()
}

/// A policy that does not poll within [`far`]: only a wake-up (or the PTTL
/// fallback) can serve its waiter.
fn never_polls() -> RetryPolicy {
    RetryPolicy::deadline(2 * far())
        .with_delay(far())
        .with_jitter(Duration::ZERO)
}

/// Spawns `waiter` (a `lock_with` of one handle) after polling it once here:
/// a waiter joins its handle's local queue in its first poll, so waiters
/// spawned one after the other are queued in that order, without a sleep
/// betting that the scheduler ran each before the next.
///
/// # Panics
/// When the first poll already finished it: the waiter did not wait.
fn spawn_queued<F>(waiter: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    use futures_util::FutureExt;
    let mut waiter = Box::pin(waiter);
    assert!(
        (&mut waiter).now_or_never().is_none(),
        "the waiter did not wait"
    );
    tokio::spawn(waiter)
}

/// The channel of `key`'s releases in database 0.
fn channel(key: &str) -> String {
    format!("redlock:released:0:{{{key}}}")
}

/// How many connections of `node` are subscribed to `key`'s channel.
fn subscribers(cluster: &Cluster, node: usize, key: &str) -> i64 {
    let reply: Vec<redis::Value> = cluster
        .node(node)
        .raw(&["PUBSUB", "NUMSUB", &channel(key)])
        .unwrap_or_default();
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        _ => -1,
    }
}

/// Waits until `token` holds `key` on a quorum of the nodes (what an
/// acquire promises once it returned).
fn held_on_quorum(cluster: &Cluster, key: &str, token: &str) {
    assert!(
        cluster.wait_until(timing::settled(), |c| c
            .nodes()
            .iter()
            .filter(|n| n.get(key).as_deref() == Some(token))
            .count()
            > c.len() / 2),
        "the holder does not hold a quorum"
    );
}

/// Waits until `token` holds `key` on every node: an acquire returns once a
/// quorum answered, and the last node's `SET` may still be on its way (it
/// then joins the lock).
fn held_everywhere(cluster: &Cluster, key: &str, token: &str) {
    assert!(
        cluster.wait_until(timing::settled(), |c| c
            .nodes()
            .iter()
            .all(|n| n.get(key).as_deref() == Some(token))),
        "the holder does not hold every node"
    );
}

/// How many acquire attempts (`SET NX` pipelines) `node` has run, counted by
/// their `TYPE`, which nothing else sends: on a node with `SET … IFEQ` the
/// renewals are `SET`s too.
fn set_calls(cluster: &Cluster, node: usize) -> u64 {
    calls(cluster, node, "type")
}

/// How many times `node` has run `command` (lower case), by `INFO commandstats`.
fn calls(cluster: &Cluster, node: usize, command: &str) -> u64 {
    let info: String = cluster
        .node(node)
        .raw(&["INFO", "commandstats"])
        .unwrap_or_default();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
