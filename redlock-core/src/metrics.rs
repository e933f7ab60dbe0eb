//! Lock metrics through the [`metrics`](https://docs.rs/metrics) facade (the
//! `metrics` feature): every name, kind, unit and label is in [`METRICS`], so
//! the README's table is checked against this one list.
//!
//! Nothing is recorded until the application installs a recorder (e.g.
//! `metrics-exporter-prometheus`); without the feature every hook compiles to
//! nothing. No metric carries the resource key unless the application opts in
//! with `RedlockBuilder::metrics_key_label` (feature `metrics`),
//! whose closure maps keys to a bounded set of `&'static str` (a key's class,
//! never the key itself).
//!
//! Node errors carry the node's label: its address, never its password.

use std::time::Duration;

use crate::error::{Error, NodeError};

/// The kind of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

/// One metric: what the README's table lists.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// The Prometheus name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Its labels (`key` only with `RedlockBuilder::metrics_key_label`).
    pub labels: &'static [&'static str],
    /// What it counts.
    pub help: &'static str,
}

/// Acquire calls (`acquire`, `try_acquire`, `acquire_with`, guards), whole call with
/// its retries.
pub const ACQUIRE_DURATION: &str = "redlock_acquire_duration_seconds";
/// How long calls that may retry spent before they got the lock or gave up.
pub const WAIT_DURATION: &str = "redlock_wait_duration_seconds";
/// Calls waiting for a lock now.
pub const WAITERS: &str = "redlock_waiters";
/// From acquire to release (or drop).
pub const HOLD_DURATION: &str = "redlock_hold_duration_seconds";
/// Locks held by this process now.
pub const HELD: &str = "redlock_held_locks";
/// Extend calls by outcome.
pub const EXTENSIONS: &str = "redlock_extensions_total";
/// Auto-extended locks lost, by cause.
pub const LOSSES: &str = "redlock_losses_total";
/// Releases by outcome.
pub const RELEASES: &str = "redlock_releases_total";
/// Failed node calls, by node and error kind.
pub const NODE_ERRORS: &str = "redlock_node_errors_total";
/// Fenced acquires whose fence phase found no quorum.
pub const FENCE_REFUSALS: &str = "redlock_fence_refusals_total";
/// Requests through the web adapters, by outcome.
pub const REQUESTS: &str = "redlock_requests_total";
/// Semaphore permits held by this process now.
pub const PERMITS_HELD: &str = "redlock_permits_held";
/// Calls waiting for a semaphore permit now.
pub const PERMIT_WAITERS: &str = "redlock_permit_waiters";
/// Read shares and write locks of read/write locks held by this process now.
pub const SHARES_HELD: &str = "redlock_shares_held";
/// Calls waiting for a read share or a write lock now.
pub const SHARE_WAITERS: &str = "redlock_share_waiters";

/// Every metric this crate records.
pub const METRICS: &[Metric] = &[
    Metric {
        name: ACQUIRE_DURATION,
        kind: Kind::Histogram,
        labels: &["outcome", "key"],
        help: "Acquire calls, retries included; outcome: acquired, busy, no_quorum, error",
    },
    Metric {
        name: WAIT_DURATION,
        kind: Kind::Histogram,
        labels: &["key"],
        help: "Time calls that may retry spent before they got the lock or gave up",
    },
    Metric {
        name: WAITERS,
        kind: Kind::Gauge,
        labels: &[],
        help: "Calls that may retry, waiting for a lock now",
    },
    Metric {
        name: HOLD_DURATION,
        kind: Kind::Histogram,
        labels: &["key"],
        help: "Time from acquire to release or drop",
    },
    Metric {
        name: HELD,
        kind: Kind::Gauge,
        labels: &[],
        help: "Locks this process holds now",
    },
    Metric {
        name: EXTENSIONS,
        kind: Kind::Counter,
        labels: &["outcome", "key"],
        help: "Extends; outcome: extended, not_held, no_quorum, expired, error",
    },
    Metric {
        name: LOSSES,
        kind: Kind::Counter,
        labels: &["cause", "key"],
        help: "Auto-extended locks lost; cause: expired, refused, renewal_failed, max_hold",
    },
    Metric {
        name: RELEASES,
        kind: Kind::Counter,
        labels: &["outcome", "key"],
        help: "Releases; outcome: confirmed (at quorum), unconfirmed",
    },
    Metric {
        name: NODE_ERRORS,
        kind: Kind::Counter,
        labels: &["node", "kind"],
        help: "Failed node calls; node: its address (no password); kind: connect, io, timeout, wrong_type, noscript, read_only, oom, auth, loading, busy_script, server, protocol, replica_acks, no_waitaof, master_changed, permits_mismatch",
    },
    Metric {
        name: FENCE_REFUSALS,
        kind: Kind::Counter,
        labels: &["key"],
        help: "Fenced acquires whose fence phase found no quorum",
    },
    Metric {
        name: REQUESTS,
        kind: Kind::Counter,
        labels: &["outcome", "key"],
        help: "Requests through redlock-tower / redlock-actix; outcome: locked, busy, unavailable, unlocked (no key, fail-open), error; and lost, counted again for a locked request whose lock was lost",
    },
    Metric {
        name: PERMITS_HELD,
        kind: Kind::Gauge,
        labels: &["key"],
        help: "Semaphore permits this process holds now (also in redlock_held_locks)",
    },
    Metric {
        name: PERMIT_WAITERS,
        kind: Kind::Gauge,
        labels: &["key"],
        help: "Calls that may retry, waiting for a semaphore permit now (also in redlock_waiters)",
    },
    Metric {
        name: SHARES_HELD,
        kind: Kind::Gauge,
        labels: &["access", "key"],
        help: "Read/write locks this process holds now; access: shared (a read share), exclusive (the write lock); also in redlock_held_locks",
    },
    Metric {
        name: SHARE_WAITERS,
        kind: Kind::Gauge,
        labels: &["access", "key"],
        help: "Calls that may retry, waiting for a read share or the write lock now; access: shared, exclusive (also in redlock_waiters)",
    },
];

/// Registers every metric's description and unit with the installed recorder
/// (Prometheus `# HELP` lines). Call once after installing it; recording
/// works without it.
#[cfg(feature = "metrics")]
pub fn describe() {
    for m in METRICS {
        let help = m.help;
        let seconds = m.name.ends_with("_seconds");
        match (m.kind, seconds) {
            (Kind::Counter, _) => metrics::describe_counter!(m.name, help),
            (Kind::Gauge, _) => metrics::describe_gauge!(m.name, help),
            (Kind::Histogram, true) => {
                metrics::describe_histogram!(m.name, metrics::Unit::Seconds, help);
            }
            (Kind::Histogram, false) => metrics::describe_histogram!(m.name, help),
        }
    }
}

/// The opt-in `key` label: maps a resource key to one of a bounded set of
/// names.
#[derive(Clone)]
pub(crate) struct KeyLabel(pub(crate) std::sync::Arc<dyn Fn(&str) -> &'static str + Send + Sync>);

impl std::fmt::Debug for KeyLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyLabel(..)")
    }
}

/// Counts a waiting call in [`WAITERS`] while it lives (a cancelled call too).
pub(crate) struct Waiting(());

impl Waiting {
    pub(crate) fn start() -> Self {
        waiters(1.0);
        Self(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        waiters(-1.0);
    }
}

/// What a permit or share gauge counts: a semaphore's permits, or one side
/// of a read/write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Of {
    Permit,
    Shared,
    Exclusive,
}

/// What an acquire call came to.
pub(crate) fn acquire_outcome<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(Error::Busy { .. }) => "busy",
        Err(Error::NoQuorum { report, .. }) if report.busy_count() > 0 => "busy",
        Err(Error::NoQuorum { .. } | Error::NoValidity { .. } | Error::NoFenceQuorum { .. }) => {
            "no_quorum"
        }
        Err(_) => "error",
    }
}

/// The `kind` label of a node error.
pub(crate) fn error_kind(e: &NodeError) -> &'static str {
    match e {
        NodeError::Connect(_) => "connect",
        NodeError::Io(_) => "io",
        NodeError::Timeout(_) => "timeout",
        NodeError::WrongType { .. } => "wrong_type",
        NodeError::NoScript(_) => "noscript",
        NodeError::ReadOnly => "read_only",
        NodeError::OutOfMemory => "oom",
        NodeError::Auth(_) => "auth",
        NodeError::Loading => "loading",
        NodeError::ScriptBusy => "busy_script",
        NodeError::Server { .. } => "server",
        NodeError::Protocol(_) => "protocol",
        NodeError::ReplicaAcks { .. } => "replica_acks",
        NodeError::NoWaitAof(_) => "no_waitaof",
        NodeError::MasterChanged { .. } => "master_changed",
        NodeError::PermitsMismatch { .. } => "permits_mismatch",
    }
}

#[cfg(feature = "metrics")]
mod record {
    use super::*;

    macro_rules! labels {
        ($key:expr $(, $name:literal => $value:expr)*) => {{
            let mut l: Vec<metrics::Label> = vec![$(metrics::Label::new($name, $value)),*];
            if let Some(k) = $key {
                l.push(metrics::Label::new("key", k));
            }
            l
        }};
    }

    pub(crate) fn acquired(
        key: Option<&'static str>,
        outcome: &'static str,
        elapsed: Duration,
        waited: bool,
    ) {
        metrics::histogram!(ACQUIRE_DURATION, labels!(key, "outcome" => outcome)).record(elapsed);
        if waited {
            metrics::histogram!(WAIT_DURATION, labels!(key)).record(elapsed);
        }
    }

    pub(crate) fn waiters(delta: f64) {
        metrics::gauge!(WAITERS).increment(delta);
    }

    pub(crate) fn held(key: Option<&'static str>, released_after: Option<Duration>) {
        match released_after {
            None => metrics::gauge!(HELD).increment(1.0),
            Some(held) => {
                metrics::gauge!(HELD).decrement(1.0);
                metrics::histogram!(HOLD_DURATION, labels!(key)).record(held);
            }
        }
    }

    pub(crate) fn extended(key: Option<&'static str>, outcome: &'static str) {
        metrics::counter!(EXTENSIONS, labels!(key, "outcome" => outcome)).increment(1);
    }

    pub(crate) fn lost(key: Option<&'static str>, cause: &'static str) {
        metrics::counter!(LOSSES, labels!(key, "cause" => cause)).increment(1);
    }

    pub(crate) fn released(key: Option<&'static str>, confirmed: bool) {
        let outcome = if confirmed {
            "confirmed"
        } else {
            "unconfirmed"
        };
        metrics::counter!(RELEASES, labels!(key, "outcome" => outcome)).increment(1);
    }

    pub(crate) fn node_error(node: &str, e: &NodeError) {
        metrics::counter!(NODE_ERRORS, "node" => node.to_owned(), "kind" => error_kind(e))
            .increment(1);
    }

    pub(crate) fn fence_refused(key: Option<&'static str>) {
        metrics::counter!(FENCE_REFUSALS, labels!(key)).increment(1);
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn request(key: Option<&'static str>, outcome: &'static str) {
        metrics::counter!(REQUESTS, labels!(key, "outcome" => outcome)).increment(1);
    }

    /// One held permit or share, or one call waiting for either, counted in
    /// its gauge while it lives (a cancelled call, a dropped lock too).
    pub(crate) struct Gauged(metrics::Gauge);

    impl Gauged {
        /// Counts a permit or share just acquired.
        pub(crate) fn held(of: Of, key: Option<&'static str>) -> Self {
            let name = match of {
                Of::Permit => PERMITS_HELD,
                Of::Shared | Of::Exclusive => SHARES_HELD,
            };
            Self::start(name, of, key)
        }

        /// Counts a call that may retry, while it waits.
        pub(crate) fn waiting(of: Of, key: Option<&'static str>) -> Self {
            let name = match of {
                Of::Permit => PERMIT_WAITERS,
                Of::Shared | Of::Exclusive => SHARE_WAITERS,
            };
            Self::start(name, of, key)
        }

        fn start(name: &'static str, of: Of, key: Option<&'static str>) -> Self {
            let mut labels = labels!(key);
            match of {
                Of::Permit => {}
                Of::Shared => labels.insert(0, metrics::Label::new("access", "shared")),
                Of::Exclusive => labels.insert(0, metrics::Label::new("access", "exclusive")),
            }
            let gauge = metrics::gauge!(name, labels);
            gauge.increment(1.0);
            Self(gauge)
        }
    }

    impl Drop for Gauged {
        fn drop(&mut self) {
            self.0.decrement(1.0);
        }
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::missing_const_for_fn)]
mod record {
    use super::*;

    #[inline(always)]
    pub(crate) fn acquired(_: Option<&'static str>, _: &'static str, _: Duration, _: bool) {}
    #[inline(always)]
    pub(crate) fn waiters(_: f64) {}
    #[inline(always)]
    pub(crate) fn held(_: Option<&'static str>, _: Option<Duration>) {}
    #[inline(always)]
    pub(crate) fn extended(_: Option<&'static str>, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn lost(_: Option<&'static str>, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn released(_: Option<&'static str>, _: bool) {}
    #[inline(always)]
    pub(crate) fn node_error(_: &str, _: &NodeError) {}
    #[inline(always)]
    pub(crate) fn fence_refused(_: Option<&'static str>) {}
    #[inline(always)]
    pub(crate) fn request(_: Option<&'static str>, _: &'static str) {}

    /// Without the feature: nothing counted.
    pub(crate) struct Gauged;

    impl Gauged {
        #[inline(always)]
        pub(crate) fn held(_: Of, _: Option<&'static str>) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn waiting(_: Of, _: Option<&'static str>) -> Self {
            Self
        }
    }
}

pub(crate) use record::*;
