//! A lock held with auto-extension, and the signal that tells its holder when it
//! is lost.
//!
//! The holder's view ([`LockHandle::is_lost`], [`LockHandle::remaining`],
//! [`LockHandle::lost`]) does not depend on the renewal task getting to run: it is
//! read off the local monotonic clock against the last validity the nodes
//! confirmed, less a safety margin. A renewal task that is starved (a blocked
//! thread, a busy current-thread runtime), that panics, or whose runtime shuts
//! down cannot leave the holder believing it still holds the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use rand::Rng;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::Error;
use crate::fencing::FencingToken;
use crate::lock::Lock;
use crate::redlock::Redlock;
use crate::release::Released;
use crate::settings::LockOptions;

/// State shared between a [`LockGuard`], its [`LockHandle`]s and its renewal task.
struct Shared {
    resource: Arc<str>,
    key: Arc<str>,
    token: Arc<str>,
    /// The instant every deadline below is counted from.
    epoch: Instant,
    /// The validity deadline the nodes confirmed, in nanoseconds after `epoch`.
    valid_until_ns: AtomicU64,
    /// How long before `valid_until` the holder is told the lock is lost.
    margin: Duration,
    /// Off only in the fault suite's negative control.
    check_deadline: bool,
    extensions: AtomicU32,
    fencing_token: Option<FencingToken>,
    /// Sticky: once cancelled, the lock stays lost for its holder even if a
    /// renewal that was in flight succeeds afterwards.
    lost: CancellationToken,
}

impl Shared {
    fn set_valid_until(&self, at: Instant) {
        let ns =
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.valid_until_ns.store(ns, Ordering::Release);
    }

    fn valid_until(&self) -> Instant {
        let ns = Duration::from_nanos(self.valid_until_ns.load(Ordering::Acquire));
        self.epoch.checked_add(ns).unwrap_or(self.epoch)
    }

    /// The instant from which the holder is told the lock is lost: the confirmed
    /// validity less the margin.
    fn deadline(&self) -> Instant {
        self.valid_until()
            .checked_sub(self.margin)
            .unwrap_or(self.epoch)
    }

    /// Lost if the renewal task said so, or if the clock passed the deadline,
    /// whether or not the renewal task has run since.
    fn is_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        if self.check_deadline && Instant::now() >= self.deadline() {
            self.lost.cancel();
            return true;
        }
        false
    }
}

/// A cheap, clonable view of a held lock, for the code that runs under it.
///
/// It tells the key, the token, the validity left, and whether the lock was lost.
/// Web adapters put one in the request extensions.
///
/// Every answer is computed from the local monotonic clock at the moment of the
/// call: [`is_lost`](Self::is_lost) turns true as soon as the clock reaches the
/// last validity the nodes confirmed less the loss margin
/// ([`LockOptions::loss_margin`]), even if the renewal task has not run (its
/// thread blocked, its runtime starved). Once true it stays true.
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

    /// The time left before the holder must stop: the confirmed validity less the
    /// loss margin, counted on the monotonic clock now. Zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.shared
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// When the validity the nodes last confirmed ends (without the loss
    /// margin). Not the holder's deadline: from `valid_until − loss_margin` on,
    /// the lock counts as lost, the renewal task may release it, and another
    /// client may then hold it before this instant. Code under the lock should
    /// ask [`is_lost`](Self::is_lost) or [`remaining`](Self::remaining).
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// The loss margin: how long before [`valid_until`](Self::valid_until) the
    /// holder is told the lock is lost.
    pub fn loss_margin(&self) -> Duration {
        self.shared.margin
    }

    /// How many times the lock has been extended.
    pub fn extensions(&self) -> u32 {
        self.shared.extensions.load(Ordering::Relaxed)
    }

    /// This holder's fencing token (see [`Lock::fencing_token`]); `None` when
    /// the handle was built without [`fencing`](crate::RedlockBuilder::fencing).
    /// Fixed for the life of the lock: renewals keep it.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.shared.fencing_token
    }

    /// Whether the lock was lost: a renewal found it gone, the renewal task
    /// stopped, or the clock reached the confirmed validity less the loss margin.
    /// Checked against the clock on every call. Once true, another client may
    /// hold the lock, and it stays true.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Completes when the lock is lost, at the latest when the clock reaches the
    /// confirmed validity less the loss margin (its own timer, not the renewal
    /// task's). Never completes while the lock is held; after a normal release it
    /// completes only if the lock had been lost before.
    pub fn lost(&self) -> LostFuture {
        LostFuture::new(Arc::clone(&self.shared))
    }

    /// The same future as [`LockHandle::lost`]: it owns what it needs, so it can
    /// outlive the handle (for `select!` loops).
    pub fn lost_owned(&self) -> LostFuture {
        self.lost()
    }
}

pin_project! {
    /// Completes when a lock is lost: when the renewal task signals it, or when
    /// the clock reaches the confirmed validity less the loss margin, whichever
    /// comes first. Every poll checks the clock first.
    pub struct LostFuture {
        shared: Arc<Shared>,
        #[pin]
        signal: WaitForCancellationFutureOwned,
        // Boxed so the future stays `Unpin`-agnostic and cheap to move before its
        // first poll; created at the first poll, inside the runtime.
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl std::fmt::Debug for LostFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostFuture")
            .field("resource", &self.shared.resource)
            .finish_non_exhaustive()
    }
}

impl LostFuture {
    fn new(shared: Arc<Shared>) -> Self {
        let signal = shared.lost.clone().cancelled_owned();
        Self {
            shared,
            signal,
            timer: None,
        }
    }
}

impl Future for LostFuture {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            if this.shared.is_lost() || this.signal.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            if !this.shared.check_deadline {
                return Poll::Pending;
            }
            // Wake at the deadline; an extension moves the deadline, so the timer
            // follows it.
            let deadline = tokio::time::Instant::from_std(this.shared.deadline());
            match this.timer {
                Some(t) if t.deadline() == deadline => {}
                Some(t) => t.as_mut().reset(deadline),
                None => {
                    // Outside a Tokio runtime there is no timer: the clock check at
                    // every poll and the renewal task's signal still hold.
                    if tokio::runtime::Handle::try_current().is_err() {
                        return Poll::Pending;
                    }
                    *this.timer = Some(Box::pin(tokio::time::sleep_until(deadline)));
                }
            }
            let Some(timer) = this.timer.as_mut() else {
                return Poll::Pending;
            };
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The timer fired. An extension moved the deadline: loop and follow
            // it. Same deadline but the clock not quite there (timer rounding):
            // poll again soon rather than spin here.
            if !this.shared.is_lost()
                && tokio::time::Instant::from_std(this.shared.deadline()) == deadline
            {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }
}

/// A lock held with auto-extension.
///
/// A background task renews the keys before the validity runs low, by the
/// validity left rather than on a fixed tick. It stops at [`LockGuard::release`],
/// at drop, or once [`LockOptions::max_hold`] has passed. If a renewal finds the
/// lock gone, the validity ends first, or the task stops for any other reason
/// (a panic, its runtime shutting down), [`LockGuard::lost`] completes. The
/// holder's view is also checked against the clock on every call, so it is
/// right even while the renewal task cannot run.
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
#[must_use = "dropping a LockGuard releases the lock"]
pub struct LockGuard {
    handle: LockHandle,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<Released, Error>>>,
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
    /// [`Error::NoRuntime`] outside a Tokio runtime (the renewal task needs
    /// one), or [`Error::InvalidConfig`] when the loss margin is not shorter than the TTL.
    pub fn new(lock: Lock, options: &LockOptions) -> Result<Self, Error> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::NoRuntime("a LockGuard's renewal task"))?;
        let margin = options
            .loss_margin
            .unwrap_or_else(|| lock.redlock().loss_margin());
        if margin >= options.ttl {
            return Err(Error::InvalidConfig(format!(
                "loss margin {margin:?} must be shorter than the TTL {:?}",
                options.ttl
            )));
        }
        let shared = Arc::new(Shared {
            resource: Arc::clone(lock.shared_resource()),
            key: Arc::clone(lock.shared_key()),
            token: Arc::clone(lock.shared_token()),
            epoch: lock.started_at(),
            valid_until_ns: AtomicU64::new(0),
            margin,
            check_deadline: options.check_deadline,
            extensions: AtomicU32::new(0),
            fencing_token: lock.fencing_token(),
            lost: CancellationToken::new(),
        });
        shared.set_valid_until(lock.valid_until());
        let stop = CancellationToken::new();
        // Moved into the task's future now, so that even a task dropped before
        // its first poll (its runtime shut down) fires `lost`.
        let exit = LostOnExit {
            lost: shared.lost.clone(),
            armed: true,
        };
        let task = rt.spawn(keep_alive(
            lock,
            Arc::clone(&shared),
            stop.clone(),
            options.clone(),
            exit,
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

    /// The time left before the holder must stop (see [`LockHandle::remaining`]).
    pub fn remaining(&self) -> Duration {
        self.handle.remaining()
    }

    /// Whether the lock was lost (see [`LockHandle::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// This holder's fencing token (see [`LockHandle::fencing_token`]).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.handle.fencing_token()
    }

    /// Completes when the lock is lost (see [`LockHandle::lost`]).
    pub fn lost(&self) -> LostFuture {
        self.handle.lost()
    }

    /// Stops renewal, waits for a renewal in flight, then releases (decided at
    /// quorum, see [`Redlock::unlock`]).
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when the release could not be confirmed on a
    /// quorum (the keys expire by TTL), or [`Error::Lost`] if the renewal task
    /// panicked.
    pub async fn release(mut self) -> Result<Released, Error> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => task.await.unwrap_or_else(|_| {
                Err(Error::Lost {
                    resource: Arc::clone(&self.handle.shared.resource),
                })
            }),
            None => Err(Error::Lost {
                resource: Arc::clone(&self.handle.shared.resource),
            }),
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

/// Fires `lost` when the renewal task ends any way but a normal release: a panic
/// unwinds through it, a runtime shutdown drops it.
struct LostOnExit {
    lost: CancellationToken,
    armed: bool,
}

impl Drop for LostOnExit {
    fn drop(&mut self) {
        if self.armed {
            self.lost.cancel();
        }
    }
}

/// How often a failing renewal is retried: a tenth of the last validity, but not
/// more often than every 10 ms.
fn renewal_retry_step(granted: Duration) -> Duration {
    (granted / 10).max(Duration::from_millis(10))
}

/// When to renew: once 40–60% of the time the holder was last granted is left
/// before `valid_until` (the holder's deadline), at a random
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
    epoch
        .checked_add(Duration::from_nanos(snapped))
        .map_or(at, |s| s.min(at))
}

/// The auto-extension loop. It renews when about half of the last granted
/// validity is left (see [`renew_point`]), retries failed renewals until the
/// holder's deadline, and signals loss. It owns the [`Lock`], so a release always
/// comes after the last renewal.
async fn keep_alive(
    mut lock: Lock,
    shared: Arc<Shared>,
    stop: CancellationToken,
    options: LockOptions,
    mut exit: LostOnExit,
) -> Result<Released, Error> {
    let redlock = lock.redlock().clone();
    // `Duration::MAX` (or any cap past the end of time) means no cap.
    let hold_until = options
        .max_hold
        .and_then(|m| lock.started_at().checked_add(m));
    // Renewals are scheduled against the holder's deadline (validity less the
    // margin), not the keys' expiry: a renewal confirmed after the holder was
    // told "lost" is of no use, so with a margin close to the TTL they come
    // early enough to land before it.
    let mut granted = shared.deadline().saturating_duration_since(Instant::now());
    let mut renew_at = renew_point(shared.deadline(), granted);
    // A renewal shorter than this would be refused (`InvalidTtl`), or could not
    // complete within its own validity: stop renewing instead.
    let min_ttl = redlock
        .min_ttl()
        .max(redlock.node_timeout().saturating_mul(2));
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = shared.lost.cancelled() => break,
            _ = tokio::time::sleep_until(renew_at.into()) => {}
        }
        if shared.is_lost() || Instant::now() >= lock.valid_until() {
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
                let left = until.saturating_duration_since(Instant::now());
                if left < min_ttl {
                    // max_hold reached: stop renewing; the holder is told when the
                    // validity it has runs out.
                    renew_at = shared.deadline();
                    continue;
                }
                options.ttl.min(left)
            }
        };
        // The extend may not outlast the holder's deadline: a renewal confirmed
        // after the holder was told "lost" would be no use to it.
        let deadline = shared.deadline();
        let outcome = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = redlock.extend(&mut lock, ttl) => Some(r),
            _ = tokio::time::sleep_until(deadline.into()) => None,
        };
        // A shortening extend lowers the lock's validity before it is sent, and
        // keeps it lowered whatever the outcome: publish it either way.
        shared.set_valid_until(lock.valid_until());
        match outcome {
            Some(Ok(())) => {
                shared
                    .extensions
                    .store(lock.extensions(), Ordering::Relaxed);
                granted = shared.deadline().saturating_duration_since(Instant::now());
                renew_at = renew_point(shared.deadline(), granted);
            }
            Some(Err(e @ (Error::NoQuorum { .. } | Error::Expired { .. })))
                if Instant::now() < shared.deadline() =>
            {
                tracing::debug!(resource = lock.resource(), error = %e, "renewal failed, retrying");
                renew_at = Instant::now()
                    .checked_add(renewal_retry_step(granted))
                    .map_or(shared.deadline(), |t| t.min(shared.deadline()));
            }
            Some(Err(e @ (Error::ExtensionLimit { .. } | Error::InvalidTtl { .. }))) => {
                tracing::debug!(resource = lock.resource(), error = %e, "no more renewals");
                renew_at = shared.deadline();
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
    // From here the task ends by releasing; a shutdown mid-release has nothing
    // more to tell the holder than what the loop already did.
    exit.armed = false;
    drop(exit);
    redlock.unlock(lock).await
}

impl Redlock {
    /// Takes the lock (retrying per `options` or the handle's policy) and holds it
    /// with auto-extension until the guard is released or dropped.
    ///
    /// # Errors
    /// See [`Redlock::lock`]; [`Error::InvalidConfig`] when the loss margin is not
    /// shorter than the TTL.
    pub async fn lock_guard(
        &self,
        resource: &str,
        options: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let retry = options.retry.as_ref().unwrap_or(self.retry_policy());
        let lock = self.lock_with(resource, options.ttl, retry).await?;
        LockGuard::new(lock, options)
    }

    /// Runs the future `f` makes while holding the lock, with auto-extension.
    ///
    /// Before each poll of the work, the lock is checked against the clock (see
    /// [`LockHandle::is_lost`]): once it is lost, the work is not polled again, it
    /// is dropped, and [`Error::Lost`] is returned. Work that finishes in a poll
    /// during which the lock was lost (it blocked its thread past the deadline)
    /// also returns [`Error::Lost`]: it did not run entirely under the lock. The
    /// lock is released when the work ends.
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
    /// An acquire error (see [`Redlock::lock_guard`]) or [`Error::Lost`].
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
        let handle = guard.handle();
        let outcome = Watched {
            work: f(guard.handle()),
            lost: handle.lost(),
        }
        .await
        .filter(|_| !handle.is_lost());
        let resource: Arc<str> = Arc::clone(&handle.shared.resource);
        if let Err(e) = guard.release().await {
            tracing::debug!(resource = %resource, error = %e, "release after with_lock");
        }
        outcome.ok_or(Error::Lost { resource })
    }
}

pin_project! {
    /// Work raced against the loss of its lock: the loss is checked first at every
    /// poll, so work is never polled once the lock is lost.
    struct Watched<W> {
        #[pin]
        work: W,
        #[pin]
        lost: LostFuture,
    }
}

impl<W: Future> Future for Watched<W> {
    type Output = Option<W::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.lost.poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        this.work.poll(cx).map(Some)
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
