//! [`RedlockLayer`] and its configuration.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, StatusCode};
use redlock_core::Redlock;
use redlock_core::request::{LockPolicy, LostPolicy, MissingKeyPolicy, Rejection, ReleasePolicy};
use tower_layer::Layer;

use crate::key::{ByHeader, ByPath, KeyExtractor};
#[cfg(feature = "axum")]
use crate::key::{ByMatchedPath, ByPathParam};
use crate::service::RedlockService;

/// Builds the response for a rejected request (busy, unavailable, lost, …).
pub type RejectionHandler = Arc<dyn Fn(&Rejection) -> http::Response<Bytes> + Send + Sync>;

/// A tower [`Layer`] that runs each request under a Redlock quorum lock on a key
/// taken from the request.
///
/// ```no_run
/// use axum::{Extension, Router, routing::post};
/// use redlock_core::Redlock;
/// use redlock_tower::RedlockLayer;
///
/// # fn app(redlock: Redlock) -> Router {
/// Router::new()
///     .route("/jobs/{id}/run", post(|| async { "done" }))
///     .layer(RedlockLayer::by_path())   // one request per path at a time, across replicas
///     .layer(Extension(redlock))        // the handle the lock layer uses
/// # }
/// ```
///
/// # Where the `Redlock` handle comes from
///
/// 1. the handle bound on the layer ([`RedlockLayer::new`] or
///    [`RedlockLayer::with_redlock`]), if any;
/// 2. else a `Redlock` in the request extensions, e.g. from
///    `.layer(Extension(redlock))` added *after* (so outside) the lock layer.
///
/// With neither, the request gets a 500 and an error is logged that names the fix.
///
/// # Responses
///
/// | case | default answer |
/// | --- | --- |
/// | lock busy | 409 + `Retry-After` + `application/problem+json` ([`busy_status`](Self::busy_status), [`wait`](Self::wait)) |
/// | no quorum of nodes | 503 + `Retry-After` ([`fail_open`](Self::fail_open) to run unlocked) |
/// | lock lost mid-handler | handler dropped, 503 ([`on_lost`](Self::on_lost)) |
/// | no key in the request | run unlocked ([`on_missing_key`](Self::on_missing_key) for 400) |
///
/// The lock is renewed while the handler runs, and released when the response
/// body has been sent (or dropped), unless [`release_on`](Self::release_on)
/// says otherwise.
#[derive(Clone)]
pub struct RedlockLayer<K = ByPath> {
    pub(crate) key: K,
    pub(crate) redlock: Option<Redlock>,
    pub(crate) policy: Arc<LockPolicy>,
    pub(crate) on_rejection: Option<RejectionHandler>,
}

impl<K: std::fmt::Debug> std::fmt::Debug for RedlockLayer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockLayer")
            .field("key", &self.key)
            .field("redlock", &self.redlock)
            .field("policy", &self.policy)
            .finish()
    }
}

impl RedlockLayer<ByPath> {
    /// One lock per request path (`/orders/42`), with the `Redlock` handle taken
    /// from the request extensions unless one is bound.
    pub fn by_path() -> Self {
        Self::with_key(ByPath)
    }
}

impl RedlockLayer<ByHeader> {
    /// One lock per value of a header (e.g. `X-Tenant-Id`). Requests without the
    /// header follow the missing-key policy.
    pub fn by_header(name: HeaderName) -> Self {
        Self::with_key(ByHeader(name))
    }
}

#[cfg(feature = "axum")]
impl RedlockLayer<ByPathParam> {
    /// One lock per value of a named route parameter (`tenant` in
    /// `/tenants/{tenant}/…`). Apply with `Router::layer` or `route_layer`.
    pub fn by_path_param(name: &str) -> Self {
        Self::with_key(ByPathParam(name.into()))
    }
}

#[cfg(feature = "axum")]
impl RedlockLayer<ByMatchedPath> {
    /// One lock per matched route template (`/tenants/{tenant}/jobs`).
    pub fn by_matched_path() -> Self {
        Self::with_key(ByMatchedPath)
    }
}

impl<F> RedlockLayer<F>
where
    F: Fn(&http::request::Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    /// One lock per key computed by `f`; `None` means no key.
    pub fn by_fn(f: F) -> Self {
        Self::with_key(f)
    }
}

impl<K: KeyExtractor> RedlockLayer<K> {
    /// A layer with this key extractor and the default policy.
    pub fn with_key(key: K) -> Self {
        Self {
            key,
            redlock: None,
            policy: Arc::new(LockPolicy::default()),
            on_rejection: None,
        }
    }

    /// A layer bound to `redlock`, with this key extractor.
    pub fn new(redlock: Redlock, key: K) -> Self {
        Self::with_key(key).with_redlock(redlock)
    }

    /// Binds the `Redlock` handle (it then wins over request extensions).
    pub fn with_redlock(mut self, redlock: Redlock) -> Self {
        self.redlock = Some(redlock);
        self
    }

    fn map_policy(mut self, f: impl FnOnce(LockPolicy) -> LockPolicy) -> Self {
        self.policy = Arc::new(f((*self.policy).clone()));
        self
    }

    /// Replaces the whole policy.
    pub fn policy(mut self, policy: LockPolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// The TTL of the lock keys (default 5 s); the lock is renewed while the
    /// request runs, so this is only how long others wait after a crash.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.map_policy(|p| p.ttl(ttl))
    }

    /// Waits up to `timeout` for a busy lock before answering busy.
    pub fn wait(self, timeout: Duration) -> Self {
        self.map_policy(|p| p.wait(timeout))
    }

    /// The status for a busy lock (default `409 Conflict`).
    pub fn busy_status(self, status: StatusCode) -> Self {
        self.map_policy(|p| p.busy_status(status.as_u16()))
    }

    /// Runs requests unlocked when no quorum answers (default: 503, fail closed).
    pub fn fail_open(self) -> Self {
        self.map_policy(LockPolicy::fail_open)
    }

    /// What to do when the lock is lost mid-handler (default: abort with 503).
    pub fn on_lost(self, policy: LostPolicy) -> Self {
        self.map_policy(|p| p.on_lost(policy))
    }

    /// When to release (default: at the end of the response body).
    pub fn release_on(self, policy: ReleasePolicy) -> Self {
        self.map_policy(|p| p.release_on(policy))
    }

    /// What to do with a request that yields no key (default: run it unlocked).
    pub fn on_missing_key(self, policy: MissingKeyPolicy) -> Self {
        self.map_policy(|p| p.on_missing_key(policy))
    }

    /// Stops renewing after this long.
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.map_policy(|p| p.max_hold(max_hold))
    }

    /// The prefix of every key (default `"redlock:"`).
    pub fn key_prefix(self, prefix: &str) -> Self {
        self.map_policy(|p| p.key_prefix(prefix))
    }

    /// Builds rejection responses with `f` instead of the default problem+json.
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.on_rejection = Some(Arc::new(f));
        self
    }
}

impl<S, K: Clone> Layer<S> for RedlockLayer<K> {
    type Service = RedlockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RedlockService {
            inner,
            layer: self.clone(),
        }
    }
}
