//! [`LockPolicy`]: what a per-request lock does in each case (busy, no key, no
//! quorum, lost, release), and the [`LockOptions`] it takes the lock with.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::settings::{LockOptions, RetryPolicy};

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
    /// better than an outage. Only for nodes that fail to answer (a
    /// connection refused or broken, no answer within the node timeout): a
    /// node that says another holder has the key gets the busy answer, and
    /// a node that refuses (wrong or missing credentials: `NOAUTH`,
    /// `WRONGPASS`, `NOPERM`; a replica: `READONLY`; out of memory: `OOM`;
    /// any other error reply) still gets 503. A refusal is an answer: the
    /// node is up, and running unlocked past it would hand exclusion to
    /// whatever made it refuse (a credential rotated on the nodes first, a
    /// client that filled them).
    FailOpen,
}

/// What to do when the lock is lost while the handler runs (a lock held past
/// its `max_hold` is lost too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostPolicy {
    /// Drop the handler future and answer 503 (the default), like a timeout layer.
    Abort,
    /// Let the handler run; it can watch [`LockHandle::is_lost`](crate::LockHandle::is_lost)
    /// or [`LockHandle::lost`](crate::LockHandle::lost).
    Signal,
}

/// When the lock is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasePolicy {
    /// When the response body has been fully sent, or dropped (the default).
    /// For a response that upgrades its connection ([`is_upgrade`](super::is_upgrade):
    /// a WebSocket), when the body has ended and the last handle lent to the
    /// handler has been dropped ([`RequestLock::keep_while_lent`](super::RequestLock::keep_while_lent)).
    BodyEnd,
    /// As soon as the handler has produced the response head.
    ResponseHead,
}

/// The settings of a per-request lock, shared by both web adapters.
///
/// The lock itself is taken with [`crate::Primitive::guard`](crate::Primitive::guard)
/// and the policy's [`LockOptions`] (TTL, hold cap, retry, loss margin); the rest
/// says how a request is answered when it cannot run under the lock. A
/// request holds its lock at most [`LockPolicy::DEFAULT_MAX_HOLD`] (30 s)
/// unless `max_hold` says otherwise: see there why.
///
/// # The Redis key
///
/// A request's lock lives at one Redis key, made of three parts:
///
/// ```text
/// <handle prefix> <namespace> <extracted key>
/// ""              "redlock:"  "/orders/42"        → redlock:/orders/42
/// ""              "redlock:"  "tenant=acme"       → redlock:tenant=acme
/// ""              "redlock:"  "x-tenant-id=a%2Fb" → redlock:x-tenant-id=a%2Fb
/// "app1:"         "redlock:"  "/orders/42"        → app1:redlock:/orders/42
/// ```
///
/// - the handle prefix is the [`Redlock`](crate::Redlock)'s own
///   [`RedlockBuilder::key_prefix`](crate::RedlockBuilder::key_prefix) (none by
///   default), which every lock of that handle gets, per request or not;
/// - the namespace is this policy's [`namespace`](Self::namespace) (default
///   `"redlock:"`): it keeps HTTP request locks apart from other locks of the
///   same handle;
/// - the extracted key comes from the adapter's key extractor (`by_path`,
///   `by_header`, `by_path_param`, …). Extractors that name their value
///   (`by_path_param("tenant")`, `by_header_as(.., "tenant")`) key it
///   `tenant=<value>`, so two routes that find the tenant in different places
///   share one lock; unnamed ones key it in a family of their own
///   (`by_header(x-tenant-id)`: `x-tenant-id=<value>`). The value is
///   percent-encoded, so no client value spells another family's key (see
///   [`KeyFamily`](super::KeyFamily)), and a key longer than
///   [`MAX_KEY_BYTES`](super::MAX_KEY_BYTES) is replaced by its start and a
///   digest ([`bound_key`](super::bound_key)): a client cannot make the
///   library write a long key.
///
/// [`LockHandle::resource`](crate::LockHandle::resource) is the namespace and
/// the extracted key; [`LockHandle::key`](crate::LockHandle::key) is the whole key.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::{LockOptions, RetryPolicy};
/// use redlock_core::request::LockPolicy;
///
/// let policy = LockPolicy::default()
///     .options(
///         LockOptions::new(Duration::from_secs(2))
///             .retry(RetryPolicy::deadline(Duration::from_secs(5)).with_delay(Duration::from_millis(20))),
///     )
///     .namespace("jobs:");
/// assert_eq!(policy.lock_options().ttl(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct LockPolicy {
    pub(crate) options: LockOptions,
    pub(crate) busy: BusyPolicy,
    pub(crate) busy_status: StatusCode,
    pub(crate) missing_key: MissingKeyPolicy,
    pub(crate) unavailable: UnavailablePolicy,
    pub(crate) lost: LostPolicy,
    pub(crate) release: ReleasePolicy,
    pub(crate) namespace: Arc<str>,
    /// The delay and jitter between attempts in wait mode, when set here.
    pub(crate) retry_delay: Option<(Duration, Duration)>,
    /// The response header that carries the lock's fencing token, if any.
    pub(crate) fencing_header: Option<&'static str>,
    /// Which lock a request takes.
    pub(crate) kind: super::RequestLockKind,
    /// Whether a `permits(n)` route's busy answers carry the `RateLimit`
    /// fields.
    pub(crate) rate_limit_fields: bool,
}

impl Default for LockPolicy {
    /// TTL 5 s (renewed while the handler runs), held at most
    /// [`DEFAULT_MAX_HOLD`](Self::DEFAULT_MAX_HOLD) (30 s), fail fast with 409,
    /// pass through requests with no key, fail closed with 503, abort on loss,
    /// release at body end, namespace `"redlock:"`.
    fn default() -> Self {
        Self {
            options: LockOptions::new(Duration::from_secs(5)).max_hold(Self::DEFAULT_MAX_HOLD),
            busy: BusyPolicy::FailFast,
            busy_status: StatusCode::CONFLICT,
            missing_key: MissingKeyPolicy::PassThrough,
            unavailable: UnavailablePolicy::FailClosed,
            lost: LostPolicy::Abort,
            release: ReleasePolicy::BodyEnd,
            namespace: "redlock:".into(),
            retry_delay: None,
            fencing_header: None,
            kind: super::RequestLockKind::Mutex,
            rate_limit_fields: false,
        }
    }
}

impl LockPolicy {
    /// How long a request holds its lock at most, by default: 30 s, the
    /// request timeout a web service commonly has behind a proxy or load
    /// balancer.
    ///
    /// A request's lock is taken before its body is read and held until its
    /// response body has been sent, so without a cap a client that sends its
    /// body a byte at a time, or never reads the response, holds the lock for
    /// as long as it likes. At the cap the lock is lost as if it had expired:
    /// the handler is told ([`LockHandle::is_lost`](crate::LockHandle::is_lost),
    /// [`LockHandle::lost`](crate::LockHandle::lost)), the keys are released,
    /// and per the [`LostPolicy`] the handler is dropped and the client
    /// answered 503 (a streamed body is cut off), or the handler runs on.
    /// Change it with `max_hold`, `Duration::MAX` for no cap.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_core::request::LockPolicy;
    ///
    /// let default = LockPolicy::default();
    /// assert_eq!(default.lock_options().hold_limit(), Some(LockPolicy::DEFAULT_MAX_HOLD));
    /// let long_exports = LockPolicy::default().max_hold(Duration::from_secs(600));
    /// let uncapped = LockPolicy::default().max_hold(Duration::MAX);
    /// # let _ = (long_exports, uncapped);
    /// ```
    pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(30);

    /// Which lock a request takes on its key.
    pub fn lock_kind(&self) -> super::RequestLockKind {
        self.kind
    }

    /// The busy policy.
    pub fn busy_policy(&self) -> BusyPolicy {
        self.busy
    }

    /// When the lock is released.
    pub fn release_policy(&self) -> ReleasePolicy {
        self.release
    }

    /// The response header that carries the fencing token, when one is set
    /// (see `fencing_header`).
    pub fn fencing_header_name(&self) -> Option<&'static str> {
        self.fencing_header
    }

    /// The quota a busy answer's `RateLimit` fields advertise: the number of
    /// permits, on a `permits(n)` policy that sets `rate_limit_fields`.
    pub(crate) fn rate_limit_quota(&self) -> Option<u32> {
        match self.kind {
            super::RequestLockKind::Permits(n) if self.rate_limit_fields => Some(n),
            _ => None,
        }
    }

    /// What happens on loss.
    pub fn lost_policy(&self) -> LostPolicy {
        self.lost
    }

    /// What happens to a request with no key.
    pub fn missing_key_policy(&self) -> MissingKeyPolicy {
        self.missing_key
    }

    /// The status of the busy answer.
    pub fn busy_status_code(&self) -> StatusCode {
        self.busy_status
    }

    /// The options the lock is taken and held with. Their retry policy is the
    /// one set here, if any; see [`LockPolicy::retry_for`] for the one used.
    pub fn lock_options(&self) -> &LockOptions {
        &self.options
    }

    /// The resource name of an extracted key: the namespace, then the key
    /// bounded by [`bound_key`](super::bound_key) (at most
    /// [`MAX_KEY_BYTES`](super::MAX_KEY_BYTES) bytes, a digest form past
    /// that). The handle puts its own key prefix before it (see the type's
    /// docs).
    pub fn resource_for(&self, key: &str) -> String {
        format!("{}{}", self.namespace, super::bound_key(key))
    }

    /// The retry policy of one acquire, given the handle's own
    /// ([`Redlock::retry_policy`](crate::Redlock::retry_policy)):
    ///
    /// - failing fast: one attempt;
    /// - waiting up to `timeout`: the policy's own retry
    ///   ([`LockOptions::retry`]) if set, else as many attempts as fit in the
    ///   timeout with the handle's delays; bounded by the timeout either way,
    ///   and with the delays of [`retry_delay`](Self::retry_delay) if set.
    pub fn retry_for(&self, handle: &RetryPolicy) -> RetryPolicy {
        let BusyPolicy::Wait(timeout) = self.busy else {
            return RetryPolicy::no_retry();
        };
        let mut retry = match &self.options.retry {
            Some(own) => own.clone(),
            None => RetryPolicy::deadline(timeout)
                .with_delay(handle.delay)
                .with_jitter(handle.jitter),
        };
        retry.deadline = Some(retry.deadline.map_or(timeout, |d| d.min(timeout)));
        if let Some((delay, jitter)) = self.retry_delay {
            retry = retry.with_delay(delay).with_jitter(jitter);
        }
        retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_mode_retries_until_the_deadline_with_the_handle_s_delays() {
        let handle = RetryPolicy::default().with_delay(Duration::from_millis(7));
        let p = LockPolicy::default().wait(Duration::from_secs(3));
        let retry = p.retry_for(&handle);
        assert_eq!(retry.overall_deadline(), Some(Duration::from_secs(3)));
        assert_eq!(retry.delay, Duration::from_millis(7));
        assert_eq!(retry.max_attempts(), u32::MAX);
        assert_eq!(LockPolicy::default().retry_for(&handle).max_attempts(), 1);
    }

    #[test]
    fn the_policy_s_own_retry_wins_and_retry_delay_wins_over_it() {
        let handle = RetryPolicy::default();
        let own = RetryPolicy::attempts(4).with_delay(Duration::from_millis(300));
        let p = LockPolicy::default()
            .options(LockOptions::new(Duration::from_secs(1)).retry(own))
            .ttl(Duration::from_secs(2));
        assert_eq!(p.busy_policy(), BusyPolicy::Wait(Duration::MAX));
        assert_eq!(p.lock_options().ttl(), Duration::from_secs(2));
        let retry = p.retry_for(&handle);
        assert_eq!(retry.max_attempts(), 4);
        assert_eq!(retry.delay, Duration::from_millis(300));
        let p = p
            .wait(Duration::from_secs(1))
            .retry_delay(Duration::from_millis(5), Duration::ZERO);
        let retry = p.retry_for(&handle);
        assert_eq!(retry.overall_deadline(), Some(Duration::from_secs(1)));
        assert_eq!(
            (retry.delay, retry.jitter),
            (Duration::from_millis(5), Duration::ZERO)
        );
        assert_eq!(p.fail_fast().retry_for(&handle).max_attempts(), 1);
    }

    #[test]
    fn a_request_s_hold_is_capped_by_default_and_options_keep_the_cap() {
        let cap = |p: &LockPolicy| p.lock_options().hold_limit();
        assert_eq!(cap(&LockPolicy::default()), Some(Duration::from_secs(30)));
        let p = LockPolicy::default().options(LockOptions::new(Duration::from_secs(2)));
        assert_eq!(cap(&p), Some(LockPolicy::DEFAULT_MAX_HOLD));
        let p = p.max_hold(Duration::from_secs(3));
        assert_eq!(cap(&p), Some(Duration::from_secs(3)));
        let own = LockOptions::new(Duration::from_secs(2)).max_hold(Duration::MAX);
        assert_eq!(
            cap(&LockPolicy::default().options(own)),
            Some(Duration::MAX)
        );
    }

    #[test]
    fn only_permits_with_the_opt_in_have_a_rate_limit_quota() {
        let p = LockPolicy::default();
        assert_eq!(p.clone().permits(3).rate_limit_quota(), None);
        assert_eq!(p.clone().rate_limit_fields().rate_limit_quota(), None);
        let both = p.rate_limit_fields().permits(3);
        assert_eq!(both.rate_limit_quota(), Some(3));
        assert_eq!(both.shared_for_safe_methods().rate_limit_quota(), None);
    }

    #[test]
    fn busy_status_and_namespace() {
        let p = LockPolicy::default()
            .busy_status(StatusCode::LOCKED)
            .namespace("jobs:");
        assert_eq!(p.busy_status_code(), StatusCode::LOCKED);
        assert_eq!(p.resource_for("7"), "jobs:7");
    }
}
