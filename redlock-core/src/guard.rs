//! A lock held with auto-extension, and the signal that tells its holder when it
//! is lost.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::LockOptions;
use crate::error::Error;
use crate::redlock::{Lock, Redlock};

/// State shared between a [`LockGuard`], its [`LockHandle`]s and its renewal task.
struct Shared {
    resource: Arc<str>,
    key: Arc<str>,
    token: Arc<str>,
    /// The instant every deadline below is counted from.
    epoch: Instant,
    /// The validity deadline, in nanoseconds after `epoch`.
    valid_until_ns: AtomicU64,
    extensions: AtomicU32,
    lost: CancellationToken,
}

impl Shared {
    fn set_valid_until(&self, at: Instant) {
        let ns =
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.valid_until_ns.store(ns, Ordering::Release);
    }

    fn valid_until(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.valid_until_ns.load(Ordering::Acquire))
    }
}

/// A cheap, clonable view of a held lock, for the code that runs under it.
///
/// It tells the key, the token, the validity left, and whether the lock was lost.
/// Web adapters put one in the request extensions.
#[derive(Clone)]
pub struct LockHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockHandle")
            .field("resource", &self.shared.resource)
            .field("key", &self.shared.key)
            .field("remaining", &self.remaining())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockHandle {
    /// The resource name.
    pub fn resource(&self) -> &str {
        &self.shared.resource
    }

    /// The Redis key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// This holder's token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The validity left: zero once lost or expired.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.shared
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// When the current validity ends.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// How many times the lock has been extended.
    pub fn extensions(&self) -> u32 {
        self.shared.extensions.load(Ordering::Relaxed)
    }

    /// Whether the lock was lost: a renewal found it gone, or its validity ran out
    /// before a renewal could succeed. Once true, another client may hold it.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Completes when the lock is lost. Never completes while it is held; after
    /// release it completes only if the lock had been lost before.
    pub async fn lost(&self) {
        self.shared.lost.cancelled().await;
    }

    /// An owned future of [`LockHandle::lost`], for `select!` loops that outlive a
    /// borrow.
    pub fn lost_owned(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.shared.lost.clone().cancelled_owned()
    }
}

/// A lock held with auto-extension.
///
/// A background task renews the keys before the validity runs low, by the
/// validity left rather than on a fixed tick. It stops at [`LockGuard::release`],
/// at drop, or once [`LockOptions::max_hold`] has passed. If a renewal finds the
/// lock gone, or the validity ends first, [`LockGuard::lost`] completes.
///
/// Drop never blocks: it signals the task, which finishes any renewal in flight and
/// then releases the keys. Outside a Tokio runtime nothing runs and the keys expire
/// with their TTL.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::{LockOptions, Redlock};
///
/// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
/// let guard = redlock.lock_guard("report:daily", &LockOptions::new(Duration::from_secs(2))).await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lock lost, stopping"),
///     _ = tokio::time::sleep(Duration::from_secs(10)) => {}, // work longer than the TTL
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct LockGuard {
    handle: LockHandle,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<usize, Error>>>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("handle", &self.handle)
            .finish()
    }
}

impl LockGuard {
    /// Starts auto-extension of `lock` with `options`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] outside a Tokio runtime (the renewal task needs one).
    pub fn new(lock: Lock, options: &LockOptions) -> Result<Self, Error> {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidConfig("LockGuard needs a Tokio runtime for its renewal task".into())
        })?;
        let shared = Arc::new(Shared {
            resource: Arc::clone(lock.shared_resource()),
            key: Arc::clone(lock.shared_key()),
            token: Arc::clone(lock.shared_token()),
            epoch: lock.started_at(),
            valid_until_ns: AtomicU64::new(0),
            extensions: AtomicU32::new(0),
            lost: CancellationToken::new(),
        });
        shared.set_valid_until(lock.valid_until());
        let stop = CancellationToken::new();
        let task = rt.spawn(keep_alive(
            lock,
            Arc::clone(&shared),
            stop.clone(),
            options.clone(),
        ));
        Ok(Self {
            handle: LockHandle { shared },
            stop,
            task: Some(task),
        })
    }

    /// A clonable view of the lock for the code that runs under it.
    pub fn handle(&self) -> LockHandle {
        self.handle.clone()
    }

    /// The resource name.
    pub fn resource(&self) -> &str {
        self.handle.resource()
    }

    /// The validity left.
    pub fn remaining(&self) -> Duration {
        self.handle.remaining()
    }

    /// Whether the lock was lost.
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// Completes when the lock is lost.
    pub async fn lost(&self) {
        self.handle.lost().await;
    }

    /// Stops renewal, waits for a renewal in flight, then releases on every node.
    /// Returns how many keys were deleted.
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when a node failed (its key expires by TTL).
    pub async fn release(mut self) -> Result<usize, Error> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => task.await.unwrap_or_else(|_| {
                Err(Error::Lost {
                    resource: Arc::clone(&self.handle.shared.resource),
                })
            }),
            None => Ok(0),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // The renewal task sees this, finishes any renewal in flight, then releases
        // (spawned work: nothing here blocks).
        self.stop.cancel();
    }
}

/// How often a failing renewal is retried: a tenth of the last validity, but not
/// more often than every 10 ms.
fn renewal_retry_step(granted: Duration) -> Duration {
    (granted / 10).max(Duration::from_millis(10))
}

/// When to renew: once 40–60% of the last granted validity is left, at a random
/// point in that band, rounded down to a grid of 1/400 of the validity.
///
/// Locks taken together (a burst of requests, a batch job) would otherwise renew
/// together forever, each renewal one burst of concurrent calls to every node,
/// whose peak memory stays with the process. The jitter spreads them out; the
/// grid makes the renewals that fall close together fire in the same timer tick,
/// so they still share the node connections' writes and reads.
fn renew_point(valid_until: Instant, granted: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let left = granted.mul_f64(rand::rng().random_range(0.4..=0.6));
    let at = valid_until.checked_sub(left).unwrap_or(valid_until);
    let epoch = *EPOCH.get_or_init(Instant::now);
    let grid = (granted / 400).max(Duration::from_millis(1)).as_nanos();
    let since = at.saturating_duration_since(epoch).as_nanos();
    let snapped = u64::try_from(since - since % grid).unwrap_or(u64::MAX);
    (epoch + Duration::from_nanos(snapped)).min(at)
}

/// The auto-extension loop. It renews when about half of the last granted
/// validity is left (see [`renew_point`]), retries failed renewals until the validity ends, and signals loss. It
/// owns the [`Lock`], so a release always comes after the last renewal.
async fn keep_alive(
    mut lock: Lock,
    shared: Arc<Shared>,
    stop: CancellationToken,
    options: LockOptions,
) -> Result<usize, Error> {
    let hold_until = options.max_hold.map(|m| lock.started_at() + m);
    let mut granted = lock.remaining();
    let mut renew_at = renew_point(lock.valid_until(), granted);
    let min_ttl = lock.redlock().node_timeout() * 2;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(renew_at.into()) => {}
        }
        let now = Instant::now();
        if now >= lock.valid_until() {
            tracing::warn!(
                resource = lock.resource(),
                "lock validity ran out before a renewal succeeded"
            );
            shared.lost.cancel();
            break;
        }
        let ttl = match hold_until {
            None => options.ttl,
            Some(until) => {
                let left = until.saturating_duration_since(now);
                if left < min_ttl {
                    // max_hold reached: stop renewing, tell the holder when the
                    // validity it has runs out.
                    renew_at = lock.valid_until();
                    continue;
                }
                options.ttl.min(left)
            }
        };
        let deadline = lock.valid_until();
        let outcome = tokio::select! {
            r = lock.extend(ttl) => Some(r),
            _ = tokio::time::sleep_until(deadline.into()) => None,
        };
        match outcome {
            Some(Ok(())) => {
                shared.set_valid_until(lock.valid_until());
                shared
                    .extensions
                    .store(lock.extensions(), Ordering::Relaxed);
                granted = lock.remaining();
                renew_at = renew_point(lock.valid_until(), granted);
            }
            Some(Err(e @ (Error::NoQuorum { .. } | Error::Expired { .. })))
                if Instant::now() < lock.valid_until() =>
            {
                tracing::debug!(resource = lock.resource(), error = %e, "renewal failed, retrying");
                renew_at = (Instant::now() + renewal_retry_step(granted)).min(lock.valid_until());
            }
            Some(Err(e @ Error::ExtensionLimit { .. })) => {
                tracing::debug!(resource = lock.resource(), error = %e, "no more renewals");
                renew_at = lock.valid_until();
            }
            Some(Err(e)) => {
                tracing::warn!(resource = lock.resource(), error = %e, "lock lost");
                shared.lost.cancel();
                break;
            }
            None => {
                tracing::warn!(
                    resource = lock.resource(),
                    "lock validity ran out during a renewal"
                );
                shared.lost.cancel();
                break;
            }
        }
    }
    lock.unlock().await
}

impl Redlock {
    /// Takes the lock (retrying per `options` or the handle's policy) and holds it
    /// with auto-extension until the guard is released or dropped.
    ///
    /// # Errors
    /// See [`Redlock::lock`].
    pub async fn lock_guard(
        &self,
        resource: &str,
        options: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let retry = options.retry.as_ref().unwrap_or(self.retry_policy());
        let lock = self.lock_with(resource, options.ttl, retry).await?;
        LockGuard::new(lock, options)
    }

    /// Runs the future `f` makes while holding the lock, with auto-extension. If the
    /// lock is lost, the future is dropped at its next await point and
    /// [`Error::Lost`] is returned. The lock is released when the work ends.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{LockOptions, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
    /// let total = redlock
    ///     .with_lock("tenant:7", &LockOptions::new(Duration::from_secs(1)), |lock| async move {
    ///         // lock.remaining(), lock.is_lost() are there if the work wants them
    ///         tokio::time::sleep(Duration::from_secs(3)).await; // renewed meanwhile
    ///         42
    ///     })
    ///     .await?;
    /// assert_eq!(total, 42);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// An acquire error (see [`Redlock::lock`]) or [`Error::Lost`].
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        options: &LockOptions,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock_guard(resource, options).await?;
        let work = f(guard.handle());
        let outcome = tokio::select! {
            biased;
            () = guard.lost() => None,
            v = work => Some(v),
        };
        let resource: Arc<str> = Arc::clone(&guard.handle.shared.resource);
        if let Err(e) = guard.release().await {
            tracing::debug!(resource = %resource, error = %e, "release after with_lock");
        }
        outcome.ok_or(Error::Lost { resource })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_fall_in_the_band_and_on_the_grid() {
        let now = Instant::now();
        for granted_ms in [10u64, 300, 1_000, 10_000, 60_000] {
            let granted = Duration::from_millis(granted_ms);
            let valid_until = now + granted;
            let grid = (granted / 400).max(Duration::from_millis(1));
            let mut seen = std::collections::HashSet::new();
            for _ in 0..500 {
                let at = renew_point(valid_until, granted);
                let left = valid_until - at;
                assert!(
                    left >= granted.mul_f64(0.4),
                    "{granted:?}: only {left:?} left"
                );
                assert!(
                    left <= granted.mul_f64(0.6) + grid,
                    "{granted:?}: {left:?} left is too early"
                );
                seen.insert(at);
            }
            // Jittered, yet snapped: many different points, but no more than the
            // grid allows across a band of 20% of the validity.
            let slots = (granted.as_nanos() / 5 / grid.as_nanos()) as usize + 2;
            assert!(seen.len() > 1, "{granted:?}: no jitter");
            assert!(seen.len() <= slots, "{granted:?}: {} points", seen.len());
        }
    }
}
