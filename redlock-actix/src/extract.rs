//! [`HeldLock`]: a lock taken by a handler argument (or by the handler itself),
//! and its app-data configuration [`HeldLockConfig`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use futures_util::future::LocalBoxFuture;
use redlock_core::request::{self, LockPolicy, MissingKeyPolicy, RequestLock};
use redlock_core::{LockHandle, Redlock};

use crate::rejection::{LockRejection, registered_redlock};

type RequestKeyFn = Arc<dyn Fn(&HttpRequest) -> Option<String> + Send + Sync>;

/// How [`HeldLock`] takes its lock, registered like `web::JsonConfig`: with
/// `app_data` on the app, a scope or a resource (the innermost wins), as is or
/// wrapped in `web::Data`.
///
/// ```no_run
/// use std::time::Duration;
/// use actix_web::{App, web};
/// use redlock_actix::{HeldLockConfig, LockPolicy, Redlock};
///
/// # fn app(redlock: Redlock) {
/// let app = App::new().app_data(
///     HeldLockConfig::new()
///         .key(|req| req.match_info().get("order").map(|id| format!("order:{id}")))
///         .policy(LockPolicy::default().wait(Duration::from_secs(2)))
///         .with_redlock(redlock),
/// );
/// # let _ = app; }
/// ```
///
/// Without a config, [`HeldLock`] uses the default one: the `Redlock` handle
/// from `app_data` (as for the middleware), no key function, and the default
/// [`LockPolicy`] except that a request without a key is rejected with 400.
#[derive(Clone)]
pub struct HeldLockConfig {
    redlock: Option<Redlock>,
    key: Option<RequestKeyFn>,
    policy: Arc<LockPolicy>,
}

impl fmt::Debug for HeldLockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLockConfig")
            .field("bound_redlock", &self.redlock.is_some())
            .field("has_key_fn", &self.key.is_some())
            .field("policy", &self.policy)
            .finish()
    }
}

impl Default for HeldLockConfig {
    fn default() -> Self {
        Self {
            redlock: None,
            key: None,
            policy: Arc::new(LockPolicy::default().on_missing_key(MissingKeyPolicy::Reject)),
        }
    }
}

impl HeldLockConfig {
    /// The default configuration (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// The key of a request for the [`FromRequest`] path; `None` means the
    /// request has no key (400 unless the policy passes such requests through).
    pub fn key<F>(mut self, f: F) -> Self
    where
        F: Fn(&HttpRequest) -> Option<String> + Send + Sync + 'static,
    {
        self.key = Some(Arc::new(f));
        self
    }

    /// Binds the `Redlock` handle; it then wins over the one in `app_data`.
    pub fn with_redlock(mut self, redlock: Redlock) -> Self {
        self.redlock = Some(redlock);
        self
    }

    /// The lock policy: TTL, wait or fail fast, busy status, fail-open, namespace,
    /// what [`HeldLock::run`] does on loss. The release policy does not
    /// apply: a [`HeldLock`] is released when it is dropped.
    pub fn policy(mut self, policy: LockPolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// The policy [`HeldLock`] takes its lock with.
    pub fn lock_policy(&self) -> &LockPolicy {
        &self.policy
    }

    /// The config that applies to `req`.
    fn of(req: &HttpRequest) -> Self {
        req.app_data::<Self>()
            .or_else(|| req.app_data::<web::Data<Self>>().map(|data| data.get_ref()))
            .cloned()
            .unwrap_or_default()
    }

    fn redlock_for(&self, req: &HttpRequest) -> Option<Redlock> {
        self.redlock.clone().or_else(|| registered_redlock(req))
    }
}

/// A Redlock quorum lock held by a handler: taken before the handler body runs
/// (as an argument), or by the handler itself with [`HeldLock::acquire`], and
/// released when it is dropped, so at the latest when the handler returns. The
/// response body is not covered; use [`RedlockMiddleware`](crate::RedlockMiddleware)
/// to hold a lock until the body has been sent.
///
/// As an argument, the key comes from [`HeldLockConfig::key`], which sees only
/// the request (`FromRequest` cannot see the values of the other extractors):
///
/// ```no_run
/// use actix_web::{App, web};
/// use redlock_actix::{HeldLock, HeldLockConfig};
///
/// async fn settle(_lock: HeldLock, account: web::Path<u64>) -> String {
///     format!("account {account} settled")          // runs only under the lock
/// }
///
/// # fn app() {
/// let app = App::new()
///     .app_data(HeldLockConfig::new().key(|req| {
///         req.match_info().get("account").map(|a| format!("account:{a}"))
///     }))
///     .route("/accounts/{account}/settle", web::post().to(settle));
/// # let _ = app; }
/// ```
///
/// For a key computed from the handler's own arguments (a JSON body, several
/// path parts, the authenticated user), take the lock inside the handler:
///
/// ```no_run
/// use actix_web::{HttpRequest, web};
/// use redlock_actix::{HeldLock, LockRejection};
///
/// async fn pay(req: HttpRequest, invoice: web::Json<u64>) -> Result<String, LockRejection> {
///     let lock = HeldLock::acquire(&req, format!("invoice:{invoice}")).await?;
///     // One payment per invoice at a time; `lock.run(..)` would also stop the
///     // work if the lock were lost.
///     let receipt = format!("paid under {:?}", lock.handle().map(|h| h.key().to_owned()));
///     Ok(receipt)
/// }
/// ```
///
/// Either way a refusal is a [`LockRejection`]: 409 (or the configured busy
/// status) when another request holds the key, 503 when no quorum answers, 400
/// when there is no key, 500 when no `Redlock` handle is configured.
///
/// With an `async fn` handler the lock lives as long as the handler's future.
/// With a closure that returns an `async move` block, move the lock into the
/// block (`|lock: HeldLock| async move { let _lock = lock; … }`): an argument
/// the block does not use is dropped, and the lock released, before the block
/// runs.
///
/// The lock is renewed while held. It cannot drop the handler by itself when the
/// lock is lost: watch [`HeldLock::is_lost`], or run the work through
/// [`HeldLock::run`], which stops it (per the policy's
/// [`LostPolicy`](crate::LostPolicy)).
#[must_use = "dropping a HeldLock releases the lock"]
pub struct HeldLock {
    lock: Option<RequestLock>,
    policy: Arc<LockPolicy>,
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLock")
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl HeldLock {
    /// Takes the lock on `key` (the policy's namespace is put before it) with
    /// the [`HeldLockConfig`] and `Redlock` handle that apply to `req`.
    ///
    /// # Errors
    /// A [`LockRejection`] when the lock is busy, no quorum answers, or no
    /// `Redlock` handle is configured.
    pub async fn acquire(req: &HttpRequest, key: impl Into<String>) -> Result<Self, LockRejection> {
        let config = HeldLockConfig::of(req);
        let redlock = config.redlock_for(req);
        Self::take(redlock, Some(key.into()), config.policy).await
    }

    async fn take(
        redlock: Option<Redlock>,
        key: Option<String>,
        policy: Arc<LockPolicy>,
    ) -> Result<Self, LockRejection> {
        let lock = request::acquire(redlock.as_ref(), key, &policy).await?;
        Ok(Self { lock, policy })
    }

    /// The held lock's handle; `None` when the request runs unlocked (no key with
    /// a pass-through policy, or fail-open).
    pub fn handle(&self) -> Option<LockHandle> {
        self.lock.as_ref().map(RequestLock::handle)
    }

    /// Whether a lock is held (see [`HeldLock::handle`]).
    pub fn is_held(&self) -> bool {
        self.lock.is_some()
    }

    /// Whether the lock was lost: another client may hold it now.
    pub fn is_lost(&self) -> bool {
        self.lock.as_ref().is_some_and(|l| l.handle().is_lost())
    }

    /// Runs `work` under the lock. With [`LostPolicy::Abort`](crate::LostPolicy)
    /// (the default) `work` is dropped as soon as the lock is lost and the result
    /// is a 503 [`LockRejection`]; with `Signal`, or without a lock, it is
    /// `work`'s own result.
    ///
    /// # Errors
    /// [`Rejection::Lost`](crate::Rejection) when the lock was lost first.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockRejection> {
        Ok(request::guard(work, self.lock.as_ref(), &self.policy).await?)
    }

    /// Releases the lock now (the same as dropping it).
    pub fn release(self) {
        drop(self);
    }
}

impl FromRequest for HeldLock {
    type Error = LockRejection;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let config = HeldLockConfig::of(req);
        let key = config.key.as_ref().and_then(|key_of| key_of(req));
        let redlock = config.redlock_for(req);
        Box::pin(Self::take(redlock, key, config.policy))
    }
}
