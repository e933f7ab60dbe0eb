//! The end of a guarded lock that keeps its keys until an instant instead of
//! releasing them (`LockGuard::release_at_least`, and a dropped job's guard
//! through the schedule): a compare-and-pexpire on every node, no release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, NodeError};
use crate::node::{Call, EXTEND, parse_flag};
use crate::protocol::lock::Lock;
use crate::protocol::release::Released;

/// How a guarded lock ended under [`LockGuard::release_at_least`](crate::LockGuard::release_at_least).
#[derive(Debug)]
#[non_exhaustive]
pub enum Ended {
    /// The minimum hold had passed: the keys were released as by
    /// [`LockGuard::release`](crate::LockGuard::release).
    Released(Released),
    /// The keys were set to expire at the end of the minimum hold, on
    /// `nodes` nodes (the others no longer held them, or failed; a quorum
    /// answered).
    Kept {
        /// When the minimum hold ends, on this process's monotonic clock.
        until: Instant,
        /// How many nodes shortened the keys to it.
        nodes: usize,
    },
}

/// Sets `lock`'s keys to expire in `left` (rounded up to the millisecond) on
/// every node where they still hold its token, and ends the lock without a
/// release.
pub(super) async fn keep_until(
    mut lock: Lock,
    left: Duration,
    until: Instant,
) -> Result<Ended, Error> {
    let redlock = lock.redlock().clone();
    // Counted out of the metrics' hold, and the late answers told that the
    // lock is ending (they are released where they land).
    lock.abandon();
    let ms = left.as_millis().saturating_add(1).to_string();
    let call = Arc::new(match &lock.many {
        None => Call::script(
            &EXTEND,
            Arc::clone(&lock.key),
            vec![lock.token.to_string(), ms],
        ),
        Some(many) => Call::extend_many(many, &lock.token, left.as_millis().saturating_add(1)),
    });
    let n = redlock.inner.nodes.len();
    let mut pending = redlock.fan_out(&call, parse_flag, 0..n);
    let settled = redlock.settle(&mut pending, |_| false).await;
    // No release follows: the keys expire at `until` by themselves. The task
    // that drives an acquire answer still on its way is told so, instead of
    // waiting for a release never sent (it holds the handle). A node whose
    // keep shortened this lock's key had its `SET` before the keep: its key
    // stays until `until`. Elsewhere a late key, which the keep may have
    // missed, is released where it lands (the nodes that decided the
    // acquire are a quorum without it).
    if let Some(late) = &lock.late {
        late.release_answers(&settled);
        late.release_never_sent();
    }
    lock.released = true;
    // The local waiters' queue moves on: the next one finds the key busy and
    // waits for its expiry.
    redlock.inner.waiting.queues.release(&lock.key, &lock.token);
    let kept = settled
        .iter()
        .flatten()
        .filter(|s| matches!(s.result, Ok(true)))
        .count();
    let failed = settled
        .iter()
        .flatten()
        .filter(|s| matches!(s.result, Err(ref e) if !matches!(e, NodeError::WrongType { .. })))
        .count();
    if n - failed < redlock.inner.quorum {
        return Err(Error::ReleaseIncomplete {
            resource: Arc::clone(&lock.resource),
            deleted: 0,
            report: redlock.report(&settled, |&b| {
                if b {
                    crate::error::NodeStatus::Ok
                } else {
                    crate::error::NodeStatus::NotHeld
                }
            }),
        });
    }
    Ok(Ended::Kept { until, nodes: kept })
}
