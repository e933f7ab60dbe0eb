//! "At least": a guarded lock that ends before a minimum hold keeps its keys
//! until that minimum has passed, so that a replica whose timer fires a
//! little later finds the job's key still there and skips the tick
//! (ShedLock's `lockAtLeastFor`).
//!
//! The end is a compare-and-pexpire to what is left of the minimum (measured
//! on the monotonic clock from the start of the acquire), not a delete: the
//! keys then expire on their own at the end of the minimum. Past the
//! minimum, the end is the usual release (compare-and-delete, which wakes
//! the waiters).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, NodeError};
use crate::guard::schedule::Handback;
use crate::guard::{LockGuard, LockHandle, Watched};
use crate::node::{Call, EXTEND, parse_flag};
use crate::protocol::lock::Lock;
use crate::protocol::release::Released;

/// How a guarded lock ended under [`LockGuard::release_at_least`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Ended {
    /// The minimum hold had passed: the keys were released as by
    /// [`LockGuard::release`].
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

impl LockGuard {
    /// Ends the hold but keeps the keys until `at_least` after the start of
    /// the acquire that took the lock: before then the keys are set to expire
    /// at that instant (compare-and-pexpire, only where they still hold this
    /// lock's token) instead of being deleted; from then on this is
    /// [`LockGuard::release`].
    ///
    /// Renewal stops first, as for [`LockGuard::release`], and the handles say
    /// "not held" from the call on. The keys cannot outlive `at_least` by more
    /// than a millisecond (the expiry is rounded up), nor the TTL they had.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{LockOptions, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
    /// let guard = redlock.lock_guard("report:daily", &LockOptions::new(Duration::from_secs(60))).await?;
    /// // ... a job that may take a second or ten minutes ...
    /// // Another replica firing up to 30 s later still finds the key:
    /// guard.release_at_least(Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Lost`] when the lock was lost before the call;
    /// [`Error::ReleaseIncomplete`] when too few nodes confirmed (the keys then
    /// expire with their TTL); see [`LockGuard::release`] past the minimum.
    pub async fn release_at_least(mut self, at_least: Duration) -> Result<Ended, Error> {
        let until = self.handle.shared.epoch.checked_add(at_least);
        self.handle.shared.give_up();
        let resource = Arc::clone(&self.handle.shared.resource);
        let lost = || Error::Lost {
            resource: Arc::clone(&resource),
        };
        let Some(ticket) = self.ticket.take() else {
            return Err(lost());
        };
        let lock = match ticket.release().await {
            Some(Handback::Lock(lock)) => *lock,
            Some(Handback::Releasing(release)) => {
                // Lost before the call: its release is under way.
                let _ = release.await;
                return Err(lost());
            }
            None => return Err(lost()),
        };
        let now = Instant::now();
        // `None`: a minimum past the end of time keeps the keys their TTL.
        let left = until.map_or(lock.ttl, |u| u.saturating_duration_since(now));
        if left < Duration::from_millis(1) {
            return lock.unlock().await.map(Ended::Released);
        }
        let until = until.or_else(|| now.checked_add(left)).unwrap_or(now);
        keep_until(lock, left, until).await
    }
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
    // No release follows: the keys expire at `until` by themselves. An
    // acquire answer still on its way is told so: a late key is released
    // where it lands (the kept keys are a quorum without it), and the task
    // that drives it ends instead of waiting for a release never sent.
    if let Some(late) = &lock.late {
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

/// [`super::run_guarded`] for a job with a minimum hold: the work under
/// `guard`, never polled once the lock is lost; when it ends the lock is
/// ended with [`LockGuard::release_at_least`].
pub(crate) async fn run_guarded_at_least<F, Fut, T>(
    guard: LockGuard,
    at_least: Duration,
    f: F,
) -> Result<T, Error>
where
    F: FnOnce(LockHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let mut guard = guard;
    // Dropped before its end (the caller's future cancelled, or the job
    // panicked), the lock keeps its keys to the minimum too.
    guard.keep_on_drop = guard.handle.shared.epoch.checked_add(at_least);
    let handle = guard.handle();
    let outcome = Watched {
        work: f(guard.handle()),
        lost: handle.lost(),
    }
    .await
    .filter(|_| !handle.is_lost());
    let resource: Arc<str> = Arc::clone(&handle.shared.resource);
    if let Err(e) = guard.release_at_least(at_least).await {
        tracing::debug!(resource = %resource, error = %e, "end of a job's lock");
    }
    outcome.ok_or(Error::Lost { resource })
}
