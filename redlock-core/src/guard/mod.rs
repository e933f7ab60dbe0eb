//! *Layer 4, holding (see `lib.rs`).*
//!
//! A lock held with auto-extension ([`LockGuard`]), and the ways to take one:
//! [`crate::Primitive::guard`] and [`crate::Primitive::run`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::fencing::FencingToken;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::release::Released;
use crate::settings::LockOptions;
pub(crate) use at_least::run_guarded_at_least;
use handle::Shared;
pub use handle::{LockHandle, LostFuture};
pub use keep::Ended;
use renew::{LostOnExit, Renewal};
pub(crate) use schedule::Schedule;
use schedule::{Handback, Ticket};

mod at_least;
mod handle;
mod keep;
mod renew;
mod schedule;

/// A lock held with auto-extension.
///
/// The handle's renewal schedule renews the keys before the validity runs
/// low, by the validity left rather than on a fixed tick, together with the
/// handle's other guarded locks due at the same time (one script call per node
/// for up to 100 of them). It stops at [`LockGuard::release`],
/// at drop, or at [`LockOptions::max_hold`]: then the lock counts as lost and
/// is released. If a renewal finds the
/// lock gone, the validity ends first, the hold cap is reached, or the
/// schedule's task stops for any
/// other reason (a panic, its runtime shutting down), [`LockGuard::lost`]
/// completes. The holder's view is also checked against the clock on every
/// call, so it is right even while the schedule cannot run.
///
/// Drop never blocks: it signals the schedule, which finishes any renewal in
/// flight and then releases the keys. Outside a Tokio runtime nothing runs and the keys expire
/// with their TTL.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::{LockOptions, Redlock};
///
/// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
/// let guard = redlock.mutex("report:daily").guard(&LockOptions::new(Duration::from_secs(2))).await?;
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
    ticket: Option<Ticket>,
    /// Set for a job with a minimum hold (`run_guarded_at_least`): dropped
    /// before this instant (the job's future cancelled, or a panic), the
    /// keys are kept until it, as `release_at_least` keeps them, instead of
    /// released.
    keep_on_drop: Option<std::time::Instant>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("handle", &self.handle)
            .finish()
    }
}

impl LockGuard {
    /// Starts auto-extension of `lock` with `options` on `schedule` (its
    /// handle's, see [`Redlock::guard`](crate::Redlock::guard)).
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime (the renewal task needs
    /// one), or [`Error::InvalidConfig`] when the loss margin is not shorter than the TTL.
    pub(crate) fn new(
        schedule: &Schedule,
        lock: Lock,
        options: &LockOptions,
    ) -> Result<Self, Error> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::NoRuntime("a LockGuard's renewal task"))?;
        let redlock = lock.redlock().clone();
        let margin = redlock.loss_margin_for(options)?;
        let shared = Arc::new(Shared {
            resource: Arc::clone(lock.shared_resource()),
            key: Arc::clone(lock.shared_key()),
            token: Arc::clone(lock.shared_token()),
            epoch: lock.started_at(),
            valid_until_ns: AtomicU64::new(0),
            margin,
            // `Duration::MAX` (or any cap past the end of time) is no cap.
            hold_until: options
                .hold_cap(redlock.inner.settings.fencing)
                .and_then(|m| lock.started_at().checked_add(m)),
            check_deadline: options.check_deadline,
            extensions: AtomicU32::new(0),
            fencing_token: lock.fencing_token(),
            fencing_tokens: match &lock.many {
                None => Vec::new(),
                Some(_) => lock
                    .fencing_tokens()
                    .into_iter()
                    .map(|(r, t)| (Arc::from(r), t))
                    .collect(),
            },
            lost: CancellationToken::new(),
            released: std::sync::atomic::AtomicBool::new(false),
        });
        shared.set_valid_until(lock.valid_until());
        // Moved with the lock now, so that even a schedule dropped before it
        // took the lock (its runtime shut down) fires `lost`.
        let exit = LostOnExit {
            lost: shared.lost.clone(),
            armed: true,
        };
        let renewal = Renewal::new(lock, Arc::clone(&shared), options, exit);
        let ticket = schedule.add(&rt, renewal);
        Ok(Self {
            handle: LockHandle { shared, keep: None },
            ticket,
            keep_on_drop: None,
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
    /// quorum, see [`Redlock::unlock`](crate::Redlock::unlock)).
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when the release could not be confirmed on a
    /// quorum (the keys expire by TTL), or [`Error::Lost`] if the renewal task
    /// panicked.
    pub async fn release(mut self) -> Result<Released, Error> {
        self.handle.shared.give_up();
        let lost = || Error::Lost {
            resource: Arc::clone(&self.handle.shared.resource),
        };
        let Some(ticket) = self.ticket.take() else {
            return Err(lost());
        };
        match ticket.release().await {
            Some(Handback::Lock(lock)) => lock.redlock().clone().unlock(*lock).await,
            Some(Handback::Releasing(release)) => release.await.unwrap_or_else(|_| Err(lost())),
            None => Err(lost()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // The schedule sees this, finishes any renewal in flight, then releases
        // (spawned work: nothing here blocks). Handles kept elsewhere stop saying
        // "held" now, before the release is sent.
        self.handle.shared.give_up();
        if let Some(ticket) = &self.ticket {
            ticket.drop_lock(self.keep_on_drop);
        }
    }
}

impl Core {
    /// The loss margin a guard taken with `options` uses: the options' own, or
    /// the handle's.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when it is not shorter than the TTL.
    pub(crate) fn loss_margin_for(&self, options: &LockOptions) -> Result<Duration, Error> {
        let margin = options.loss_margin.unwrap_or_else(|| self.loss_margin());
        if margin >= options.ttl {
            return Err(Error::InvalidConfig(format!(
                "loss margin {margin:?} must be shorter than the TTL {:?}",
                options.ttl
            )));
        }
        Ok(margin)
    }
}

/// The work of [`crate::Primitive::run`] under `guard`: never polled once the
/// lock is lost, and the lock released when it ends.
pub(crate) async fn run_guarded<F, Fut, T>(guard: LockGuard, f: F) -> Result<T, Error>
where
    F: FnOnce(LockHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let handle = guard.handle();
    let outcome = Watched {
        work: f(guard.handle()),
        lost: handle.lost(),
    }
    .await
    .filter(|_| !handle.is_lost());
    let resource: Arc<str> = Arc::clone(&handle.shared.resource);
    if let Err(e) = guard.release().await {
        tracing::debug!(resource = %resource, error = %e, "release after run");
    }
    outcome.ok_or(Error::Lost { resource })
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
