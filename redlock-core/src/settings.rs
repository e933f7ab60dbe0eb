//! *Layer 2, one master and its options (see `lib.rs`).*
//!
//! The settings of a handle, the retry policy (spec step 5's "retry after a
//! random delay") and the per-lock options. A leaf module: plain data.

use std::time::Duration;

use crate::error::Error;
use crate::fencing::FencingMode;

/// How [`crate::Primitive::acquire`](crate::Primitive::acquire) retries a failed attempt.
///
/// Every failed attempt is released on all nodes. Retries stop after
/// `max_attempts`, or when the next attempt could not finish before the
/// `deadline`, whichever comes first: every attempt counts, however it was
/// started.
///
/// When the next attempt starts depends on
/// [`RedlockBuilder::wake_on_release`](crate::RedlockBuilder::wake_on_release):
///
/// - **on** (the default): the waiters of a key in one process queue first
///   come, first served, and only the first one contends on the nodes. After
///   its first failed attempt it subscribes to the key's release messages on
///   every node and makes a second attempt at once (a release in between is
///   not missed). After that it attempts when a release is announced, when the
///   holder's key expires (from the `PTTL` the busy answer gave), or after
///   `delay + random(0..=jitter)`, a safety-net poll, whichever comes first.
/// - **off**: each waiter polls on its own, the next attempt starting after
///   `delay + random(0..=jitter)`. The random part keeps competing clients from
///   retrying in lockstep (the distlock page's "split brain" advice).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    pub(crate) delay: Duration,
    pub(crate) jitter: Duration,
}

impl Default for RetryPolicy {
    /// 10 attempts, 100 ms apart plus up to 100 ms of jitter: about 1.5 s of waiting.
    fn default() -> Self {
        Self {
            max_attempts: 10,
            deadline: None,
            delay: Duration::from_millis(100),
            jitter: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry (what [`crate::Primitive::try_acquire`](crate::Primitive::try_acquire) does).
    pub fn no_retry() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Up to `n` attempts in all (at least one).
    pub fn attempts(n: u32) -> Self {
        Self {
            max_attempts: n.max(1),
            ..Self::default()
        }
    }

    /// As many attempts as fit in `deadline`, counted from the first attempt.
    pub fn deadline(deadline: Duration) -> Self {
        Self {
            max_attempts: u32::MAX,
            deadline: Some(deadline),
            ..Self::default()
        }
    }

    /// Sets the fixed part of the delay between attempts.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the random part of the delay between attempts (uniform in `0..=jitter`).
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Caps the number of attempts (at least one).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Caps the total time spent, counted from the first attempt.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The largest number of attempts this policy makes.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The overall deadline, if any.
    pub fn overall_deadline(&self) -> Option<Duration> {
        self.deadline
    }
}

/// Options for a lock held with auto-extension ([`crate::Primitive::guard`](crate::Primitive::guard) and
/// [`crate::Primitive::run`](crate::Primitive::run)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) loss_margin: Option<Duration>,
    pub(crate) check_deadline: bool,
    /// `Some`: a per-request resource, whose Durable counter expires (see
    /// [`LockOptions::fence_retention`]).
    pub(crate) fence_retention: Option<Duration>,
}

impl LockOptions {
    /// Holds the lock with keys of this TTL, renewed while the work runs.
    ///
    /// The TTL is how long other clients wait if this process dies while it holds
    /// the lock; renewal keeps it alive for as long as the work takes.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            max_hold: None,
            retry: None,
            loss_margin: None,
            check_deadline: true,
            fence_retention: None,
        }
    }

    /// Holds the lock at most this long, counted from the start of the
    /// attempt that took it: renewals shorten the keys so they expire then,
    /// the holder is told the lock is lost then
    /// ([`LockHandle::is_lost`](crate::LockHandle::is_lost),
    /// [`LockHandle::lost`](crate::LockHandle::lost)), even when the TTL is
    /// longer, and the lock is released. `Duration::MAX` means no cap. No cap
    /// by default here; a per-request lock (`request::LockPolicy`, the `http`
    /// feature) has one by default. Without it, a lock with a
    /// [`fence_retention`](Self::fence_retention) under
    /// [`FencingMode::Durable`] is held at most one hour, the hold its
    /// counter's expiry covers.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Acquires with this retry policy instead of the handle's default.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// How long before the end of the confirmed validity the holder is told the
    /// lock is lost (default: the handle's [`RedlockBuilder::loss_margin`](crate::RedlockBuilder::loss_margin), which
    /// defaults to the node timeout). Must be shorter than the TTL.
    ///
    /// What it buys: work that checks [`LockHandle::is_lost`](crate::LockHandle::is_lost)
    /// and then starts a write has at least this long for the write to land
    /// before another client can take the lock, and the clock check is made
    /// this much earlier than the keys can expire. What no client-side check can
    /// buy: a holder paused *between* its check and its write (a GC pause, a
    /// stopped process, a slow network) still writes late. Only the protected
    /// resource can refuse such a write, by a fencing token.
    pub fn loss_margin(mut self, margin: Duration) -> Self {
        self.loss_margin = Some(margin);
        self
    }

    /// Test-only: the holder's view ignores the clock and trusts the renewal
    /// task alone, as before the deadline check existed. The fault suite's
    /// negative control uses it to show the checker catches what the deadline
    /// check prevents. Never use it elsewhere.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn without_deadline_check_for_tests(mut self) -> Self {
        self.check_deadline = false;
        self
    }

    /// Marks the resource as per-request (named by a client, not by the
    /// program): under [`FencingMode::Durable`] its fence counter then
    /// expires instead of living for ever, `keep` being how long anything
    /// may still compare a token of it after the lock's keys are gone
    /// (default: none, the counter never expires). The web layers set it for
    /// every lock they take (a day by default, `fence_retention` on their
    /// policy), the idempotency layer to its records' TTL.
    ///
    /// The rule: every fence sets the counter's expiry to the hold cap
    /// ([`max_hold`](Self::max_hold); one hour when none is set, and the
    /// lock is then held at most that long), plus the TTL, plus `keep`,
    /// plus a hundredth of those and one second for the nodes' clocks. When
    /// the counter has expired, the next holder's token may start again
    /// lower.
    ///
    /// What it means for a store that compares the tokens: tokens still grow
    /// from holder to holder as long as each lock is fenced within that
    /// expiry of the one before; after a longer idle gap they may start
    /// over. That is harmless when nothing compares a token any more by
    /// then: a record the nodes accept only under the lock key (the
    /// idempotency layer's) and that expires within `keep`, or a store that
    /// drops its record of the resource within `keep`. A store that keeps
    /// the last token longer refuses the new, lower tokens (as stale) until
    /// they pass it; a holder paused for longer than the expiry may have its
    /// late write accepted after a newer holder's. Give such resources a
    /// `keep` at least as long as the store keeps its tokens (or name them
    /// in the program, without a retention). Under
    /// [`FencingMode::Hybrid`] this changes nothing: those counters expire
    /// by their own rule.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_core::LockOptions;
    ///
    /// let per_request = LockOptions::new(Duration::from_secs(5))
    ///     .max_hold(Duration::from_secs(30))
    ///     .fence_retention(Duration::from_secs(24 * 3600));
    /// assert_eq!(per_request.current_fence_retention(), Some(Duration::from_secs(24 * 3600)));
    /// ```
    pub fn fence_retention(mut self, keep: Duration) -> Self {
        self.fence_retention = Some(keep);
        self
    }

    /// The retention set with [`fence_retention`](Self::fence_retention), if any.
    pub fn current_fence_retention(&self) -> Option<Duration> {
        self.fence_retention
    }

    /// The TTL of each key.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The cap set with [`max_hold`](Self::max_hold), if any
    /// (`Duration::MAX` is no cap).
    pub fn hold_limit(&self) -> Option<Duration> {
        self.max_hold
    }

    /// How long the lock is held at most under `fencing`: its `max_hold`,
    /// or, for a retained Durable counter without one, the cap the counter's
    /// expiry covers.
    pub(crate) fn hold_cap(&self, fencing: Option<FencingMode>) -> Option<Duration> {
        match (self.max_hold, self.fence_retention, fencing) {
            (None, Some(_), Some(FencingMode::Durable)) => Some(crate::fencing::RETAINED_HOLD_CAP),
            (max_hold, _, _) => max_hold,
        }
    }

    /// The expiry a fence gives this lock's counter under `fencing`, when it
    /// is a retained Durable counter (see [`fence_retention`](Self::fence_retention)).
    pub(crate) fn retained_counter_ttl(&self, fencing: Option<FencingMode>) -> Option<Duration> {
        let keep = self.fence_retention?;
        let hold = self.hold_cap(fencing)?;
        (fencing == Some(FencingMode::Durable))
            .then(|| crate::fencing::retained_counter_ttl(hold, self.ttl, keep))
    }
}

/// Settings shared by every call on one [`Redlock`](crate::Redlock).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) fixed_drift: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) key_prefix: String,
    pub(crate) min_ttl: Duration,
    pub(crate) max_ttl: Duration,
    pub(crate) max_extensions: Option<u32>,
    /// `None`: the node timeout.
    pub(crate) loss_margin: Option<Duration>,
    /// `None`: no fencing tokens, no fence round trip.
    pub(crate) fencing: Option<FencingMode>,
    /// How long a [`FencingMode::Hybrid`] counter lives without a fence (at
    /// least the floor of `fencing::counter_ttl`).
    pub(crate) fence_counter_ttl: Duration,
    /// Waiters queue locally and are woken by releases (else they poll).
    pub(crate) wake_on_release: bool,
    /// Where release and extend may use the nodes' own commands.
    pub(crate) native_commands: crate::node::NativeCommands,
    /// Whether plain calls queued behind a node's busy connection go out
    /// together (`node/coalesce.rs`; off by default, issue 50).
    pub(crate) coalesce: bool,
    /// The opt-in `key` label of the metrics (none by default).
    pub(crate) metrics_key: Option<crate::metrics::KeyLabel>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            fixed_drift: Duration::from_millis(2),
            retry: RetryPolicy::default(),
            key_prefix: String::new(),
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(24 * 3600),
            max_extensions: None,
            loss_margin: None,
            fencing: None,
            fence_counter_ttl: crate::fencing::DEFAULT_FENCE_COUNTER_TTL,
            wake_on_release: true,
            native_commands: crate::node::NativeCommands::default(),
            coalesce: false,
            metrics_key: None,
        }
    }
}

impl Settings {
    /// Refuses settings no lock could be taken with.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let s = self;
        if !(0.0..0.5).contains(&s.drift_factor) {
            return Err(Error::InvalidConfig(format!(
                "drift_factor {} must be in 0.0..0.5",
                s.drift_factor
            )));
        }
        if s.node_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "node_timeout must be above zero".into(),
            ));
        }
        // Keys are set in whole milliseconds, and `PEXPIRE 0` deletes a key.
        if s.min_ttl < Duration::from_millis(1) || s.min_ttl > s.max_ttl {
            return Err(Error::InvalidConfig(format!(
                "ttl bounds {:?}..={:?} are empty or start under 1 ms",
                s.min_ttl, s.max_ttl
            )));
        }
        if s.fence_counter_ttl < crate::fencing::MIN_FENCE_COUNTER_TTL {
            return Err(Error::InvalidConfig(format!(
                "fence_counter_ttl {:?} is under the floor of {:?}",
                s.fence_counter_ttl,
                crate::fencing::MIN_FENCE_COUNTER_TTL
            )));
        }
        if s.node_timeout >= s.max_ttl {
            return Err(Error::NodeTimeoutTooLong {
                node_timeout: s.node_timeout,
                ttl: s.max_ttl,
            });
        }
        Ok(())
    }
}
