//! The part of a per-request lock that does not depend on the web framework
//! (the `http` feature).
//!
//! `redlock-tower` and `redlock-actix` are thin: they extract a key and map a
//! [`Rejection`] to their own response type. Everything else lives here once:
//! the [`LockPolicy`] and its setters (the adapters' builders get the same ones
//! from one macro), the wait, the hold with auto-extension (a
//! [`LockGuard`] from [`crate::Primitive::guard`]), the abort on loss, the release,
//! the tracing span, and the HTTP answer of a refusal (status, `Retry-After`,
//! the `RateLimit` fields of a `permits(n)` route's busy answer,
//! `application/problem+json`).
//!
//! The Redis key of a request's lock is the handle's key prefix, then the
//! policy's namespace, then the extracted key, bounded in length: see
//! [`LockPolicy`]. Keys made from client values stay in their family and
//! bounded whatever the client sends: see [`KeyFamily`] and [`bound_key`].
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_core::Redlock;
//! use redlock_core::request::{self, LockPolicy};
//!
//! # async fn run(redlock: Redlock) {
//! let policy = LockPolicy::default().wait(Duration::from_secs(2));
//! match request::acquire(Some(&redlock), Some("tenant:7".into()), &policy).await {
//!     Ok(Some(held)) => {
//!         let work = async { /* the handler */ };
//!         match request::guard(work, Some(&held), &policy).await {
//!             Ok(()) => {}                     // done: drop `held` when the response ends
//!             Err(rejection) => { /* lost: answer rejection.status() */ }
//!         }
//!     }
//!     Ok(None) => { /* no lock needed (no key, or fail-open) */ }
//!     Err(rejection) => { /* answer rejection.status() with rejection.problem_json() */ }
//! }
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tracing::Instrument;

use crate::error::Error;
use crate::guard::{LockGuard, LockHandle};
use crate::redlock::Redlock;
use crate::settings::LockOptions;

mod guarded;
pub(crate) mod keys;
mod kind;
mod path;
mod policy;
mod rate_limit;
mod rejection;
mod setters;
mod upgrade;

pub use guarded::{Guarded, guard};
pub use http::StatusCode;
pub use keys::{KeyFamily, MAX_KEY_BYTES, RequestKey, bound_key, escape_value};
#[cfg(feature = "idempotency")]
pub(crate) use kind::idempotency_needs_the_mutex;
pub use kind::{RequestLockKind, is_read_method};
pub use path::{decode_param, normalize_path};
pub use policy::{
    BusyPolicy, LockPolicy, LostPolicy, MissingKeyPolicy, ReleasePolicy, UnavailablePolicy,
};
pub use rejection::Rejection;
pub use upgrade::is_upgrade;

/// What [`lock_policy_setters!`](crate::lock_policy_setters) expands to. Not
/// for direct use.
#[doc(hidden)]
pub mod __private {
    pub use super::setters::Setting;
}

/// A lock held for one request. Dropping it releases the lock in the background
/// and closes the request's tracing span with the hold time and outcome.
pub struct RequestLock {
    guard: Option<LockGuard>,
    handle: LockHandle,
    span: tracing::Span,
    acquired: Instant,
    /// The opt-in `key` label of the request metrics.
    metrics_key: Option<&'static str>,
}

impl std::fmt::Debug for RequestLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLock")
            .field("handle", &self.handle)
            .finish()
    }
}

impl RequestLock {
    /// The handle to put in the request (extensions or `ReqData`). Its clones
    /// are what [`keep_while_lent`](Self::keep_while_lent) waits for.
    pub fn handle(&self) -> LockHandle {
        self.handle.clone()
    }

    /// A future that completes when the lock is lost (by the renewal task's
    /// signal or by the clock, see [`LockHandle::lost`]).
    pub fn lost(&self) -> LostFuture {
        self.handle.lost()
    }
}

/// The future of [`RequestLock::release`].
pub type ReleaseFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl RequestLock {
    /// Releases the lock and completes once every node has answered (or timed
    /// out). Response bodies await this before they end, so a client that has
    /// the whole response never finds its own request still holding the lock.
    /// (Dropping a `RequestLock` releases too, but in the background.)
    pub fn release(mut self) -> ReleaseFuture {
        Box::pin(async move {
            if let Some(guard) = self.guard.take()
                && let Err(error) = guard.release().await
            {
                tracing::debug!(parent: &self.span, %error, "release after the response");
            }
            // `self` drops here and closes the span with the hold time.
        })
    }
}

impl Drop for RequestLock {
    fn drop(&mut self) {
        // A release marks the handle "not held" too; only a loss before it is
        // recorded as one.
        let lost = self.handle.is_lost() && !self.handle.is_released();
        if lost {
            crate::metrics::request(self.metrics_key, "lost");
        }
        self.span
            .record("hold_ms", self.acquired.elapsed().as_millis() as u64);
        self.span.record("extensions", self.handle.extensions());
        self.span
            .record("outcome", if lost { "lost" } else { "released" });
        // Dropping the guard signals its task, which releases (never blocks here).
        drop(self.guard.take());
    }
}

pub use crate::guard::LostFuture;

/// Watches, for a response body, the loss of the lock it holds: the body asks
/// at each poll, and is woken by the loss while it waits on its producer
/// instead of learning of it only at its next frame; and it asks again
/// ([`lost_now`](Self::lost_now)) after each poll of its producer, so a frame
/// made after the loss is never sent.
///
/// Only under [`LostPolicy::Abort`]: with [`LostPolicy::Signal`] the handler
/// watches [`LockHandle::lost`] itself and the body streams on.
pub struct LossWatch {
    handle: LockHandle,
    lost: Pin<Box<LostFuture>>,
}

impl std::fmt::Debug for LossWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossWatch")
            .field("handle", &self.handle)
            .finish()
    }
}

impl LossWatch {
    /// A watch over `lock` when the policy aborts on loss; `None` without a
    /// lock or under [`LostPolicy::Signal`].
    pub fn for_body(lock: Option<&RequestLock>, on_lost: LostPolicy) -> Option<Self> {
        lock.filter(|_| on_lost == LostPolicy::Abort)
            .map(|lock| Self {
                handle: lock.handle.unlent(),
                lost: Box::pin(lock.lost()),
            })
    }

    /// `Ready` with the error that ends the body once the lock is lost (the
    /// loss is logged then); `Pending` otherwise, and `cx` is woken at the loss.
    pub fn poll_lost(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        if !self.handle.is_lost() && self.lost.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.loss())
    }

    /// The error that ends the body if the lock is lost by now (the loss is
    /// logged then), read from the clock and the renewal's signal without
    /// polling. For what the body's producer returned from the poll that just
    /// ended: a producer that blocked its thread past the deadline in that poll
    /// made its frame without the lock, so the frame must not go out, as
    /// [`Guarded`] refuses a handler that finished after the loss.
    pub fn lost_now(&self) -> Option<Error> {
        self.handle.is_lost().then(|| self.loss())
    }

    fn loss(&self) -> Error {
        Rejection::Lost {
            key: Arc::from(self.handle.resource()),
        }
        .log();
        Error::Lost {
            resource: Arc::from(self.handle.resource()),
        }
    }
}

/// Takes the lock for one request per `policy`, with the handle the adapter found
/// (bound to the middleware, or registered on the app).
///
/// - `Ok(Some(lock))`: held, with auto-extension; keep it until the response ends.
/// - `Ok(None)`: run the request unlocked (no key and pass-through, or fail-open).
/// - `Err(rejection)`: answer with the rejection (already logged).
///
/// # Errors
/// A [`Rejection`] for busy, unavailable, missing key, a key the lock refuses
/// (the client's: 400), missing handle or misconfiguration.
pub async fn acquire(
    redlock: Option<&Redlock>,
    key: Option<String>,
    policy: &LockPolicy,
) -> Result<Option<RequestLock>, Rejection> {
    acquire_keys(redlock, key.map(RequestKey::One), policy).await
}

/// [`acquire`] for a request whose extractor may find several keys
/// ([`RequestKey::Many`]): they are locked together, as one lock
/// ([`crate::Redlock::mutex_many`]), each under the policy's namespace.
///
/// # Errors
/// See [`acquire`].
pub async fn acquire_keys(
    redlock: Option<&Redlock>,
    key: Option<RequestKey>,
    policy: &LockPolicy,
) -> Result<Option<RequestLock>, Rejection> {
    acquire_retained(redlock, key, policy, None, false).await
}

/// [`acquire_keys`] for a request whose method only reads (`reads`, see
/// [`is_read_method`]) or not: under
/// [`RequestLockKind::SharedForSafeMethods`] the first takes a read share,
/// the other the write lock; other kinds take what they take for any method.
///
/// # Errors
/// See [`acquire`].
pub async fn acquire_keys_for(
    redlock: Option<&Redlock>,
    key: Option<RequestKey>,
    policy: &LockPolicy,
    reads: bool,
) -> Result<Option<RequestLock>, Rejection> {
    acquire_retained(redlock, key, policy, None, reads).await
}

/// [`acquire_keys`] with `keep`, when set, as the fence retention of the
/// lock instead of the policy's (the idempotency layer's: its records'
/// TTL).
pub(crate) async fn acquire_retained(
    redlock: Option<&Redlock>,
    key: Option<RequestKey>,
    policy: &LockPolicy,
    keep: Option<std::time::Duration>,
    reads: bool,
) -> Result<Option<RequestLock>, Rejection> {
    let first = key.as_ref().and_then(|k| k.keys().first());
    let metrics_key = redlock.zip(first).and_then(|(r, k)| {
        r.core
            .has_metrics_key()
            .then(|| r.core.metrics_key(&r.key_for(&policy.resource_for(k))))
            .flatten()
    });
    let result = acquire_lock(redlock, key, policy, keep, reads).await;
    let outcome = match &result {
        Ok(Some(_)) => "locked",
        Ok(None) => "unlocked",
        Err(Rejection::Busy { .. }) => "busy",
        Err(Rejection::Unavailable { .. }) => "unavailable",
        Err(_) => "error",
    };
    crate::metrics::request(metrics_key, outcome);
    result.map(|held| {
        held.map(|mut held| {
            held.metrics_key = metrics_key;
            held
        })
    })
}

/// [`acquire`] without its metrics.
async fn acquire_lock(
    redlock: Option<&Redlock>,
    key: Option<RequestKey>,
    policy: &LockPolicy,
    keep: Option<std::time::Duration>,
    reads: bool,
) -> Result<Option<RequestLock>, Rejection> {
    let Some(key) = key else {
        return without_key(policy);
    };
    let Some(redlock) = redlock else {
        let rejection = Rejection::MissingHandle;
        rejection.log();
        return Err(rejection);
    };
    let resources: Vec<String> = key.keys().iter().map(|k| policy.resource_for(k)).collect();
    let key: Arc<str> = resources.join("+").into();
    let span = tracing::info_span!(
        "redlock.request",
        key = %key,
        wait_ms = tracing::field::Empty,
        hold_ms = tracing::field::Empty,
        extensions = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let started = Instant::now();
    let options = LockOptions {
        retry: Some(policy.retry_for(redlock.retry_policy())),
        // A client names this resource: its Durable fence counter expires
        // (see `LockOptions::fence_retention`).
        fence_retention: Some(
            keep.or(policy.options.fence_retention)
                .unwrap_or(crate::fencing::DEFAULT_FENCE_RETENTION),
        ),
        ..policy.options.clone()
    };
    let result = kind::guard(redlock, &resources, &options, policy.kind, reads)
        .instrument(span.clone())
        .await;
    span.record("wait_ms", started.elapsed().as_millis() as u64);
    match result {
        Ok(guard) => Ok(Some(RequestLock {
            // Lent to the handler: its clones are counted for upgrades.
            handle: guard.handle().into_lent(),
            guard: Some(guard),
            span,
            acquired: Instant::now(),
            metrics_key: None,
        })),
        Err(error) => refused(error, key, policy, &span),
    }
}

/// Counts a request that an adapter runs unlocked without calling
/// [`acquire_keys`] (its fast path for a request with no key under
/// [`MissingKeyPolicy::PassThrough`]) as `acquire_keys` counts it:
/// `redlock_requests_total{outcome="unlocked"}`, so both adapters report the
/// same series for the same traffic.
pub fn count_pass_through() {
    crate::metrics::request(None, "unlocked");
}

/// A request with no key, per the [`MissingKeyPolicy`]: run unlocked, or
/// refuse (logged).
fn without_key(policy: &LockPolicy) -> Result<Option<RequestLock>, Rejection> {
    match policy.missing_key {
        MissingKeyPolicy::PassThrough => Ok(None),
        MissingKeyPolicy::Reject => {
            let rejection = Rejection::MissingKey;
            rejection.log();
            Err(rejection)
        }
    }
}

/// A lock the handle could not take for `key`, per `policy`: the rejection to
/// answer with (recorded in `span` and logged), or `Ok(None)` to run unlocked
/// when the backend is unavailable and the policy fails open.
fn refused(
    error: Error,
    key: Arc<str>,
    policy: &LockPolicy,
    span: &tracing::Span,
) -> Result<Option<RequestLock>, Rejection> {
    let rejection = match error {
        Error::Busy { retry_after, .. } => Rejection::Busy {
            key,
            status: policy.busy_status,
            retry_after,
            quota: policy.rate_limit_quota(),
        },
        // Some node said another holder has the key: running unlocked
        // could overlap that holder, so even fail-open answers "busy".
        Error::NoQuorum { ref report, .. } if report.busy_count() > 0 => Rejection::Busy {
            key,
            status: policy.busy_status,
            retry_after: report.busy_pttls().max(),
            quota: policy.rate_limit_quota(),
        },
        // A node that answered with an error is up and refused: wrong
        // credentials (a password rotated on the nodes first), a replica, or
        // OOM (with client-chosen keys, `by_path`, any client can fill the
        // nodes). Fail-open is for nodes that do not answer; running
        // unlocked past a refusal would hand exclusion to whatever caused
        // it, so even fail-open refuses.
        e @ Error::NoQuorum { .. } if e.report().is_some_and(|r| r.refusal_count() > 0) => {
            Rejection::Unavailable { key, error: e }
        }
        // The keys were set on a quorum, so the nodes are up; the fence did
        // not reach a quorum in time. Never a reason to run unlocked.
        e @ Error::NoFenceQuorum { .. } => Rejection::Unavailable { key, error: e },
        e @ (Error::NoQuorum { .. } | Error::NoValidity { .. }) => {
            // No node that answered saw another holder (a node still
            // pending when the attempt was decided is no evidence either
            // way; waiting for it would make every failure as slow as
            // the slowest node).
            if policy.unavailable == UnavailablePolicy::FailOpen {
                span.record("outcome", "fail_open");
                tracing::warn!(parent: span, error = %e, "lock backend unavailable; running unlocked (fail-open)");
                return Ok(None);
            }
            Rejection::Unavailable { key, error: e }
        }
        // The key, from the request: empty, or ending with the waiters
        // flag's suffix (a path may). The client's mistake, not the
        // operator's; it is bounded and escaped by then, so no length or
        // family error can come from it.
        e @ (Error::EmptyResource | Error::ReservedResource { .. }) => {
            Rejection::InvalidKey { key, error: e }
        }
        // An input the handle refuses (TTL, loss margin, an extractor that
        // found no key or too many) or no runtime.
        error => Rejection::Misconfigured { error },
    };
    span.record("outcome", rejection.title());
    span.in_scope(|| rejection.log());
    Err(rejection)
}
