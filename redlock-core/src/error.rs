//! *Layer 1, values (see `lib.rs`).*
//!
//! Typed errors: what went wrong, and on which node.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use crate::node_error::NodeError;
pub use crate::report::{NodeOutcome, NodeStatus, Report};

/// Every error this crate returns.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The resource name is empty.
    #[error("the resource name is empty")]
    EmptyResource,
    /// The resource's key would end with `:redlock-waiters`, the suffix of
    /// the flag by which waiters ask a release to announce itself: such a key
    /// could be deleted by another lock's release.
    #[error("the key of resource {resource:?} ends with \":redlock-waiters\", which is reserved")]
    ReservedResource {
        /// The resource refused.
        resource: Arc<str>,
    },
    /// A multi-resource lock was asked for no resource at all.
    #[error("no resource was given to lock")]
    NoResources,
    /// A multi-resource lock was asked for more distinct resources than one
    /// lock may hold ([`MAX_RESOURCES`](crate::MAX_RESOURCES)).
    #[error("more than {max} distinct resources in one lock")]
    TooManyResources {
        /// The most one lock may hold.
        max: usize,
    },
    /// The TTL is zero, or outside the configured bounds.
    #[error("ttl {ttl:?} is outside the allowed range {min:?}..={max:?}")]
    InvalidTtl {
        /// The TTL given.
        ttl: Duration,
        /// The smallest TTL allowed.
        min: Duration,
        /// The largest TTL allowed.
        max: Duration,
    },
    /// The per-node timeout must be shorter than the TTL, or no attempt could ever
    /// leave validity.
    #[error("node timeout {node_timeout:?} must be shorter than the ttl {ttl:?}")]
    NodeTimeoutTooLong {
        /// The per-node timeout configured.
        node_timeout: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// No nodes were given.
    #[error("no Redis nodes were given")]
    NoNodes,
    /// The same Redis server was listed twice. Redlock's safety rests on
    /// independent masters, so this is refused.
    #[error("node {second} is the same server as node {first} (same {by})")]
    DuplicateNode {
        /// The label of the first listing.
        first: Arc<str>,
        /// The label of the second listing.
        second: Arc<str>,
        /// How the duplicate was found: `"address"` or `"run_id"`.
        by: &'static str,
    },
    /// A node URL could not be parsed. The URL shown has its password removed.
    #[error("invalid node URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// A builder setting is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The operating system's random source failed, so no token could be made.
    #[error("the OS random source failed: {0}")]
    Random(String),
    /// The call needs a Tokio runtime (a [`LockGuard`](crate::LockGuard)'s
    /// renewal task runs on one) and was made outside of one.
    #[error("no Tokio runtime: {0} needs one")]
    NoRuntime(&'static str),
    /// The lock is held by someone else on enough nodes that no quorum was possible.
    /// The backend itself answered.
    #[error(
        "resource {resource:?} is locked by another holder{}: {report}",
        RetryAfter(*retry_after)
    )]
    Busy {
        /// The resource asked for.
        resource: Arc<str>,
        /// When enough holders' keys expire that a quorum could be free, if known.
        retry_after: Option<Duration>,
        /// Every node's outcome in the last attempt.
        report: Report,
    },
    /// A semaphore was asked for with another number of permits than the
    /// one its holders use, which the nodes keep while any permit of it is
    /// held ([`Redlock::semaphore`](crate::Redlock::semaphore)): two
    /// configurations of one resource would otherwise admit as many holders
    /// as the larger allows, silently. Not retried: give every client of the
    /// resource the same count (or wait until the other's permits are gone).
    #[error(
        "permits of {resource:?}: asked with {asked}, but the nodes keep {found} for it \
         (every client of one semaphore must use the same count): {report}"
    )]
    PermitsMismatch {
        /// The resource asked for.
        resource: Arc<str>,
        /// The count this call gave.
        asked: u32,
        /// The count a node keeps for the resource.
        found: String,
        /// Every node's outcome in the attempt.
        report: Report,
    },
    /// Too many nodes failed for a quorum: the backend is unavailable.
    #[error("no quorum for {resource:?}: {ok} of {quorum} needed nodes answered ok: {report}")]
    NoQuorum {
        /// The resource asked for.
        resource: Arc<str>,
        /// How many nodes said ok.
        ok: usize,
        /// How many were needed.
        quorum: usize,
        /// Every node's outcome in the last attempt.
        report: Report,
    },
    /// A quorum said ok, but so late that no validity was left
    /// (`ttl - elapsed - drift <= 0`).
    #[error(
        "quorum for {resource:?} took {elapsed:?}, which leaves no validity of the {ttl:?} ttl"
    )]
    NoValidity {
        /// The resource asked for.
        resource: Arc<str>,
        /// The time the attempt took.
        elapsed: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// A fencing lock's quorum said OK, but its token was then applied on fewer
    /// than a quorum of nodes (the keys were gone, or the nodes failed): the
    /// token could be one a later holder also reads, so the attempt failed and
    /// was released.
    #[error(
        "fencing token for {resource:?} applied on {applied} of {quorum} needed nodes: {report}"
    )]
    NoFenceQuorum {
        /// The resource asked for.
        resource: Arc<str>,
        /// How many nodes applied the token.
        applied: usize,
        /// How many were needed.
        quorum: usize,
        /// Every node's outcome in the fence phase (`NotHeld`: the key no
        /// longer held this attempt's token there).
        report: Report,
    },
    /// An extension found the lock gone from so many nodes that no quorum holds it.
    #[error("lock on {resource:?} is no longer held: {report}")]
    NotHeld {
        /// The resource.
        resource: Arc<str>,
        /// Every node's outcome.
        report: Report,
    },
    /// The lock's validity ran out before the call could be made.
    #[error("lock on {resource:?} has expired")]
    Expired {
        /// The resource.
        resource: Arc<str>,
    },
    /// The configured maximum number of extensions was reached.
    #[error("lock on {resource:?} reached its limit of {limit} extensions")]
    ExtensionLimit {
        /// The resource.
        resource: Arc<str>,
        /// The limit.
        limit: u32,
    },
    /// The lock was lost while the work ran, and the work was stopped.
    #[error("lock on {resource:?} was lost while the work ran")]
    Lost {
        /// The resource.
        resource: Arc<str>,
    },
    /// A release did not reach every node. Keys left behind expire with their TTL.
    #[error("release of {resource:?} deleted {deleted} keys but some nodes failed: {report}")]
    ReleaseIncomplete {
        /// The resource.
        resource: Arc<str>,
        /// How many keys the release deleted.
        deleted: usize,
        /// Every node's outcome.
        report: Report,
    },
}

impl Error {
    /// For [`Error::Busy`], when it is worth trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Busy { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether a later attempt may succeed: the lock was busy, or the nodes failed
    /// in a way that may pass.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Busy { .. }
                | Error::NoQuorum { .. }
                | Error::NoValidity { .. }
                | Error::NoFenceQuorum { .. }
        )
    }

    /// The per-node report, for errors that carry one.
    pub fn report(&self) -> Option<&Report> {
        match self {
            Error::Busy { report, .. }
            | Error::NoQuorum { report, .. }
            | Error::NoFenceQuorum { report, .. }
            | Error::NotHeld { report, .. }
            | Error::PermitsMismatch { report, .. }
            | Error::ReleaseIncomplete { report, .. } => Some(report),
            _ => None,
        }
    }
}

/// How [`Error::Busy`] words its `retry_after`: nothing when it is unknown.
struct RetryAfter(Option<Duration>);

impl fmt::Display for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => write!(f, " (retry after {} ms)", d.as_millis()),
            None => Ok(()),
        }
    }
}
