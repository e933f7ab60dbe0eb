//! Waiting by wake-up (issue 13) on real `redis-server` processes: mutual
//! exclusion when most clients wait, a release waking a waiter long before its
//! poll would, the fallbacks for what no message announces (expiry, a silent
//! delete), a clean-up heard on too few nodes waking nobody, first come first
//! served among the waiters of one process, waiters that give up without
//! blocking the next, a node killed and restarted while a waiter waits, a
//! renewed local holder keeping its waiters queued, releases kept to their
//! database, and the pub/sub connection idle without waiters and replaced
//! when it dies without a word.

use std::time::Duration;

use redlock_core::deadpool_redis::redis;
use redlock_core::{Redlock, RetryPolicy};
use redlock_tests::{Cluster, timing};

mod channels;
mod queue;
mod wake;

/// How soon a woken waiter must hold the lock. Where a test uses it, the
/// waiter could otherwise be served only by the holder's expiry or by its
/// poll, 10 s or more away, so the bound can be generous for a loaded 2-core
/// machine (it was 100 ms).
const SOON: Duration = Duration::from_secs(2);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(100))
        .build()
        .unwrap()
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
