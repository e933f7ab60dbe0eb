//! The policy's setters, written once: [`LockPolicy`](super::LockPolicy) and the
//! builders of both web adapters (`RedlockLayer`, `RedlockMiddleware`) get them
//! from [`lock_policy_setters!`](crate::lock_policy_setters), as tower-http's
//! services get their accessors from one macro.
//!
//! A generated setter turns its arguments into a [`Setting`] and hands it to a
//! method of the type it is generated in: `LockPolicy` applies it to itself, an
//! adapter's builder to the policy it holds.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::policy::{
    BusyPolicy, LockPolicy, LostPolicy, MissingKeyPolicy, ReleasePolicy, UnavailablePolicy,
};
use crate::settings::LockOptions;

/// One change to a [`LockPolicy`], made by a generated setter. Not for direct use.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum Setting {
    Ttl(Duration),
    Wait(Duration),
    FailFast,
    BusyStatus(u16),
    MissingKey(MissingKeyPolicy),
    FailOpen,
    Lost(LostPolicy),
    Release(ReleasePolicy),
    MaxHold(Duration),
    Namespace(Arc<str>),
    RetryDelay(Duration, Duration),
    LossMargin(Duration),
    Options(LockOptions),
    FencingHeader(&'static str),
    FenceRetention(Duration),
    Permits(u32),
    SharedForSafeMethods,
    RateLimitFields,
}

// The setters of `LockPolicy` itself live here, beside the `Setting` they
// make, so the policy's module needs nothing from this one.
impl LockPolicy {
    crate::lock_policy_setters!(apply = apply_setting, status = http::StatusCode);

    fn apply_setting(self, setting: Setting) -> Self {
        setting.apply(self)
    }
}

impl Setting {
    /// `policy` with this setting applied.
    pub fn apply(self, mut policy: LockPolicy) -> LockPolicy {
        match self {
            Setting::Ttl(ttl) => policy.options.ttl = ttl,
            Setting::Wait(timeout) => policy.busy = BusyPolicy::Wait(timeout),
            Setting::FailFast => policy.busy = BusyPolicy::FailFast,
            // The setters take a status code and pass its number (actix-web 4
            // has its own `StatusCode` type), so the number is always valid.
            Setting::BusyStatus(code) => {
                policy.busy_status = StatusCode::from_u16(code).unwrap_or(StatusCode::CONFLICT)
            }
            Setting::MissingKey(missing) => policy.missing_key = missing,
            Setting::FailOpen => policy.unavailable = UnavailablePolicy::FailOpen,
            Setting::Lost(lost) => policy.lost = lost,
            Setting::Release(release) => policy.release = release,
            Setting::MaxHold(max_hold) => policy.options.max_hold = Some(max_hold),
            Setting::Namespace(namespace) => policy.namespace = namespace,
            Setting::RetryDelay(delay, jitter) => policy.retry_delay = Some((delay, jitter)),
            Setting::LossMargin(margin) => policy.options.loss_margin = Some(margin),
            Setting::FencingHeader(name) => policy.fencing_header = Some(name),
            Setting::FenceRetention(keep) => policy.options.fence_retention = Some(keep),
            Setting::Permits(n) => {
                policy.kind = super::RequestLockKind::Permits(n);
                policy.busy_status = StatusCode::TOO_MANY_REQUESTS;
            }
            Setting::SharedForSafeMethods => {
                policy.kind = super::RequestLockKind::SharedForSafeMethods
            }
            Setting::RateLimitFields => policy.rate_limit_fields = true,
            Setting::Options(mut options) => {
                if let Some(retry) = &options.retry {
                    policy.busy = BusyPolicy::Wait(retry.deadline.unwrap_or(Duration::MAX));
                }
                // Options with no cap of their own keep the policy's: a
                // request's hold stays bounded unless the cap is set.
                options.max_hold = options.max_hold.or(policy.options.max_hold);
                options.fence_retention =
                    options.fence_retention.or(policy.options.fence_retention);
                policy.options = options;
            }
        }
        policy
    }
}

/// Defines the lock policy's setters in an `impl` block: `ttl`, `wait`,
/// `fail_fast`, `busy_status`, `on_missing_key`, `fail_open`, `on_lost`,
/// `release_on`, `max_hold`, `namespace`, `retry_delay`, `loss_margin`,
/// `options`, `fencing_header`, `fence_retention`, `permits`,
/// `shared_for_safe_methods` and `rate_limit_fields`.
///
/// `apply` names a method `fn(self, Setting) -> Self` of the type (it applies
/// the setting to the policy the type holds); `status` is the type of status
/// code `busy_status` takes (anything with `as_u16()`, so actix-web 4's
/// `http` 0.2 status works as well as `http` 1's).
#[doc(hidden)]
#[macro_export]
macro_rules! lock_policy_setters {
    (apply = $apply:ident, status = $status:ty) => {
        /// The TTL of the lock keys (default 5 s). The lock is renewed while the
        /// request runs, so this is only how long other replicas wait for a
        /// key whose holder crashed.
        pub fn ttl(self, ttl: ::std::time::Duration) -> Self {
            self.$apply($crate::request::__private::Setting::Ttl(ttl))
        }

        /// Waits up to `timeout` for a busy lock, then answers busy (default:
        /// answer at once). Attempts are spaced by the handle's retry delays
        /// (`RedlockBuilder::retry`), unless this policy sets its own with
        /// `retry_delay` or `options(LockOptions::new(..).retry(..))`.
        pub fn wait(self, timeout: ::std::time::Duration) -> Self {
            self.$apply($crate::request::__private::Setting::Wait(timeout))
        }

        /// Answers a busy lock at once, after one attempt (the default).
        pub fn fail_fast(self) -> Self {
            self.$apply($crate::request::__private::Setting::FailFast)
        }

        /// The status of the busy answer (default `409 Conflict`; `423 Locked`
        /// and `429 Too Many Requests` are other common choices).
        pub fn busy_status(self, status: $status) -> Self {
            self.$apply($crate::request::__private::Setting::BusyStatus(
                status.as_u16(),
            ))
        }

        /// What to do with a request that yields no key (default: run it
        /// unlocked; `MissingKeyPolicy::Reject` answers 400).
        pub fn on_missing_key(self, policy: $crate::request::MissingKeyPolicy) -> Self {
            self.$apply($crate::request::__private::Setting::MissingKey(policy))
        }

        /// Runs requests unlocked when no quorum of nodes answers (default:
        /// 503, fail closed). Only connection errors, broken connections and
        /// node timeouts count as no answer. Never when a node that answered
        /// said another holder has the key: that request gets the busy
        /// answer instead; nor when a node refused: wrong or missing
        /// credentials (`NOAUTH`, `WRONGPASS`, `NOPERM`), a replica
        /// (`READONLY`), out of memory (`OOM`) or any other error reply, or a
        /// fencing lock's fence failed: those get 503. A refusal is an
        /// answer, not an outage.
        pub fn fail_open(self) -> Self {
            self.$apply($crate::request::__private::Setting::FailOpen)
        }

        /// What to do when the lock is lost while the handler runs, or held
        /// past `max_hold` (default
        /// `LostPolicy::Abort`: drop the handler future and answer 503, and cut
        /// off a streamed body that holds the lock).
        pub fn on_lost(self, policy: $crate::request::LostPolicy) -> Self {
            self.$apply($crate::request::__private::Setting::Lost(policy))
        }

        /// When to release the lock (default `ReleasePolicy::BodyEnd`: once the
        /// response body has been sent, or dropped).
        pub fn release_on(self, policy: $crate::request::ReleasePolicy) -> Self {
            self.$apply($crate::request::__private::Setting::Release(policy))
        }

        /// Holds a request's lock at most this long (default 30 s,
        /// `LockPolicy::DEFAULT_MAX_HOLD`; `Duration::MAX` for no cap). A
        /// client that trickles its body or never reads the response would
        /// otherwise hold the lock as long as it likes. At the cap the lock is
        /// lost: the handler's `LockHandle::is_lost()` turns true and `lost()`
        /// completes, the keys are released, and per `on_lost` the handler is
        /// dropped and the client answered 503 (the default) or the handler
        /// runs on, unlocked.
        pub fn max_hold(self, max_hold: ::std::time::Duration) -> Self {
            self.$apply($crate::request::__private::Setting::MaxHold(max_hold))
        }

        /// The namespace put before every extracted key (default
        /// `"redlock:"`). The handle's own key prefix, if it has one, comes
        /// before it: the Redis key is handle prefix + namespace + extracted
        /// key (see "The Redis key" in `LockPolicy`'s docs).
        pub fn namespace(
            self,
            namespace: impl ::std::convert::Into<::std::sync::Arc<str>>,
        ) -> Self {
            self.$apply($crate::request::__private::Setting::Namespace(
                namespace.into(),
            ))
        }

        /// The fixed and random parts of the delay between attempts in wait
        /// mode (default: those of the policy's own retry, else the handle's).
        pub fn retry_delay(
            self,
            delay: ::std::time::Duration,
            jitter: ::std::time::Duration,
        ) -> Self {
            self.$apply($crate::request::__private::Setting::RetryDelay(
                delay, jitter,
            ))
        }

        /// How long before the end of the lock's confirmed validity the
        /// handler is told it is lost (default: the handle's loss margin,
        /// which defaults to its node timeout). Must be shorter than the TTL.
        pub fn loss_margin(self, margin: ::std::time::Duration) -> Self {
            self.$apply($crate::request::__private::Setting::LossMargin(margin))
        }

        /// Takes the lock with these options: TTL, hold cap, retry and loss
        /// margin all at once (options without a hold cap keep the policy's,
        /// 30 s by default). With a retry policy, busy requests wait per it
        /// (its attempts, deadline and delays), as if `wait` had been called
        /// with its deadline; `wait`, `fail_fast` and `retry_delay` called
        /// afterwards still apply.
        pub fn options(self, options: $crate::LockOptions) -> Self {
            self.$apply($crate::request::__private::Setting::Options(options))
        }

        /// Also sends the lock's fencing token (a handle built with
        /// `RedlockBuilder::fencing`) in this response header, e.g.
        /// `"x-fencing-token"`, so a client can carry it to a store that checks
        /// it. The handler always finds the token in the request, as a
        /// `FencingToken` extension. A name that is not a valid header name is
        /// ignored.
        pub fn fencing_header(self, name: &'static str) -> Self {
            self.$apply($crate::request::__private::Setting::FencingHeader(name))
        }

        /// Under `FencingMode::Durable`, how long a store may still compare
        /// a token of a request's resource after its lock is gone (default:
        /// one day). A request's key is chosen by its client, so its fence
        /// counter does not live for ever: it expires this long, plus the
        /// hold cap (`max_hold`, one hour when none is set) and the TTL, after
        /// the lock's fence, and tokens of the resource may then start over.
        /// Set it at least as long as the store that checks the tokens keeps
        /// them (see `LockOptions::fence_retention` for what it means). The
        /// idempotency layer uses its records' TTL.
        pub fn fence_retention(self, keep: ::std::time::Duration) -> Self {
            self.$apply($crate::request::__private::Setting::FenceRetention(keep))
        }

        /// At most `n` requests per key at once, across every replica (a
        /// quorum semaphore: `Redlock::semaphore`) instead of one. A
        /// request over the limit is answered busy: `429 Too Many Requests`
        /// with `Retry-After` and problem+json (`busy_status` called
        /// afterwards changes the status; `wait` waits for a permit). `n`
        /// from 1 to `redlock_core::MAX_PERMITS`; another is a
        /// misconfiguration, answered 500, and so is a request whose key
        /// extractor finds several keys (several keys are locked together
        /// only as one mutex; never taken as the mutex instead).
        pub fn permits(self, n: u32) -> Self {
            self.$apply($crate::request::__private::Setting::Permits(n))
        }

        /// `GET`, `HEAD` and `OPTIONS` requests take a read share of their
        /// key, which they hold together; every other method takes the write
        /// lock, alone (`Redlock::rw_lock`, with writer preference). A
        /// request whose key extractor finds several keys is a
        /// misconfiguration, answered 500 (several keys are locked together
        /// only as one mutex; never taken as the mutex instead).
        pub fn shared_for_safe_methods(self) -> Self {
            self.$apply($crate::request::__private::Setting::SharedForSafeMethods)
        }

        /// Under `permits(n)`, also sends the `RateLimit-Policy` and
        /// `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers-11 on
        /// the busy answers (`Retry-After` stays), so that clients and
        /// gateways that read them back off:
        ///
        /// ```text
        /// RateLimit-Policy: "permits";q=2;qu="concurrent-requests"
        /// RateLimit: "permits";r=0;t=3
        /// ```
        ///
        /// `q` is `n` in the draft's unit for requests at once, `t` the
        /// `Retry-After` seconds. Off by default: the draft makes the fields
        /// optional, and they tell any client the route's limit. The policy
        /// is named `"permits"` and nothing from the request (the key is the
        /// client's choice) goes into either field. Other kinds of lock, and
        /// other answers, never carry them. An app's own rejection handler
        /// finds them in `Rejection::rate_limit_fields`.
        ///
        /// ```
        /// use redlock_core::request::LockPolicy;
        ///
        /// let policy = LockPolicy::default().permits(2).rate_limit_fields();
        /// # let _ = policy;
        /// ```
        pub fn rate_limit_fields(self) -> Self {
            self.$apply($crate::request::__private::Setting::RateLimitFields)
        }
    };
}
