//! The Redlock distributed lock over [deadpool-redis] pools, one pool per
//! independent Redis master: a mutex, permits and read/write locks as values
//! with one set of verbs, an auto-extending guard that says when the lock is
//! lost, elections, jobs run once per tick, opt-in fencing tokens, and
//! (feature `http`) the framework-free per-request lock that `redlock-tower`
//! and `redlock-actix` share.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_core::{LockOptions, Redlock, RetryPolicy};
//!
//! # async fn run() -> Result<(), redlock_core::Error> {
//! // One URL (or deadpool-redis pool) per *independent* master.
//! let redlock = Redlock::builder()
//!     .urls(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .node_timeout(Duration::from_millis(50))            // per node, per call
//!     .retry(RetryPolicy::deadline(Duration::from_secs(2)))
//!     .build()?;
//!
//! // Manual: one attempt, then release (dropping a Lock also releases, in the background).
//! let mut lock = redlock.mutex("invoice:42").try_acquire(Duration::from_secs(5)).await?;
//! println!("held for another {:?}", lock.remaining());
//! redlock.extend(&mut lock, Duration::from_secs(5)).await?;
//! redlock.unlock(lock).await?;
//!
//! // Held while the work runs: renewed automatically; the work is dropped and
//! // Error::Lost returned if the lock is lost.
//! let n = redlock
//!     .mutex("tenant:7")
//!     .run(&LockOptions::new(Duration::from_secs(2)), |lock| async move {
//!         // lock.remaining(), lock.is_lost(), lock.lost().await
//!         42
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Build the handle once at start-up and share it: it is one `Arc`
//! ([`Redlock::from_urls`] takes the URLs alone).
//!
//! # Primitives
//!
//! Every primitive is a value of one type, [`Primitive`], with the same verbs:
//! [`try_acquire`](Primitive::try_acquire) (one attempt),
//! [`acquire`](Primitive::acquire) (retries or waits per the handle's policy),
//! [`acquire_with`](Primitive::acquire_with), [`guard`](Primitive::guard)
//! (auto-extended) and [`run`](Primitive::run).
//!
//! | made by | holds |
//! |---|---|
//! | [`redlock.mutex(r)`](Redlock::mutex) | one holder |
//! | [`redlock.mutex_many([r1, r2])?`](Redlock::mutex_many) | one holder of every resource, all or none |
//! | [`redlock.semaphore(r, n)?`](Redlock::semaphore) | at most `n` holders |
//! | [`redlock.rw_lock(r, Access::Shared)`](Redlock::rw_lock) / `Access::Exclusive` | readers together, a writer alone |
//!
//! Elections are values too: [`redlock.election(name)?`](Redlock::election),
//! then [`campaign_with(&options)`](Election::campaign_with).
//!
//! # Errors
//!
//! Errors are typed ([`Error`]): `Busy { retry_after }` when another holder
//! has the lock (the holder's remaining PTTL, read from the nodes that refused in one
//! more round trip),
//! `NoQuorum` with a per-node [`Report`] (`Connect`, `Io`, `Timeout`, `WrongType`,
//! `ReadOnly`, `OutOfMemory`, `Auth`, `Loading`, `ScriptBusy`, …), and input errors
//! (`EmptyResource`, `InvalidTtl`, `NodeTimeoutTooLong`, `NoNodes`, `DuplicateNode`,
//! `InvalidUrl`). Passwords never appear in errors, `Debug` output or logs.
//!
//! # Guide
//!
//! The [`guide`] has a chapter per topic:
//!
//! | chapter | what it covers |
//! |---|---|
//! | [requests](guide::requests) | the tower layer's and actix middleware's defaults, hold cap and Redis keys |
//! | [waiting](guide::waiting) | waiting for a busy lock, woken by the release |
//! | [several resources](guide::several_resources) | several resources under one lock, all or none |
//! | [permits and shared locks](guide::permits_and_shared_locks) | semaphores and read/write locks |
//! | [leader](guide::leader) | one leader among replicas: elections, terms, observers |
//! | [jobs](guide::jobs) | a job run once per tick across replicas |
//! | [idempotency](guide::idempotency) | idempotent requests and webhooks |
//! | [gRPC](guide::grpc) | tonic services behind the tower layer |
//! | [servers, replicas and clusters](guide::servers) | which servers, replica acks, Redis Cluster nodes |
//! | [TLS](guide::tls) | `rediss://` nodes (feature `tls`) |
//! | [operating](guide::operating) | metrics, logs, inspection, the `redlock` command |
//! | [the algorithm](guide::algorithm) | the steps, and where each lives in the source |
//! | [safety](guide::safety) | what is guaranteed, under which assumptions, and fencing |
//! | [the fault suite](guide::fault_suite) | the fault-injection tests |
//! | [benchmarks](guide::benchmarks) | how it is measured, and where the figures are |
//!
//! # Features
//!
//! - `tls`: `rediss://` URLs through rustls ([TLS](guide::tls));
//! - `http`: `redlock_core::request`, the per-request lock the adapters share;
//! - `idempotency`: `redlock_core::idempotency`, the idempotency layers' flow and store;
//! - `metrics`: lock metrics through the `metrics` facade ([`metrics`]);
//! - `cli`: the `redlock` command ([operating](guide::operating)).
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

/// What follows a permit slot's key's tag (`semaphore::permit_key`), as a
/// literal for the extend scripts. As long as [`reader_infix`]'s text.
macro_rules! permit_infix {
    () => {
        ":redlock-permit:"
    };
}

/// The suffix of a semaphore's permit count (`semaphore::count_key`), as a
/// literal for the extend scripts.
macro_rules! permits_suffix {
    () => {
        ":redlock-permits"
    };
}

/// Lua functions for the scripts that set a read share's or a permit's
/// expiry (the acquires, the extends): `index_of(k)`, the readers index of a
/// reader key `k` (`nil` for any other key), `list_reader(idx, k, ms)`,
/// which lists `k` in `idx` and keeps `idx` alive at least `ms` from now,
/// and `keep_companion(k, ms)`, which does that for a reader key and keeps a
/// permit slot's count (`semaphore/`) alive at least `ms` for a slot key.
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
local function keep_count(c, ms)
  local p = redis.call('PTTL', c)
  if p >= 0 and p < tonumber(ms) then
    redis.call('PEXPIRE', c, ms)
  end
end
local function keep_companion(k, ms)
  local idx = index_of(k)
  if idx then
    list_reader(idx, k, ms)
    return
  end
  if string.byte(k) ~= 123 then return end
  local t = string.match(k, '^{[^}]*}')
  if t and string.sub(k, #t + 1, #t + "#,
            reader_infix_len!(),
            r#") == '"#,
            permit_infix!(),
            r#"' then
    keep_count(t .. '"#,
            permits_suffix!(),
            r#"', ms)
  end
end
"#
        )
    };
}

// The floor plan: each group uses only the groups above it (the guide's
// algorithm chapter, `docs/guide/algorithm.md`, "How
// the algorithm is implemented"; `module-cycles` checks it in `.ci/run`).

// 1. Values: errors and per-node reports, fencing modes and tokens, key
// names, metrics hooks, eviction checks, URL handling, per-runtime slots.
mod background;
mod error;
mod eviction;
mod fencing;
/// Test-only pauses inside node calls, for the fault suites. Not part of
/// the API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod hooks;
mod keys;
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub mod metrics;
mod node_error;
mod per_runtime;
mod report;
mod slots;
mod url;

// 2. One master (`node/`, and `coalesce/`, which lets concurrent calls to it
// share one), the settings that name its options, the node sources, and the
// local wake-up plumbing (`queue/`, `wake/`).
mod coalesce;
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
// they share (`primitive`); the public handle (`redlock`: the protocol
// state and the renewal schedule), whose primitives' constructors live in
// `primitive` and whose construction lives in `builder`.
mod acquire_kind;
mod guard;
mod job;
mod leader;
mod primitive;
mod redlock;
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
/// Test-only: a node's operations as separate calls and as one batch (the
/// `test-hooks` feature). Not part of the API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use node::coalesce_check;
#[doc(hidden)]
pub use node::{CoalesceStats, coalesce_stats};
pub use node::{CompareAndDelete, NativeCommands, NativeSupport, ReplicaAcks};
pub use node_spec::NodeSpec;
pub use primitive::{Kind, Primitive};
pub use protocol::lock::Lock;
pub use protocol::redlock::NodeInfo;
pub use protocol::release::Released;
pub use redlock::Redlock;
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

/// The guide: a chapter per topic, each a module with no items of its own.
/// The [crate's front page](crate#guide) lists them with what each covers.
/// The chapters are the markdown files of `redlock-core/docs/guide/` in the
/// repository, which the README links.
pub mod guide {
    #[doc = include_str!("../docs/guide/requests.md")]
    pub mod requests {}

    #[doc = include_str!("../docs/guide/waiting.md")]
    pub mod waiting {}

    #[doc = include_str!("../docs/guide/several-resources.md")]
    pub mod several_resources {}

    #[doc = include_str!("../docs/guide/permits-and-shared-locks.md")]
    pub mod permits_and_shared_locks {}

    #[doc = include_str!("../docs/guide/leader.md")]
    pub mod leader {}

    #[doc = include_str!("../docs/guide/jobs.md")]
    pub mod jobs {}

    // Its code and links need the `idempotency` feature (on on docs.rs).
    #[cfg_attr(
        feature = "idempotency",
        doc = include_str!("../docs/guide/idempotency.md")
    )]
    #[cfg_attr(
        not(feature = "idempotency"),
        doc = "Idempotent requests and webhooks: this chapter is built with the `idempotency` feature."
    )]
    pub mod idempotency {}

    #[doc = include_str!("../docs/guide/grpc.md")]
    pub mod grpc {}

    #[doc = include_str!("../docs/guide/servers.md")]
    pub mod servers {}

    // Its code needs the `tls` feature (on on docs.rs).
    #[cfg_attr(feature = "tls", doc = include_str!("../docs/guide/tls.md"))]
    #[cfg_attr(
        not(feature = "tls"),
        doc = "TLS: `rediss://` nodes. This chapter is built with the `tls` feature."
    )]
    pub mod tls {}

    #[doc = include_str!("../docs/guide/operating.md")]
    pub mod operating {}

    #[doc = include_str!("../docs/guide/algorithm.md")]
    pub mod algorithm {}

    #[doc = include_str!("../docs/guide/safety.md")]
    pub mod safety {}

    #[doc = include_str!("../docs/guide/fault-suite.md")]
    pub mod fault_suite {}

    #[doc = include_str!("../docs/guide/benchmarks.md")]
    pub mod benchmarks {}
}
