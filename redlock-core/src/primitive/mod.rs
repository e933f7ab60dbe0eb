//! *Layer 4, on top of the primitives (see `lib.rs`).*
//!
//! A lock primitive as a value (issue 47): a mutex, a semaphore of `n`
//! permits, or a side of a read/write lock, over one resource or (the
//! mutex) a set of them, made by [`Redlock::mutex`], [`Redlock::mutex_many`],
//! [`Redlock::semaphore`] or [`Redlock::rw_lock`], with one set of verbs:
//!
//! | verb | what it does |
//! |---|---|
//! | [`Primitive::try_acquire`] | one attempt |
//! | [`Primitive::acquire`] | retries (or waits for a release) per the handle's policy |
//! | [`Primitive::acquire_with`] | the same, per a given [`RetryPolicy`] |
//! | [`Primitive::guard`] | holds it with auto-extension until released or dropped |
//! | [`Primitive::run`] | runs a future while holding it |
//!
//! This module is the one place that decides which primitive a call takes
//! ([`Primitive::acquire_lock`]): a combination that has no primitive (a set
//! of resources with permits or a shared side) is refused when the value is
//! made ([`Redlock::primitive`]), never taken as another kind.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::guard::{LockGuard, LockHandle, run_guarded};
use crate::job::JobOptions;
use crate::keys::{Many, Resources};
use crate::leader::{Election, Observer};
use crate::protocol::acquire::Ttl;
use crate::protocol::lock::Lock;
use crate::redlock::Redlock;
use crate::rwlock::Access;
use crate::semaphore::{Permits, check_permits};
use crate::settings::{LockOptions, RetryPolicy};

/// Which primitive a [`Primitive`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// One holder at a time.
    Mutex,
    /// At most this many holders at once (1 to
    /// [`MAX_PERMITS`](crate::MAX_PERMITS)).
    Permits(u32),
    /// A read share of a read/write lock: held together with other readers,
    /// never with a writer.
    Read,
    /// The write side of a read/write lock: held alone, and never with a
    /// reader.
    Write,
}

impl Kind {
    /// The side of a read/write lock `access` names.
    pub fn rw(access: Access) -> Self {
        match access {
            Access::Shared => Kind::Read,
            Access::Exclusive => Kind::Write,
        }
    }

    /// Whether a set of several resources can be taken as this kind: only
    /// as the mutex (all or none of the keys).
    pub fn takes_several_resources(self) -> bool {
        matches!(self, Kind::Mutex)
    }
}

/// What a [`Primitive`] is taken on.
#[derive(Debug, Clone)]
enum Target {
    One(Arc<str>),
    Many(Arc<Many>),
}

/// A lock primitive of a [`Redlock`] handle: a mutex, a semaphore or a side
/// of a read/write lock, on one resource or (the mutex) several, with the
/// same verbs for each. Cheap to clone; made by [`Redlock::mutex`],
/// [`Redlock::mutex_many`], [`Redlock::semaphore`] and [`Redlock::rw_lock`].
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::{Access, LockOptions, Redlock};
///
/// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
/// let ttl = Duration::from_secs(10);
/// // One holder at a time.
/// let lock = redlock.mutex("orders/7").try_acquire(ttl).await?;
/// redlock.unlock(lock).await?;
/// // At most 3 exports of tenant 7 at once, held while the work runs.
/// let exports = redlock.semaphore("exports/7", 3)?;
/// exports.run(&LockOptions::new(ttl), |_| async { /* export */ }).await?;
/// // Readers together, writers alone.
/// let read = redlock.rw_lock("reports/7", Access::Shared).acquire(ttl).await?;
/// redlock.unlock(read).await?;
/// // Two accounts at once, all or none.
/// let both = redlock.mutex_many(["accounts/7", "accounts/9"])?;
/// let guard = both.guard(&LockOptions::new(ttl)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Primitive {
    redlock: Redlock,
    target: Target,
    kind: Kind,
}

impl Redlock {
    /// The mutex of `resource`: one holder at a time.
    pub fn mutex(&self, resource: impl AsRef<str>) -> Primitive {
        Primitive {
            redlock: self.clone(),
            target: Target::One(resource.as_ref().into()),
            kind: Kind::Mutex,
        }
    }

    /// The mutex of a set of resources, taken all or none: a holder holds
    /// every one of them, or none. A set of one resource is that resource's
    /// mutex; duplicates count once.
    ///
    /// # Errors
    /// [`Error::NoResources`] for an empty set, [`Error::EmptyResource`] for
    /// an empty name, [`Error::TooManyResources`] past
    /// [`MAX_RESOURCES`](crate::MAX_RESOURCES).
    pub fn mutex_many<I, R>(&self, resources: I) -> Result<Primitive, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.primitive(resources, Kind::Mutex)
    }

    /// The semaphore of `resource` with `permits` permits: at most `permits`
    /// holders at once across all the nodes. Every client of one resource
    /// must use the same count.
    ///
    /// A permit's [`Lock`] is the mutex of the permit's slot:
    /// [`Lock::resource`] is `resource`, [`Lock::key`] the slot's key;
    /// extend, release, guard and fencing token are the mutex's.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `permits` of 0 or past
    /// [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, resource: impl AsRef<str>, permits: u32) -> Result<Primitive, Error> {
        self.primitive([resource], Kind::Permits(permits))
    }

    /// A side of `resource`'s read/write lock: any number of readers
    /// ([`Access::Shared`]), or one writer ([`Access::Exclusive`]), with
    /// writer preference: a writer that readers hold up keeps new readers
    /// out until it holds or gives up.
    ///
    /// A reader's [`Lock`] is its own key's (`Lock::key`); a writer's is the
    /// resource's lock key, and carries the fencing token of a fencing
    /// handle. Do not take the mutex on a resource used as a read/write
    /// lock: it does not look for readers.
    pub fn rw_lock(&self, resource: impl AsRef<str>, access: Access) -> Primitive {
        Primitive {
            redlock: self.clone(),
            target: Target::One(resource.as_ref().into()),
            kind: Kind::rw(access),
        }
    }

    /// The primitive `kind` on `resources`: the one place a kind and a set
    /// of resources are put together (the constructors above, the tower
    /// layer and the actix middleware, the idempotency layer).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for several resources with a kind other
    /// than the mutex (no such primitive: nothing is taken as another
    /// kind), and for permits of 0 or past
    /// [`MAX_PERMITS`](crate::MAX_PERMITS); the errors of
    /// [`Redlock::mutex_many`] for the set.
    pub fn primitive<I, R>(&self, resources: I, kind: Kind) -> Result<Primitive, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        if let Kind::Permits(n) = kind {
            check_permits(n)?;
        }
        let target = match self.core.resources(resources)? {
            Resources::One(resource) => Target::One(resource.into()),
            Resources::Many(many) if kind.takes_several_resources() => Target::Many(many),
            Resources::Many(many) => {
                return Err(Error::InvalidConfig(format!(
                    "{kind:?} over several resources ({}): only the mutex takes a set of \
                     resources; take each resource on its own, or use the mutex",
                    many.label
                )));
            }
        };
        Ok(Primitive {
            redlock: self.clone(),
            target,
            kind,
        })
    }
}

/// Leaders and jobs.
impl Redlock {
    /// The election `name`. Made only on a handle with fencing: a leader's
    /// term is its lock's fencing token, so that a deposed leader's late
    /// writes can be refused.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the handle has no fencing
    /// ([`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing));
    /// [`Error::EmptyResource`] (or another input error) for the name.
    pub fn election(&self, name: impl AsRef<str>) -> Result<Election, Error> {
        Election::new(self, name.as_ref())
    }

    /// Follows the election `name`: a stream of who leads, which yields the
    /// state when it first knows it and then at every change (see
    /// [`Observer`]).
    ///
    /// # Errors
    /// [`Error::EmptyResource`], or [`Error::NoRuntime`] outside a Tokio
    /// runtime (the observer runs a task).
    pub fn observe(&self, name: &str) -> Result<Observer, Error> {
        Observer::new(self, name, crate::leader::DEFAULT_EVERY)
    }

    /// [`Redlock::observe`], reading the nodes every `every` (besides the
    /// release messages) instead of every second.
    ///
    /// # Errors
    /// See [`Redlock::observe`].
    pub fn observe_every(&self, name: &str, every: Duration) -> Result<Observer, Error> {
        Observer::new(self, name, every)
    }

    /// Runs the future `f` makes under the job's lock, if this replica takes
    /// it: `Ok(Some(output))`; `Ok(None)` when another replica holds it (it
    /// runs this tick, or ran it less than the minimum hold ago).
    ///
    /// The lock is renewed while the job runs (up to
    /// [`JobOptions::at_most`], when the job is dropped and
    /// [`Error::Lost`] returned, as by [`crate::Primitive::run`]). When the job
    /// ends, the key is kept until [`JobOptions::at_least`] after the start
    /// ([`LockGuard::release_at_least`](crate::LockGuard::release_at_least)),
    /// and so it is when the job panics or this call's future is dropped
    /// (a `tokio::time::timeout`, a `select!`): the keep is sent in the
    /// background, as a dropped guard's release is.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{JobOptions, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
    /// // Every replica runs this each minute; timers may be a few seconds apart.
    /// let job = JobOptions::new(Duration::from_secs(30))
    ///     .at_least(Duration::from_secs(20))
    ///     .at_most(Duration::from_secs(10 * 60));
    /// match redlock.run_job("cleanup", &job, |_lock| async { 42 }).await? {
    ///     Some(n) => println!("ran this tick: {n}"),
    ///     None => println!("another replica has this tick"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when [`JobOptions::at_most`] is shorter than
    /// [`JobOptions::at_least`]; an acquire error other than [`Error::Busy`]
    /// (see [`crate::Primitive::guard`]); [`Error::Lost`].
    pub async fn run_job<F, Fut, T>(
        &self,
        job: &str,
        options: &JobOptions,
        f: F,
    ) -> Result<Option<T>, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        crate::job::run_job(self, job, options, f).await
    }
}

impl Primitive {
    /// Which primitive this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The handle it is taken with.
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    /// The resources it is taken on: one, or the set (in key order, without
    /// duplicates).
    pub fn resources(&self) -> Vec<&str> {
        match &self.target {
            Target::One(r) => vec![r],
            Target::Many(many) => many.resources.iter().map(|r| &**r).collect(),
        }
    }

    /// One attempt to take it (no retry).
    ///
    /// # Errors
    /// [`Error::Busy`] when it is held (a semaphore: every permit; a reader:
    /// a writer holds or waits; a writer: a writer or readers hold), its
    /// `retry_after` when known; [`Error::NoQuorum`] when too many nodes
    /// failed; [`Error::NoValidity`] when the quorum came too late; or an
    /// input error.
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_lock(ttl, &RetryPolicy::no_retry(), None).await
    }

    /// Takes it, retrying per the handle's retry policy (with wake-ups on,
    /// waiting for a release between attempts).
    ///
    /// # Errors
    /// The last attempt's error once the policy gives up; see
    /// [`Primitive::try_acquire`].
    pub async fn acquire(&self, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_lock(ttl, self.redlock.retry_policy(), None)
            .await
    }

    /// Takes it, retrying per `retry`.
    ///
    /// # Errors
    /// See [`Primitive::acquire`].
    pub async fn acquire_with(&self, ttl: Duration, retry: &RetryPolicy) -> Result<Lock, Error> {
        self.acquire_lock(ttl, retry, None).await
    }

    /// Takes it (retrying per `options` or the handle's policy) and holds it
    /// with auto-extension until the guard is released or dropped.
    ///
    /// # Errors
    /// See [`Primitive::acquire`]; [`Error::InvalidConfig`] when the loss
    /// margin is not shorter than the TTL.
    pub async fn guard(&self, options: &LockOptions) -> Result<LockGuard, Error> {
        // Checked before any node is asked: a margin that can never hold
        // would otherwise cost every call a full acquire and release.
        self.redlock.core.loss_margin_for(options)?;
        let retry = options
            .retry
            .as_ref()
            .unwrap_or(self.redlock.retry_policy());
        // A Durable counter of a resource with a retention (a client-named
        // request key's) expires after it.
        let retained = options.retained_counter_ttl(self.redlock.core.inner.settings.fencing);
        let lock = self.acquire_lock(options.ttl, retry, retained).await?;
        self.redlock.guard(lock, options)
    }

    /// Runs the future `f` makes while holding it, with auto-extension.
    ///
    /// Before each poll of the work, the lock is checked against the clock
    /// (see [`LockHandle::is_lost`]): once it is lost, the work is not
    /// polled again, it is dropped, and [`Error::Lost`] is returned. Work
    /// that finishes in a poll during which the lock was lost (it blocked
    /// its thread past the deadline) also returns [`Error::Lost`]: it did
    /// not run entirely under the lock. The lock is released when the work
    /// ends.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{LockOptions, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
    /// let total = redlock
    ///     .mutex("tenant:7")
    ///     .run(&LockOptions::new(Duration::from_secs(1)), |lock| async move {
    ///         // lock.remaining(), lock.is_lost() are there if the work wants them
    ///         tokio::time::sleep(Duration::from_secs(3)).await; // renewed meanwhile
    ///         42
    ///     })
    ///     .await?;
    /// assert_eq!(total, 42);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// An acquire error (see [`Primitive::guard`]) or [`Error::Lost`].
    pub async fn run<F, Fut, T>(&self, options: &LockOptions, f: F) -> Result<T, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.guard(options).await?;
        run_guarded(guard, f).await
    }

    /// The retrying acquire of this primitive, counted in the metrics:
    /// where each kind goes. `retained` is the expiry a fence gives a
    /// per-request resource's Durable counter (`LockOptions::fence_retention`).
    pub(crate) async fn acquire_lock(
        &self,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> Result<Lock, Error> {
        let rl = &self.redlock;
        match (&self.target, self.kind) {
            (Target::One(r), Kind::Mutex) => {
                rl.core.lock_with_retained(r, ttl, retry, retained).await
            }
            (Target::Many(many), Kind::Mutex) => {
                rl.core.lock_set(many, Ttl::new(ttl, retained), retry).await
            }
            (Target::One(r), Kind::Permits(n)) => {
                rl.core
                    .acquire_with(&Permits(n), r, ttl, retry, retained)
                    .await
            }
            (Target::One(r), Kind::Read) => {
                rl.core
                    .acquire_with(&Access::Shared, r, ttl, retry, retained)
                    .await
            }
            (Target::One(r), Kind::Write) => {
                rl.core
                    .acquire_with(&Access::Exclusive, r, ttl, retry, retained)
                    .await
            }
            // Not made by `Redlock::primitive`; refused, never downgraded.
            (Target::Many(many), kind) => Err(Error::InvalidConfig(format!(
                "{kind:?} over several resources ({})",
                many.label
            ))),
        }
    }
}
