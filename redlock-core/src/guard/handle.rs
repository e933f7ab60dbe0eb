//! What the code under a lock is told: [`LockHandle`] and [`LostFuture`].
//!
//! The holder's view ([`LockHandle::is_lost`], [`LockHandle::remaining`],
//! [`LockHandle::lost`]) does not depend on the renewal task getting to run: it is
//! read off the local monotonic clock against the last validity the nodes
//! confirmed, less a safety margin. A renewal task that is starved (a blocked
//! thread, a busy current-thread runtime), that panics, or whose runtime shuts
//! down cannot leave the holder believing it still holds the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::fencing::FencingToken;

/// State shared between a [`LockGuard`], its [`LockHandle`]s and its renewal task.
pub(super) struct Shared {
    pub(super) resource: Arc<str>,
    pub(super) key: Arc<str>,
    pub(super) token: Arc<str>,
    /// The instant every deadline below is counted from.
    pub(super) epoch: Instant,
    /// The validity deadline the nodes confirmed, in nanoseconds after `epoch`.
    pub(super) valid_until_ns: AtomicU64,
    /// How long before `valid_until` the holder is told the lock is lost.
    pub(super) margin: Duration,
    /// The end of the hold cap ([`LockOptions::max_hold`](crate::LockOptions::max_hold)),
    /// if any: the holder's deadline is never later, whatever the keys' TTL.
    pub(super) hold_until: Option<Instant>,
    /// Off only in the fault suite's negative control.
    pub(super) check_deadline: bool,
    pub(super) extensions: AtomicU32,
    pub(super) fencing_token: Option<FencingToken>,
    /// A fenced lock on several resources: each resource's token (empty
    /// otherwise).
    pub(super) fencing_tokens: Vec<(Arc<str>, FencingToken)>,
    /// Sticky: once cancelled, the lock stays lost for its holder even if a
    /// renewal that was in flight succeeds afterwards. Cancelled by a release
    /// too: from then on no handle may say "held".
    pub(super) lost: CancellationToken,
    /// Set when the guard gave the lock up (released or dropped) while it was
    /// still held, so a release is not reported as a loss.
    pub(super) released: AtomicBool,
}

impl Shared {
    pub(super) fn set_valid_until(&self, at: Instant) {
        let ns =
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.valid_until_ns.store(ns, Ordering::Release);
    }

    /// Lowers the validity to `at` if that is earlier (never raises it).
    pub(super) fn lower_valid_until(&self, at: Instant) {
        let ns =
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.valid_until_ns.fetch_min(ns, Ordering::AcqRel);
    }

    pub(super) fn valid_until(&self) -> Instant {
        let ns = Duration::from_nanos(self.valid_until_ns.load(Ordering::Acquire));
        self.epoch.checked_add(ns).unwrap_or(self.epoch)
    }

    /// The instant from which the holder is told the lock is lost: the confirmed
    /// validity less the margin, or the end of the hold cap if that is earlier.
    pub(super) fn deadline(&self) -> Instant {
        let valid = self
            .valid_until()
            .checked_sub(self.margin)
            .unwrap_or(self.epoch);
        self.hold_until.map_or(valid, |cap| valid.min(cap))
    }

    /// The guard gives the lock up: from this call on, every handle answers
    /// "not held" (`is_lost()`, zero `remaining()`, `lost()` complete), before
    /// the release is even sent. Never blocks (it runs in `Drop`).
    pub(super) fn give_up(&self) {
        if !self.is_lost() {
            self.released.store(true, Ordering::Release);
        }
        self.lost.cancel();
    }

    /// Whether the guard gave the lock up while it was held.
    pub(super) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Lost if the renewal task said so, if the guard released it, or if the
    /// clock passed the deadline, whether or not the renewal task has run since.
    pub(super) fn is_lost(&self) -> bool {
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
/// ([`LockOptions::loss_margin`](crate::LockOptions::loss_margin)), even if the renewal task has not run (its
/// thread blocked, its runtime starved). Once true it stays true.
#[derive(Clone)]
pub struct LockHandle {
    pub(super) shared: Arc<Shared>,
    /// What the handles lent to a request's handler share, so that the lock of
    /// an upgraded connection can be kept until the last of them is dropped
    /// (see `request::RequestLock::keep_while_lent`). `None` elsewhere.
    pub(crate) keep: Option<Arc<Keep>>,
}

/// What the handles lent to a request's handler share: once a lock is put in
/// it, the lock lives until the last of those handles is dropped (and its drop
/// releases it, in the background).
#[derive(Default)]
pub(crate) struct Keep {
    lock: OnceLock<Box<dyn Send + Sync>>,
}

impl Keep {
    /// Keeps `lock` until the last reference to this is dropped.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn hold(&self, lock: Box<dyn Send + Sync>) {
        // Set once: each `Keep` belongs to one lock, which the caller gives up
        // here. Were it set already, `lock` would drop, and release, now.
        drop(self.lock.set(lock));
    }
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
    /// This handle, to be lent to a request's handler: its clones share a new
    /// [`Keep`].
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn into_lent(mut self) -> Self {
        self.keep = Some(Arc::default());
        self
    }

    /// A clone that is not one of the handles lent to a handler (it does not
    /// keep an upgraded request's lock).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn unlent(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            keep: None,
        }
    }

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

    /// This holder's fencing token (see [`Lock::fencing_token`](crate::Lock::fencing_token)); `None` when
    /// the handle was built without [`fencing`](crate::RedlockBuilder::fencing).
    /// Fixed for the life of the lock: renewals keep it.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.shared.fencing_token
    }

    /// Each resource's fencing token (see
    /// [`Lock::fencing_tokens`](crate::Lock::fencing_tokens)): one per resource
    /// of a lock on several, in key order. Empty without fencing.
    pub fn fencing_tokens(&self) -> Vec<(&str, FencingToken)> {
        if self.shared.fencing_tokens.is_empty() {
            return self
                .shared
                .fencing_token
                .map(|t| (&*self.shared.resource, t))
                .into_iter()
                .collect();
        }
        self.shared
            .fencing_tokens
            .iter()
            .map(|(r, t)| (&**r, *t))
            .collect()
    }

    /// Whether this handle no longer holds the lock: a renewal found it gone,
    /// the renewal task stopped, the clock reached the confirmed validity less
    /// the loss margin, or the guard released the lock (or was dropped; see
    /// [`is_released`](Self::is_released) to tell the two apart). Checked
    /// against the clock on every call. Once true, another client may hold the
    /// lock, and it stays true.
    ///
    /// A handle kept past the release (cloned into a spawned task, say) thus
    /// never tells its code that it still holds the lock.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Whether the guard gave the lock up ([`LockGuard::release`](crate::LockGuard::release)
    /// or its drop) while it was still held. [`is_lost`](Self::is_lost) is
    /// true from then on as well: the code under the lock must stop either way.
    pub fn is_released(&self) -> bool {
        self.shared.is_released()
    }

    /// Completes when this handle no longer holds the lock: when it is lost,
    /// at the latest when the clock reaches the confirmed validity less the loss
    /// margin (its own timer, not the renewal task's), or when the guard
    /// releases it. Never completes while the lock is held.
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
    pub(super) fn new(shared: Arc<Shared>) -> Self {
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
