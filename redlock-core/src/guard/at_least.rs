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

use crate::error::Error;
use crate::guard::keep::{Ended, keep_until};
use crate::guard::schedule::Handback;
use crate::guard::{LockGuard, LockHandle, Watched};

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
    /// let guard = redlock.mutex("report:daily").guard(&LockOptions::new(Duration::from_secs(60))).await?;
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
