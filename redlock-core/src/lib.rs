//! The Redlock distributed lock over [deadpool-redis] pools, one pool per
//! independent Redis master.
//!
//! This crate implements the algorithm of the redis.io "Distributed Locks with
//! Redis" page:
//!
//! 1. take the time on a monotonic clock ([`std::time::Instant`]);
//! 2. send `SET key token NX PX ttl` to all N nodes at once, each call under a short
//!    per-node timeout, with a fresh 128-bit token from the OS CSPRNG;
//! 3. the attempt holds the lock iff at least `N/2 + 1` nodes said OK and the
//!    validity `ttl − elapsed − (ttl·drift_factor + 2 ms)` is positive;
//! 4. a failed attempt is released wherever it may have landed, then retried after a
//!    random delay;
//! 5. release is a compare-and-delete Lua script on every node, never a bare `DEL`.
//!
//! On top of that: compare-and-pexpire extension that counts only with a quorum
//! inside the current validity, a [`LockGuard`] that renews the lock while work runs
//! and says when it is lost, and [`Redlock::with_lock`], which drops the work if the
//! lock is lost.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_core::{LockOptions, Redlock};
//!
//! # async fn run() -> Result<(), redlock_core::Error> {
//! let redlock = Redlock::from_urls([
//!     "redis://10.0.0.1:6379",
//!     "redis://10.0.0.2:6379",
//!     "redis://10.0.0.3:6379",
//! ])?;
//!
//! // One attempt, manual release.
//! let lock = redlock.try_lock("invoice:42", Duration::from_secs(5)).await?;
//! println!("held for another {:?}", lock.remaining());
//! redlock.unlock(lock).await?;
//!
//! // Held with auto-extension while the work runs; the work is dropped if the
//! // lock is lost.
//! redlock
//!     .with_lock("tenant:7", &LockOptions::new(Duration::from_secs(2)), |lock| async move {
//!         // long work here
//!         lock.remaining()
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Safety notes
//!
//! Redlock assumes the nodes are independent masters (no replication between them)
//! and that a restarted node stays down longer than the largest TTL, or persists
//! with `appendfsync always`.
//!
//! What a [`LockHandle`] tells the code under the lock is computed from the local
//! monotonic clock at each call, against the last validity the nodes confirmed
//! less a loss margin (default: the node timeout, see
//! [`LockOptions::loss_margin`]). It does not wait for the renewal task: a holder
//! whose thread blocked past its validity is told `is_lost() == true` the moment
//! it looks, and [`Redlock::with_lock`] and the web adapters never poll the work
//! again once the deadline has passed. A renewal task that dies (a panic, its
//! runtime shut down) fires the loss too.
//!
//! What no client-side check can do: a holder that checks, is then paused (GC,
//! `SIGSTOP`, swap, a slow network) past its validity, and only then writes,
//! writes late. Only the protected resource can refuse that write, by a fencing
//! token.
//!
//! [deadpool-redis]: https://docs.rs/deadpool-redis

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod acquire;
mod builder;
mod error;
mod extend;
mod fan_out;
mod guard;
mod lock;
mod node;
mod redlock;
mod release;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod request;
mod settings;
mod steps;
mod stragglers;
mod url;

pub use builder::RedlockBuilder;
pub use error::{Error, NodeError, NodeOutcome, NodeStatus, Report};
pub use guard::{LockGuard, LockHandle, LostFuture};
pub use lock::Lock;
pub use redlock::{NodeInfo, Redlock};
pub use release::Released;
pub use settings::{LockOptions, RetryPolicy};
pub use url::redact_url;

/// The deadpool-redis crate this one is built on, for building pools.
pub use deadpool_redis;
