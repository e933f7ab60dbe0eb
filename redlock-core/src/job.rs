//! Scheduled jobs that run once per tick across replicas ([`Redlock::run_job`]),
//! after ShedLock's `lockAtLeastFor` / `lockAtMostFor`.
//!
//! Every replica's timer fires for the same tick, a little apart (timer skew,
//! GC, a busy host). The first to take the job's lock runs it; the others find
//! the key busy and skip. A job that ends sooner than the skew would free the
//! key before a late replica looks, so the key is kept for at least a minimum
//! hold ([`JobOptions::at_least`], see [`LockGuard::release_at_least`]), and
//! for at most a maximum ([`JobOptions::at_most`], the guard's
//! [`LockOptions::max_hold`]).

use std::time::Duration;

use crate::error::Error;
use crate::guard::{LockHandle, run_guarded_at_least};
use crate::redlock::Redlock;
use crate::settings::{LockOptions, RetryPolicy};

/// Options of a scheduled job ([`Redlock::run_job`]).
///
/// The rule that makes a job run once per tick: the minimum hold must be
/// longer than the timer skew between replicas plus the [`wait`](Self::wait)
/// (a replica that fires `skew` late and tries for `wait` must still find the
/// key), and shorter than the period between ticks (the next tick must find
/// it gone).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct JobOptions {
    ttl: Duration,
    at_least: Duration,
    at_most: Option<Duration>,
    wait: Option<Duration>,
}

impl JobOptions {
    /// A job whose lock has keys of this TTL, renewed while it runs: how long
    /// the job's key outlives a replica that dies running it. The keys live at
    /// least [`at_least`](Self::at_least) from the start whatever the TTL (the
    /// lock is taken with the longer of the two).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            at_least: Duration::ZERO,
            at_most: None,
            wait: None,
        }
    }

    /// Keeps the job's key at least this long from the start of the acquire,
    /// even when the job ends sooner (ShedLock's `lockAtLeastFor`). Zero by
    /// default: the key is released when the job ends.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = at_least;
        self
    }

    /// Holds the job's lock at most this long (ShedLock's `lockAtMostFor`):
    /// the job is dropped then and the lock released
    /// ([`LockOptions::max_hold`]). No cap by default; not shorter than
    /// [`at_least`](Self::at_least).
    pub fn at_most(mut self, at_most: Duration) -> Self {
        self.at_most = Some(at_most);
        self
    }

    /// How long a replica keeps trying when its attempts are split with
    /// another replica's (both fired in the same instant, neither took a
    /// quorum). Default: a quarter of the minimum hold, at most one second.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The guard's options: the TTL (at least the minimum hold), the cap, and
    /// a short retry that ends well before the minimum hold does.
    fn lock_options(&self) -> LockOptions {
        let wait = self
            .wait
            .unwrap_or_else(|| (self.at_least / 4).min(Duration::from_secs(1)));
        let step = (wait / 5).max(Duration::from_millis(1));
        let retry = if wait.is_zero() {
            RetryPolicy::no_retry()
        } else {
            RetryPolicy::deadline(wait)
                .with_delay(step)
                .with_jitter(step)
        };
        let options = LockOptions::new(self.ttl.max(self.at_least)).retry(retry);
        match self.at_most {
            Some(cap) => options.max_hold(cap),
            None => options,
        }
    }
}

/// [`Redlock::run_job`].
pub(crate) async fn run_job<F, Fut, T>(
    redlock: &Redlock,
    job: &str,
    options: &JobOptions,
    f: F,
) -> Result<Option<T>, Error>
where
    F: FnOnce(LockHandle) -> Fut,
    Fut: Future<Output = T>,
{
    if let Some(cap) = options.at_most
        && cap < options.at_least
    {
        return Err(Error::InvalidConfig(format!(
            "a job's at_most ({cap:?}) is shorter than its at_least ({:?})",
            options.at_least
        )));
    }
    let guard = match redlock.mutex(job).guard(&options.lock_options()).await {
        Ok(guard) => guard,
        Err(Error::Busy { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    run_guarded_at_least(guard, options.at_least, f)
        .await
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_lives_at_least_the_minimum_and_waits_less() {
        let s = Duration::from_secs(1);
        let o = JobOptions::new(s).at_least(s * 10).lock_options();
        assert_eq!(o.ttl, s * 10);
        let wait = o.retry.and_then(|r| r.overall_deadline());
        assert_eq!(wait, Some(s));
        let o = JobOptions::new(s * 30).at_least(s * 2).lock_options();
        assert_eq!(o.ttl, s * 30);
        assert_eq!(o.retry.and_then(|r| r.overall_deadline()), Some(s / 2));
        // No minimum: one attempt.
        let o = JobOptions::new(s).lock_options();
        assert_eq!(o.retry.map(|r| r.max_attempts()), Some(1));
        assert_eq!(o.max_hold, None);
        let o = JobOptions::new(s).at_most(s * 5).lock_options();
        assert_eq!(o.max_hold, Some(s * 5));
    }
}
