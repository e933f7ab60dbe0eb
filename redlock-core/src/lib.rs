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
//! and says when it is lost, and [`crate::Primitive::run`], which drops the work if the
//! lock is lost. Opt-in fencing tokens ([`RedlockBuilder::fencing`]) let the
//! protected resource refuse late writes (see [Safety](#safety) and [`fence`]).
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
//! let lock = redlock.mutex("invoice:42").try_acquire(Duration::from_secs(5)).await?;
//! println!("held for another {:?}", lock.remaining());
//! redlock.unlock(lock).await?;
//!
//! // Held with auto-extension while the work runs; the work is dropped if the
//! // lock is lost.
//! redlock
//!     .mutex("tenant:7")
//!     .run(&LockOptions::new(Duration::from_secs(2)), |lock| async move {
//!         // long work here
//!         lock.remaining()
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Safety
//!
//! **What Redlock guarantees.** While its assumptions hold, at most one client
//! at a time holds a lock on a resource *within the validity it was told*
//! ([`Lock::remaining`], [`Lock::valid_until`]). The assumptions: the nodes are
//! independent masters (no replication between them, no two on one server); a
//! node that restarts either stays down longer than the largest TTL in use or
//! persists every write before answering (`appendonly yes`, `appendfsync
//! always`); and the clocks of clients and nodes run at nearly the same rate
//! (the drift allowance, 1 % of the TTL plus 2 ms by default). The lock says
//! nothing about what happens after its validity: a key can expire while its
//! holder still works.
//!
//! **What the holder is told.** A [`LockHandle`] answers from the local
//! monotonic clock at each call, against the last validity the nodes confirmed
//! less a loss margin (default: the node timeout, see
//! [`LockOptions::loss_margin`]). It does not wait for the renewal task: a
//! holder whose thread blocked past its validity is told `is_lost() == true`
//! the moment it looks, and [`crate::Primitive::run`] and the web adapters never
//! poll the work again once the deadline has passed. A renewal task that dies
//! (a panic, its runtime shut down) fires the loss too. What no client-side
//! check can do: a holder that checks, is then paused (GC, `SIGSTOP`, swap, a
//! slow network) past its validity, and only then writes, writes late.
//!
//! **What fencing adds.** With [`RedlockBuilder::fencing`], every lock carries
//! a [`FencingToken`] larger than the token of every earlier holder of the
//! resource, and the protected resource can refuse a write whose token is
//! smaller than one it already accepted ([`fence`]). That turns the late write
//! above into a refused one, *if the resource checks*; a resource that does
//! not check gains nothing. Tokens cost one more round trip per acquire (a
//! fence phase decided at quorum). They are monotone because a later holder's
//! acquire quorum meets the earlier holder's fence quorum on a node that
//! remembers the earlier counter, which needs one of:
//!
//! - [`FencingMode::Durable`]: every node persists its counters before
//!   answering (`appendonly yes`, `appendfsync always`);
//! - [`FencingMode::Hybrid`]: tokens also take the nodes' clocks (`TIME`, in
//!   µs); a node that restarts without its data must stay down longer than the
//!   clock skew between the nodes, and no node's wall clock may step backwards
//!   (a backward NTP step or a manual clock change can hand out a smaller
//!   token after a restart). The model check also shows that the rule needs
//!   the node's clock to advance between the `TIME` read of an acquire and
//!   its fence; that fence comes one round trip later, so at least 1 µs
//!   passes in practice, but it is an assumption.
//!
//! A delayed restart alone does not make [`FencingMode::Durable`] safe on
//! nodes without persistence: the model check finds duplicate tokens there
//! even when the restarted node stays down past every TTL, because the
//! counters, unlike lock keys, must outlive every holder.
//!
//! [`Redlock::check_nodes`] reads each node's persistence and says whether the
//! chosen mode is sound there ([`FencingCheck`]), and its eviction policy
//! ([`EvictionCheck`]: only `noeviction` keeps lock keys and counters). The
//! counters are keys, one per fenced resource (the byte `0xFF`, `fence:`, then
//! the lock key: no UTF-8 key collides with them); deleting one, or a
//! `FLUSHALL`, is a restart without data for that node. [`FencingMode::Durable`]
//! counters never expire; [`FencingMode::Hybrid`] ones expire once idle for
//! [`RedlockBuilder::fence_counter_ttl`] (a day by default, an hour at least),
//! which the mode's clock rule makes as safe as a restart after the skew. Tokens order holders; they do not
//! make a holder's validity longer, and they do not protect a resource from a
//! client that writes without a lock.
//!
//! [deadpool-redis]: https://docs.rs/deadpool-redis

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

/// The suffix of a lock key's waiters flag as a literal, for `concat!` in the
/// release scripts, which name the flag themselves (`keys::WAITERS_SUFFIX`).
macro_rules! waiters_suffix {
    () => {
        ":redlock-waiters"
    };
}

/// What follows a read share's key's tag (`keys::READER_INFIX`), as a
/// literal for the release scripts, which take a reader off its index.
macro_rules! reader_infix {
    () => {
        ":redlock-reader:"
    };
}

/// The length of [`reader_infix`]'s text, as a Lua number literal.
macro_rules! reader_infix_len {
    () => {
        "16"
    };
}

/// The suffix of a resource's readers index (`keys::READERS_SUFFIX`), as a
/// literal for the release scripts.
macro_rules! readers_suffix {
    () => {
        ":redlock-readers"
    };
}

/// Lua functions for the scripts that set a read share's expiry (the read
/// acquire, the reader's extends): `index_of(k)`, the readers index of a
/// reader key `k` (`nil` for any other key), and `list_reader(idx, k, ms)`,
/// which lists `k` in `idx` and keeps `idx` alive at least `ms` from now.
/// So the index outlives every reader it lists (each reader's expiry is set
/// in the same script, on the same clock), and a writer that finds no index
/// finds no live reader; once the last reader's key is gone the index
/// expires too. An index without an expiry (written before indexes had one)
/// is left so: readers of an older version extend their own keys only, and
/// an expiry given to their index could end under them. `SADD` also puts
/// back a reader missing from its index, which only makes writers see more.
macro_rules! reader_index_lua {
    () => {
        concat!(
            r#"
local function index_of(k)
  if string.byte(k) ~= 123 then return nil end
  local t = string.match(k, '^{[^}]*}')
  if t and string.sub(k, #t + 1, #t + "#,
            reader_infix_len!(),
            r#") == '"#,
            reader_infix!(),
            r#"' then
    return t .. '"#,
            readers_suffix!(),
            r#"'
  end
  return nil
end
local function list_reader(idx, k, ms)
  local p = redis.call('PTTL', idx)
  redis.call('SADD', idx, k)
  if p ~= -1 and p < tonumber(ms) then
    redis.call('PEXPIRE', idx, ms)
  end
end
"#
        )
    };
}

// The floor plan: each group uses only the groups above it (README, "How
// the algorithm is implemented"; `module-cycles` checks it in `.ci/run`).

// 1. Values: errors and per-node reports, fencing modes and tokens, key
// names, metrics hooks, eviction checks, URL handling, per-runtime slots.
mod background;
mod error;
mod eviction;
mod fencing;
mod keys;
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub mod metrics;
mod node_error;
mod per_runtime;
mod report;
mod slots;
mod url;

// 2. One master (`node/`), the settings that name its options, the node
// sources, and the local wake-up plumbing (`queue/`, `wake/`).
mod node;
mod node_spec;
mod queue;
mod settings;
mod sources;
mod wake;

// 3. The handle's state (`protocol/redlock.rs`) and the Redlock steps, in `protocol/`
// in the spec's order: token, quorum, validity and retry (`steps`), fan-out,
// acquire (with the fence round), the held lock, extend, release, late
// answers.
mod protocol;

// 4. Holding (guard, handle, renewal schedule) and waiting (retry by
// wake-up); above them, a leader (campaign, observe), jobs run once per
// tick, permits (`semaphore`) and shared locks (`rwlock`) with the wrappers
// they share (`primitive`).
mod acquire_kind;
mod guard;
mod job;
mod leader;
mod primitive;
mod rwlock;
mod semaphore;
mod wait;

// 5. Operations, and fencing's store side.
pub mod fence;
mod inspect;

// 6. The framework-free HTTP parts.
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod request;

// 7. The builder, on top (`cluster_builder`: its Redis Cluster nodes).
mod builder;
mod cluster_builder;

pub use builder::RedlockBuilder;
pub use error::{Error, NodeError, NodeOutcome, NodeStatus, Report};
pub use eviction::EvictionCheck;
pub use fencing::{FencingCheck, FencingMode, FencingToken};
pub use guard::{Ended, LockGuard, LockHandle, LostFuture};
pub use inspect::{Inspection, KeyState, NodeView, Verdict, token_fingerprint};
pub use job::JobOptions;
pub use keys::MAX_RESOURCES;
pub use leader::{CampaignOptions, Election, Leader, Leadership, Observer};
pub use node::{CompareAndDelete, NativeCommands, NativeSupport, ReplicaAcks};
pub use node_spec::NodeSpec;
pub use primitive::{Kind, Primitive};
pub use protocol::lock::Lock;
pub use protocol::redlock::{NodeInfo, Redlock};
pub use protocol::release::Released;
pub use rwlock::{Access, RwInspection, RwState, RwVerdict};
pub use semaphore::{MAX_PERMITS, PermitsInspection, PermitsVerdict};
pub use settings::{LockOptions, RetryPolicy};

/// The release script's text, for the bench's `publish` scenario, which
/// measures it against a plain compare-and-delete. Not part of the API.
#[doc(hidden)]
pub const __RELEASE_LUA: &str = node::RELEASE_LUA;
/// The quiet release's text (a failed attempt's, which announces nothing),
/// for the tests that read releases off `MONITOR`. Not part of the API.
#[doc(hidden)]
pub const __RELEASE_QUIET_LUA: &str = node::RELEASE_QUIET_LUA;
/// The waiters flag's suffix, which the release script's second key takes,
/// for the same scenario. Not part of the API.
#[doc(hidden)]
pub const __WAITERS_SUFFIX: &str = keys::WAITERS_SUFFIX;
pub use url::redact_url;

/// The deadpool-redis crate this one is built on, for building pools.
pub use deadpool_redis;
