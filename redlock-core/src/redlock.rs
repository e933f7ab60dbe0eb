//! *The handle, on top of holding and the protocol (see `lib.rs`).*
//!
//! [`Redlock`] is what an application builds once and shares: the protocol
//! state every Redlock step runs on (`protocol::redlock::Core`) and the
//! holding layer's renewal schedule for its guards (`guard::Schedule`). It
//! keeps node information, a held lock's release, extend and guard, and
//! inspection here; construction is in `builder.rs`, the constructors of the
//! primitives (leaders and jobs included) in `primitive/`. A [`Lock`] keeps
//! only the protocol state, so nothing below this module names the handle.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::guard::{LockGuard, Schedule};
use crate::inspect::Inspection;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::{Core, NodeInfo};
use crate::protocol::release::Released;
use crate::rwlock::RwInspection;
use crate::semaphore::PermitsInspection;
use crate::settings::{LockOptions, RetryPolicy};

/// A handle to N independent Redis masters that hands out Redlock locks.
///
/// Cheap to clone (two `Arc`s), `Send + Sync`: build it once at start-up and
/// share it. Every call talks to all nodes at once and returns as soon as the
/// outcome is decided.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::Redlock;
///
/// # async fn run() -> Result<(), redlock_core::Error> {
/// let redlock = Redlock::from_urls(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = redlock.mutex("invoice:42").acquire(Duration::from_secs(5)).await?;
/// // ... at most one holder at a time runs here, for lock.remaining() ...
/// redlock.unlock(lock).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    pub(crate) core: Core,
    /// The auto-extension of this handle's guards, batched (one task per
    /// runtime, started by the first guard there).
    pub(crate) renewals: Arc<Schedule>,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.core.inner;
        let nodes: Vec<&str> = inner.nodes.iter().map(|n| &*n.label).collect();
        f.debug_struct("Redlock")
            .field("nodes", &nodes)
            .field("quorum", &inner.quorum)
            .field("settings", &inner.settings)
            .finish()
    }
}

/// Construction.
impl Redlock {
    pub(crate) fn from_core(core: Core) -> Self {
        Self {
            core,
            renewals: Arc::default(),
        }
    }
}

/// Node information and settings.
impl Redlock {
    /// How many nodes this handle talks to.
    pub fn node_count(&self) -> usize {
        self.core.node_count()
    }

    /// How many nodes must agree: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.core.quorum()
    }

    /// The per-node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.core.node_timeout()
    }

    /// The default loss margin of a [`LockGuard`]: how long before the end of
    /// its validity the holder is told the lock is lost.
    pub fn loss_margin(&self) -> Duration {
        self.core.loss_margin()
    }

    /// The default retry policy of [`crate::Primitive::acquire`].
    pub fn retry_policy(&self) -> &RetryPolicy {
        self.core.retry_policy()
    }

    /// The Redis key used for `resource`: the key prefix, then the
    /// resource, when neither holds `{`, `}` or `%`; else `{` and both with
    /// those three `%`-escaped, then `}`. Every other key of the resource
    /// (waiters flag, fencing counter, idempotency record) hashes to the
    /// same Redis Cluster slot as this one, whatever the resource holds.
    pub fn key_for(&self, resource: &str) -> String {
        self.core.key_for(resource)
    }

    /// Connects to every node, reads `INFO server`, and refuses the same server
    /// listed twice (same `run_id`). Nodes that do not answer are reported, not
    /// refused: Redlock is built to run with a minority down.
    ///
    /// Also reads each node's persistence (`INFO persistence`, `CONFIG GET
    /// appendfsync`) and, with fencing on, judges whether the
    /// [`FencingMode`](crate::FencingMode) is sound there ([`NodeInfo::fencing`]);
    /// and its eviction policy (`INFO memory`, else `CONFIG GET`), judging
    /// whether it can evict lock keys or fencing counters
    /// ([`NodeInfo::eviction`]: only `noeviction` is sound). A node where
    /// either is unsound is logged at warn level.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`] with `by: "run_id"`.
    pub async fn check_nodes(&self) -> Result<Vec<NodeInfo>, Error> {
        self.core.check_nodes().await
    }
}

/// A lock once taken: its release, extend and guard.
impl Redlock {
    /// Releases `lock` (spec step 5): compare-and-delete on every node at once.
    ///
    /// Decided at quorum: it returns `Ok` as soon as a majority of nodes has
    /// answered (deleted, or no longer holding this token), and drives the other
    /// nodes to the end in the background; a minority of failed nodes is logged,
    /// not returned (the distlock page: while a majority is up, clients can
    /// acquire *and release*).
    ///
    /// Cancel-safe: if this future is dropped before it completes (a timeout
    /// around it, a client gone), the `Lock` it owns is dropped with it, and its
    /// `Drop` sends the release again in the background.
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when so many nodes failed that the release
    /// could not be confirmed on a quorum; their keys expire with the TTL.
    pub async fn unlock(&self, lock: Lock) -> Result<Released, Error> {
        self.core.unlock(lock).await
    }

    /// Spec step "extend": compare-and-pexpire to `ttl` on every node at once
    /// (the same as [`Lock::extend`]). It counts only if a quorum agrees before
    /// the current validity ends; the new validity is then
    /// `ttl - elapsed - drift` from the call's start.
    ///
    /// # Errors
    /// [`Error::Expired`] if the validity already ran out, [`Error::NotHeld`] when
    /// the key is gone from too many nodes, [`Error::NoQuorum`] when nodes failed,
    /// [`Error::ExtensionLimit`], or a TTL error (a zero TTL is refused before
    /// sending: `PEXPIRE 0` would delete the key).
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        self.core.extend(lock, ttl).await
    }

    /// Holds `lock` with auto-extension under `options` until the guard is
    /// released or dropped (what [`Primitive::guard`](crate::Primitive::guard)
    /// does after its acquire), on this handle's renewal schedule.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime (the renewal task needs
    /// one), or [`Error::InvalidConfig`] when the loss margin is not shorter
    /// than the TTL.
    pub fn guard(&self, lock: Lock, options: &LockOptions) -> Result<LockGuard, Error> {
        LockGuard::new(&self.renewals, lock, options)
    }
}

/// Inspection, and the operator's releases.
impl Redlock {
    /// Reads, on every node at once, what it holds for `resource`: whether the
    /// key exists, the holder's [`token_fingerprint`](crate::token_fingerprint), the PTTL and the fencing
    /// counter, and judges them ([`Verdict`](crate::Verdict)). Takes no lock and changes
    /// nothing; each node is bounded by the node timeout (at least 500 ms).
    ///
    /// ```no_run
    /// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
    /// let seen = redlock.inspect("tenant:7").await?;
    /// println!("{:?}", seen.verdict);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::EmptyResource`].
    pub async fn inspect(&self, resource: &str) -> Result<Inspection, Error> {
        self.core.inspect(resource).await
    }

    /// Reads, on every node at once, what it holds for `resource`'s
    /// read/write lock (see [`Redlock::rw_lock`]): the writer, the
    /// readers and a waiting writer's intent, and judges them
    /// ([`RwVerdict`](crate::RwVerdict)). Takes nothing and changes nothing.
    ///
    /// ```no_run
    /// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
    /// let seen = redlock.inspect_rw("reports/7").await?;
    /// println!("{:?}, a writer waits on {} node(s)", seen.verdict, seen.writer_waiting);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::EmptyResource`].
    pub async fn inspect_rw(&self, resource: &str) -> Result<RwInspection, Error> {
        self.core.inspect_rw(resource).await
    }

    /// Reads, on every node at once, each of the `permits` slots of
    /// `resource`'s semaphore (see [`crate::Redlock::semaphore`]) as
    /// [`Redlock::inspect`] reads a mutex, and counts the slots held. Takes
    /// nothing and changes nothing. Ask with the `permits` the holders use:
    /// slots past it are not read.
    ///
    /// ```no_run
    /// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
    /// let seen = redlock.inspect_permits("exports:7", 3).await?;
    /// println!("{} of 3 permits held", seen.verdict.held);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::EmptyResource`]; [`Error::InvalidConfig`] for `permits` of 0
    /// or past [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub async fn inspect_permits(
        &self,
        resource: &str,
        permits: u32,
    ) -> Result<PermitsInspection, Error> {
        self.core.inspect_permits(resource, permits).await
    }

    /// Compare-and-delete of the key `handle` held (a mutex's, a permit's
    /// slot, a read share's) with its token, on every node, waiting for each
    /// node's answer or its timeout: the second pass of a holder that must
    /// not leave a key behind when it exits (the `redlock` command), after
    /// its guard's release returned at quorum. For a lock on one resource;
    /// deletes nothing that holds another token.
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when too many nodes failed to confirm.
    pub async fn release_everywhere(&self, handle: &crate::LockHandle) -> Result<Released, Error> {
        self.core.release_everywhere(handle).await
    }

    /// The operator's escape hatch: compare-and-delete of `resource`'s key on
    /// every node, for the holder whose token is `token` (a process that died
    /// holding a long lock, say). Deletes nothing that holds another token.
    ///
    /// # Errors
    /// [`Error::EmptyResource`]; [`Error::ReleaseIncomplete`] when too many
    /// nodes failed to confirm.
    pub async fn release_token(&self, resource: &str, token: &str) -> Result<Released, Error> {
        self.core.release_token(resource, token).await
    }
}
