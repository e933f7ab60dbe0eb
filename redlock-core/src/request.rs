//! The part of a per-request lock that does not depend on the web framework.
//!
//! `redlock-tower` and `redlock-actix` are thin: they extract a key and map a
//! [`Rejection`] to their own response type. Everything else lives here once: the
//! policy, the wait, the hold with auto-extension, the abort on loss, the release
//! and the tracing span.
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
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tracing::Instrument;

use crate::config::{LockOptions, RetryPolicy};
use crate::error::Error;
use crate::guard::{LockGuard, LockHandle};
use crate::redlock::Redlock;

/// What to do when the lock is held by another request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyPolicy {
    /// Answer at once (409 by default) with `Retry-After`.
    FailFast,
    /// Retry with jittered delays up to this long, then answer as for `FailFast`.
    Wait(Duration),
}

/// What to do when the request yields no key (for example, the header is absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingKeyPolicy {
    /// Run the request without a lock (the default): the key extractor decides
    /// which requests need one.
    PassThrough,
    /// Reject with 400 Bad Request.
    Reject,
}

/// What to do when no quorum of Redis nodes answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnavailablePolicy {
    /// Reject with 503 and `Retry-After` (the default): no exclusion, no service.
    FailClosed,
    /// Run the request without a lock. Only for work where a rare duplicate is
    /// better than an outage.
    FailOpen,
}

/// What to do when the lock is lost while the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostPolicy {
    /// Drop the handler future and answer 503 (the default), like a timeout layer.
    Abort,
    /// Let the handler run; it can watch [`LockHandle::is_lost`] or
    /// [`LockHandle::lost`].
    Signal,
}

/// When the lock is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasePolicy {
    /// When the response body has been fully sent, or dropped (the default).
    BodyEnd,
    /// As soon as the handler has produced the response head.
    ResponseHead,
}

/// The settings of a per-request lock, shared by both web adapters.
#[derive(Debug, Clone)]
pub struct LockPolicy {
    pub(crate) ttl: Duration,
    pub(crate) busy: BusyPolicy,
    pub(crate) busy_status: u16,
    pub(crate) missing_key: MissingKeyPolicy,
    pub(crate) unavailable: UnavailablePolicy,
    pub(crate) lost: LostPolicy,
    pub(crate) release: ReleasePolicy,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) key_prefix: Arc<str>,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
}

impl Default for LockPolicy {
    /// TTL 5 s (renewed while the handler runs), fail fast with 409, pass through
    /// requests with no key, fail closed with 503, abort on loss, release at body
    /// end, key prefix `"redlock:"`.
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(5),
            busy: BusyPolicy::FailFast,
            busy_status: 409,
            missing_key: MissingKeyPolicy::PassThrough,
            unavailable: UnavailablePolicy::FailClosed,
            lost: LostPolicy::Abort,
            release: ReleasePolicy::BodyEnd,
            max_hold: None,
            key_prefix: "redlock:".into(),
            retry_delay: Duration::from_millis(25),
            retry_jitter: Duration::from_millis(50),
        }
    }
}

impl LockPolicy {
    /// The TTL of the keys; the lock is renewed while the request runs.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Waits up to `timeout` for a busy lock, retrying with jittered delays.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.busy = BusyPolicy::Wait(timeout);
        self
    }

    /// Answers a busy lock at once (the default).
    pub fn fail_fast(mut self) -> Self {
        self.busy = BusyPolicy::FailFast;
        self
    }

    /// The status of the busy answer (default 409 Conflict; 423 and 429 are other
    /// common choices).
    pub fn busy_status(mut self, status: u16) -> Self {
        self.busy_status = status;
        self
    }

    /// What to do with a request that has no key.
    pub fn on_missing_key(mut self, policy: MissingKeyPolicy) -> Self {
        self.missing_key = policy;
        self
    }

    /// Runs requests unlocked when no quorum of nodes answers (default: 503).
    /// Never when a node that answered said another holder has the key: that
    /// request gets the busy answer instead.
    pub fn fail_open(mut self) -> Self {
        self.unavailable = UnavailablePolicy::FailOpen;
        self
    }

    /// What to do if the lock is lost while the handler runs.
    pub fn on_lost(mut self, policy: LostPolicy) -> Self {
        self.lost = policy;
        self
    }

    /// When to release the lock.
    pub fn release_on(mut self, policy: ReleasePolicy) -> Self {
        self.release = policy;
        self
    }

    /// Stops renewing after this long; the handler is then told (or aborted) when
    /// the last validity ends.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The prefix put before every extracted key (default `"redlock:"`).
    pub fn key_prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The fixed and random parts of the delay between attempts in wait mode
    /// (default 25 ms + up to 50 ms).
    pub fn retry_delay(mut self, delay: Duration, jitter: Duration) -> Self {
        self.retry_delay = delay;
        self.retry_jitter = jitter;
        self
    }

    /// Where the busy policy is set.
    pub fn busy_policy(&self) -> BusyPolicy {
        self.busy
    }

    /// When the lock is released.
    pub fn release_policy(&self) -> ReleasePolicy {
        self.release
    }

    /// What happens on loss.
    pub fn lost_policy(&self) -> LostPolicy {
        self.lost
    }

    /// What happens to a request with no key.
    pub fn missing_key_policy(&self) -> MissingKeyPolicy {
        self.missing_key
    }

    /// The busy status code.
    pub fn busy_status_code(&self) -> u16 {
        self.busy_status
    }

    fn retry(&self) -> RetryPolicy {
        match self.busy {
            BusyPolicy::FailFast => RetryPolicy::no_retry(),
            BusyPolicy::Wait(timeout) => RetryPolicy::deadline(timeout)
                .with_delay(self.retry_delay)
                .with_jitter(self.retry_jitter),
        }
    }
}

/// Why a request was not run (or was stopped). Each adapter turns this into its
/// own response with [`Rejection::status`], [`Rejection::retry_after_secs`] and
/// [`Rejection::problem_json`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rejection {
    /// Another request holds the lock.
    Busy {
        /// The full key.
        key: Arc<str>,
        /// The status to answer with (from [`LockPolicy::busy_status`]).
        status: u16,
        /// When the holder's keys expire, if known.
        retry_after: Option<Duration>,
    },
    /// No quorum of Redis nodes answered.
    Unavailable {
        /// The full key.
        key: Arc<str>,
        /// The error, for logs.
        error: Error,
    },
    /// The request had no key and the policy rejects such requests.
    MissingKey,
    /// No [`Redlock`] handle was bound to the middleware or found in the request.
    MissingHandle,
    /// The lock was lost while the handler ran, and the handler was stopped.
    Lost {
        /// The full key.
        key: Arc<str>,
    },
    /// The lock could not be taken for another reason (for example, a TTL outside
    /// the handle's bounds). A server-side misconfiguration.
    Misconfigured {
        /// The error.
        error: Error,
    },
}

impl Rejection {
    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            Rejection::Busy { status, .. } => *status,
            Rejection::Unavailable { .. } | Rejection::Lost { .. } => 503,
            Rejection::MissingKey => 400,
            Rejection::MissingHandle | Rejection::Misconfigured { .. } => 500,
        }
    }

    /// The `Retry-After` value in whole seconds (at least 1), when there is one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        let d = match self {
            Rejection::Busy { retry_after, .. } => retry_after.unwrap_or(Duration::from_secs(1)),
            Rejection::Unavailable { .. } | Rejection::Lost { .. } => Duration::from_secs(1),
            _ => return None,
        };
        Some(d.as_millis().div_ceil(1000).max(1) as u64)
    }

    /// A short title for the problem.
    pub fn title(&self) -> &'static str {
        match self {
            Rejection::Busy { .. } => "Resource is locked",
            Rejection::Unavailable { .. } => "Lock service unavailable",
            Rejection::MissingKey => "Missing lock key",
            Rejection::MissingHandle => "Lock middleware is not configured",
            Rejection::Lost { .. } => "Lock lost",
            Rejection::Misconfigured { .. } => "Lock middleware is misconfigured",
        }
    }

    fn detail(&self) -> &'static str {
        match self {
            Rejection::Busy { .. } => {
                "Another request holds the lock for this resource. Retry after the given delay."
            }
            Rejection::Unavailable { .. } => {
                "Not enough lock nodes answered to take the lock safely."
            }
            Rejection::MissingKey => "The request carries no value to lock on.",
            Rejection::MissingHandle => "The server has no Redlock handle configured.",
            Rejection::Lost { .. } => {
                "The lock expired or was taken away while the request ran; the work was stopped."
            }
            Rejection::Misconfigured { .. } => "The server's lock settings are invalid.",
        }
    }

    /// The body: an RFC 9457 `application/problem+json` document.
    pub fn problem_json(&self) -> String {
        let mut doc = serde_json::json!({
            "type": "about:blank",
            "title": self.title(),
            "status": self.status(),
            "detail": self.detail(),
        });
        if let (
            Rejection::Busy { key, .. }
            | Rejection::Unavailable { key, .. }
            | Rejection::Lost { key },
            Some(obj),
        ) = (self, doc.as_object_mut())
        {
            obj.insert("key".into(), serde_json::Value::String(key.to_string()));
        }
        if let (Some(secs), Some(obj)) = (self.retry_after_secs(), doc.as_object_mut()) {
            obj.insert("retry_after".into(), secs.into());
        }
        doc.to_string()
    }

    /// The media type of [`Rejection::problem_json`].
    pub const CONTENT_TYPE: &'static str = "application/problem+json";

    /// Logs the rejection at a level that fits it.
    pub fn log(&self) {
        match self {
            Rejection::MissingHandle => tracing::error!(
                "no Redlock handle: bind one on the middleware, or add it to the request \
                 (axum: `.layer(Extension(redlock))` outside the lock layer; actix: `.app_data(redlock)`)"
            ),
            Rejection::Misconfigured { error } => {
                tracing::error!(%error, "lock middleware misconfigured")
            }
            Rejection::Unavailable { key, error } => {
                tracing::warn!(%key, %error, "lock backend unavailable")
            }
            Rejection::Lost { key } => tracing::warn!(%key, "lock lost while the handler ran"),
            Rejection::Busy {
                key, retry_after, ..
            } => tracing::debug!(%key, ?retry_after, "lock busy"),
            Rejection::MissingKey => tracing::debug!("request has no lock key"),
        }
    }
}

/// A lock held for one request. Dropping it releases the lock in the background
/// and closes the request's tracing span with the hold time and outcome.
pub struct RequestLock {
    guard: Option<LockGuard>,
    handle: LockHandle,
    span: tracing::Span,
    acquired: Instant,
}

impl std::fmt::Debug for RequestLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLock")
            .field("handle", &self.handle)
            .finish()
    }
}

impl RequestLock {
    /// The handle to put in the request (extensions or `ReqData`).
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
        let lost = self.handle.is_lost();
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

/// Takes the lock for one request per `policy`, with the handle the adapter found
/// (bound to the middleware, or registered on the app).
///
/// - `Ok(Some(lock))`: held, with auto-extension; keep it until the response ends.
/// - `Ok(None)`: run the request unlocked (no key and pass-through, or fail-open).
/// - `Err(rejection)`: answer with the rejection (already logged).
///
/// # Errors
/// A [`Rejection`] for busy, unavailable, missing key, missing handle or
/// misconfiguration.
pub async fn acquire(
    redlock: Option<&Redlock>,
    key: Option<String>,
    policy: &LockPolicy,
) -> Result<Option<RequestLock>, Rejection> {
    let Some(key) = key else {
        return match policy.missing_key {
            MissingKeyPolicy::PassThrough => Ok(None),
            MissingKeyPolicy::Reject => {
                let rejection = Rejection::MissingKey;
                rejection.log();
                Err(rejection)
            }
        };
    };
    let Some(redlock) = redlock else {
        let rejection = Rejection::MissingHandle;
        rejection.log();
        return Err(rejection);
    };
    let key = if policy.key_prefix.is_empty() {
        key
    } else {
        format!("{}{key}", policy.key_prefix)
    };
    let span = tracing::info_span!(
        "redlock.request",
        key = %key,
        wait_ms = tracing::field::Empty,
        hold_ms = tracing::field::Empty,
        extensions = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let started = Instant::now();
    let mut options = LockOptions::new(policy.ttl);
    if let Some(m) = policy.max_hold {
        options = options.max_hold(m);
    }
    let result = redlock
        .lock_with(&key, policy.ttl, &policy.retry())
        .instrument(span.clone())
        .await;
    span.record("wait_ms", started.elapsed().as_millis() as u64);
    let lock = match result {
        Ok(lock) => lock,
        Err(error) => {
            let key: Arc<str> = key.into();
            let rejection = match error {
                Error::Busy { retry_after, .. } => Rejection::Busy {
                    key,
                    status: policy.busy_status,
                    retry_after,
                },
                // Some node said another holder has the key: running unlocked
                // could overlap that holder, so even fail-open answers "busy".
                Error::NoQuorum { ref report, .. } if report.busy_count() > 0 => Rejection::Busy {
                    key,
                    status: policy.busy_status,
                    retry_after: report.busy_pttls().max(),
                },
                e @ (Error::NoQuorum { .. } | Error::NoValidity { .. }) => {
                    // No node that answered saw another holder (a node still
                    // pending when the attempt was decided is no evidence either
                    // way; waiting for it would make every failure as slow as
                    // the slowest node).
                    if policy.unavailable == UnavailablePolicy::FailOpen {
                        span.record("outcome", "fail_open");
                        tracing::warn!(parent: &span, error = %e, "lock backend unavailable; running unlocked (fail-open)");
                        return Ok(None);
                    }
                    Rejection::Unavailable { key, error: e }
                }
                error => Rejection::Misconfigured { error },
            };
            span.record("outcome", rejection.title());
            span.in_scope(|| rejection.log());
            return Err(rejection);
        }
    };
    let guard =
        LockGuard::new(lock, &options).map_err(|error| Rejection::Misconfigured { error })?;
    Ok(Some(RequestLock {
        handle: guard.handle(),
        guard: Some(guard),
        span,
        acquired: Instant::now(),
    }))
}

pin_project! {
    /// The handler's future, raced against the loss of the lock (see [`guard`]).
    pub struct Guarded<F> {
        #[pin]
        inner: F,
        #[pin]
        lost: Option<LostFuture>,
        key: Option<Arc<str>>,
    }
}

impl<F: Future> Future for Guarded<F> {
    type Output = Result<F::Output, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Checked before the handler runs again, and again when it finishes: a
        // handler that blocked its thread past the deadline in its last poll did
        // not run under the lock, and must not answer as if it had.
        let Poll::Ready(out) = ({
            if let Some(lost) = this.lost.as_mut().as_pin_mut()
                && lost.poll(cx).is_ready()
            {
                return Poll::Ready(Err(lost_rejection(this.key)));
            }
            this.inner.poll(cx)
        }) else {
            return Poll::Pending;
        };
        if let Some(lost) = this.lost.as_pin_mut()
            && lost.poll(cx).is_ready()
        {
            return Poll::Ready(Err(lost_rejection(this.key)));
        }
        Poll::Ready(Ok(out))
    }
}

fn lost_rejection(key: &mut Option<Arc<str>>) -> Rejection {
    let rejection = Rejection::Lost {
        key: key.take().unwrap_or_else(|| "".into()),
    };
    rejection.log();
    rejection
}

/// Runs the handler future `inner` under `lock`: with [`LostPolicy::Abort`] it
/// resolves to [`Rejection::Lost`] as soon as the lock is lost (checked against
/// the clock before every poll of `inner`, and once more when `inner` finishes),
/// and the caller
/// drops `inner`. With no lock or [`LostPolicy::Signal`], it is `inner` as is.
pub fn guard<F: Future>(inner: F, lock: Option<&RequestLock>, policy: &LockPolicy) -> Guarded<F> {
    let watch = lock.filter(|_| policy.lost == LostPolicy::Abort);
    Guarded {
        inner,
        lost: watch.map(RequestLock::lost),
        key: watch.map(|l| Arc::from(l.handle.key())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_status_and_retry_after() {
        let busy = Rejection::Busy {
            key: "k".into(),
            status: 409,
            retry_after: Some(Duration::from_millis(1200)),
        };
        assert_eq!(busy.status(), 409);
        assert_eq!(busy.retry_after_secs(), Some(2));
        let doc: serde_json::Value = serde_json::from_str(&busy.problem_json()).unwrap();
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["key"], "k");
        assert_eq!(doc["retry_after"], 2);
        let short = Rejection::Busy {
            key: "k".into(),
            status: 423,
            retry_after: Some(Duration::from_millis(10)),
        };
        assert_eq!(short.retry_after_secs(), Some(1));
        assert_eq!(short.status(), 423);
        assert_eq!(Rejection::MissingKey.status(), 400);
        assert_eq!(Rejection::MissingKey.retry_after_secs(), None);
        assert_eq!(Rejection::MissingHandle.status(), 500);
        assert_eq!(Rejection::Lost { key: "k".into() }.status(), 503);
    }

    #[test]
    fn wait_policy_retries_until_deadline() {
        let p = LockPolicy::default().wait(Duration::from_secs(3));
        assert_eq!(p.retry().overall_deadline(), Some(Duration::from_secs(3)));
        assert_eq!(LockPolicy::default().retry().max_attempts(), 1);
    }
}
