//! [`RedlockLayer`] and its configuration.

use std::sync::Arc;

use http::HeaderName;
use redlock_core::Redlock;
use redlock_core::request::{__private::Setting, LockPolicy, Rejection};
use tower_layer::Layer;

use crate::config::Config;
use crate::grpc::{ByGrpcMethod, ByMetadata, GrpcBusyCode, GrpcMode, GrpcSettings};
use crate::key::{ByHeader, ByPath, KeyExtractor};
#[cfg(feature = "axum")]
use crate::key::{ByMatchedPath, ByPathParam, ByPathParams};
use crate::rejection::RejectionHandler;
use crate::service::RedlockService;

/// A tower [`Layer`] that runs each request under a Redlock quorum lock on a key
/// taken from the request.
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use redlock_core::Redlock;
/// use redlock_tower::{Held, RedlockLayer};
///
/// async fn run(Held(lock): Held) -> String {
///     format!("ran under {}", lock.key())
/// }
///
/// # fn app(redlock: Redlock) -> Router {
/// Router::new()
///     .route("/jobs/{id}/run", post(run))
///     // one request per path at a time, across replicas
///     .layer(RedlockLayer::by_path().with_redlock(redlock))
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
/// With neither, the request gets a 500, and an error that names the fix is
/// logged (once per process).
///
/// # Responses
///
/// | case | default answer |
/// | --- | --- |
/// | lock busy | 409 + `Retry-After` + `application/problem+json` ([`busy_status`](Self::busy_status), [`wait`](Self::wait)) |
/// | over the limit of [`permits(n)`](Self::permits) | 429, as for busy; the `RateLimit-Policy` and `RateLimit` fields with [`rate_limit_fields`](Self::rate_limit_fields) |
/// | no quorum of nodes | 503 + `Retry-After` ([`fail_open`](Self::fail_open) to run unlocked) |
/// | lock lost mid-handler | handler dropped, 503 ([`on_lost`](Self::on_lost)) |
/// | lock held 30 s (a slow body, a client that does not read) | lost: as above, and a streamed body is cut off ([`max_hold`](Self::max_hold)) |
/// | no key in the request | run unlocked ([`on_missing_key`](Self::on_missing_key) for 400) |
///
/// A gRPC request gets the gRPC form of these answers (a `grpc-status`:
/// `ABORTED`, `UNAVAILABLE`, `INVALID_ARGUMENT`, …): see [`grpc`](crate::grpc).
///
/// [`on_rejection`](Self::on_rejection) replaces these answers. The lock is
/// renewed while the handler runs, and released when the response body has been
/// sent (or dropped), unless [`release_on`](Self::release_on) says otherwise.
/// A response that upgrades its connection (`101`, a WebSocket) keeps it until
/// the last handle lent to the handler is dropped: see
/// [`Held`](crate::Held#websockets-and-other-upgrades).
/// The policy setters are those of [`LockPolicy`]; [`policy`](Self::policy)
/// sets them all at once.
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct RedlockLayer<K = ByPath> {
    pub(crate) key: K,
    pub(crate) config: Arc<Config>,
}

impl<K: std::fmt::Debug> std::fmt::Debug for RedlockLayer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockLayer")
            .field("key", &self.key)
            .field("config", &self.config)
            .finish()
    }
}

impl RedlockLayer<ByPath> {
    /// One lock per request path (`/orders/42`), with the `Redlock` handle taken
    /// from the request extensions unless one is bound.
    ///
    /// The key is the path in canonical form ([`normalize_path`](redlock_core::request::normalize_path)),
    /// so that it names what the router serves: every percent-encoded octet is
    /// decoded (`/orders/%34%32` is `/orders/42`, `%4a` is `J`) except where
    /// decoding would change the path's structure (`%2F` stays distinct from
    /// `/`), and `%` and the octets a path may not carry raw are re-encoded in
    /// upper-case hex, so decoding stays unambiguous (`%2541` is not `%41`).
    /// A key taken from the raw path would let a client take a second lock on
    /// the same resource by spelling its path another way. See [`ByPath`].
    pub fn by_path() -> Self {
        Self::with_key(ByPath)
    }
}

impl RedlockLayer<ByHeader> {
    /// One lock per value of a header (e.g. `X-Tenant-Id`), keyed
    /// `<header name>=<value>` (`x-tenant-id=acme`, the value percent-encoded,
    /// see [`ByHeader`]). Requests without the header follow the missing-key
    /// policy.
    pub fn by_header(header: HeaderName) -> Self {
        Self::with_key(ByHeader::new(header))
    }

    /// One lock per value of a header, keyed `name=<value>`: the key that
    /// [`by_path_param(name)`](Self::by_path_param) gives the same value, so a
    /// route that finds the tenant in the path and one that finds it in a header
    /// share one lock per tenant.
    pub fn by_header_as(header: HeaderName, name: &str) -> Self {
        Self::with_key(ByHeader::new(header).named(name))
    }
}

impl RedlockLayer<ByGrpcMethod> {
    /// One lock per gRPC method (`/jobs.v1.Jobs/Run`), the request path in
    /// canonical form; see [`ByGrpcMethod`].
    pub fn by_grpc_method() -> Self {
        Self::with_key(ByGrpcMethod)
    }
}

impl RedlockLayer<ByMetadata> {
    /// One lock per value of a gRPC metadata entry (`x-tenant`), keyed
    /// `<name>=<value>`; binary metadata (`-bin`) by its decoded bytes. See
    /// [`ByMetadata`].
    pub fn by_metadata(name: HeaderName) -> Self {
        Self::with_key(ByMetadata::new(name))
    }
}

#[cfg(feature = "axum")]
impl RedlockLayer<ByPathParam> {
    /// One lock per value of a named route parameter (`tenant` in
    /// `/tenants/{tenant}/…`), keyed `tenant=<value>`. Apply with
    /// `Router::layer` or `route_layer`.
    ///
    /// The value is the decoded parameter as the router gives it, as text:
    /// parameters that the handler's type compares equal (`042` and `42` as
    /// numbers) are different keys unless `by_fn` normalises them. See
    /// [`ByPathParam`].
    pub fn by_path_param(name: &str) -> Self {
        Self::with_key(ByPathParam::new(name))
    }
}

#[cfg(feature = "axum")]
impl RedlockLayer<ByPathParams> {
    /// One lock over the values of several route parameters together
    /// (`from` and `to` in `/transfers/{from}/{to}`): each value is a key
    /// (`from,to=<value>`), and the request holds all of them as one lock, so two requests over
    /// the same pair in either order exclude each other and never deadlock.
    /// Apply with `Router::layer` or `route_layer`. See [`ByPathParams`]
    /// (and [`ByPathParams::named`] with [`with_key`](Self::with_key) for
    /// `account=<value>` keys).
    pub fn by_path_params<I, S>(params: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::with_key(ByPathParams::new(params))
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
    /// One lock per key computed by `f`; `None` means no key. A key longer
    /// than [`MAX_KEY_BYTES`](redlock_core::request::MAX_KEY_BYTES) is
    /// bounded as every key is; a client's value in it is `f`'s to escape
    /// ([`escape_value`](redlock_core::request::escape_value)) so that it
    /// cannot spell `f`'s separators or another extractor's key (see the
    /// [key format](crate::KeyExtractor#the-key-format)).
    pub fn by_fn(f: F) -> Self {
        Self::with_key(f)
    }
}

impl<K: KeyExtractor> RedlockLayer<K> {
    /// A layer with this key extractor and the default policy.
    pub fn with_key(key: K) -> Self {
        Self {
            key,
            config: Arc::new(Config {
                redlock: None,
                policy: LockPolicy::default(),
                on_rejection: None,
                grpc: GrpcSettings::default(),
            }),
        }
    }

    /// A layer bound to `redlock`, with this key extractor.
    pub fn new(redlock: Redlock, key: K) -> Self {
        Self::with_key(key).with_redlock(redlock)
    }

    /// Binds the `Redlock` handle (it then wins over request extensions).
    pub fn with_redlock(self, redlock: Redlock) -> Self {
        self.map_config(|c| c.redlock = Some(redlock))
    }

    /// Replaces the whole policy (the other setters edit one setting each).
    pub fn policy(self, policy: LockPolicy) -> Self {
        self.map_config(|c| c.policy = policy)
    }

    /// The policy the layer's requests are locked with.
    pub fn lock_policy(&self) -> &LockPolicy {
        &self.config.policy
    }

    redlock_core::lock_policy_setters!(apply = apply_setting, status = http::StatusCode);

    fn apply_setting(self, setting: Setting) -> Self {
        self.map_config(|c| c.policy = setting.apply(c.policy.clone()))
    }

    /// Answers rejected requests (busy, unavailable, lost, …) with what `f`
    /// returns instead of the default problem+json document: any axum
    /// `IntoResponse`, e.g. `(StatusCode, String)`.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use redlock_tower::{Rejection, RedlockLayer};
    ///
    /// let layer = RedlockLayer::by_path().on_rejection(|rejection: &Rejection| {
    ///     (StatusCode::TOO_MANY_REQUESTS, format!("try again: {}", rejection.title()))
    /// });
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "axum")]
    pub fn on_rejection<F, R>(self, f: F) -> Self
    where
        F: Fn(&Rejection) -> R + Send + Sync + 'static,
        R: axum::response::IntoResponse,
    {
        let handler: RejectionHandler = Arc::new(move |rejection: &Rejection| {
            crate::rejection::boxed(axum::response::IntoResponse::into_response(f(rejection)))
        });
        self.map_config(|c| c.on_rejection = Some(handler))
    }

    /// Answers rejected requests (busy, unavailable, lost, …) with what `f`
    /// returns instead of the default problem+json document. (With the `axum`
    /// feature, `f` may return any `IntoResponse`.)
    #[cfg(not(feature = "axum"))]
    pub fn on_rejection<F, B>(self, f: F) -> Self
    where
        F: Fn(&Rejection) -> http::Response<B> + Send + Sync + 'static,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<crate::rejection::BoxError>,
    {
        let handler: RejectionHandler =
            Arc::new(move |rejection: &Rejection| crate::rejection::boxed(f(rejection)));
        self.map_config(|c| c.on_rejection = Some(handler))
    }

    /// Which requests get gRPC answers (a trailers-only `grpc-status`, and
    /// `UNAVAILABLE` trailers for a stream whose lock is lost): by default
    /// those with a gRPC `content-type`. See [`grpc`](crate::grpc).
    pub fn grpc(self, mode: GrpcMode) -> Self {
        self.map_config(|c| c.grpc.mode = mode)
    }

    /// The `grpc-status` of a busy lock: `ABORTED` by default.
    pub fn grpc_busy_code(self, code: GrpcBusyCode) -> Self {
        self.map_config(|c| c.grpc.busy = code)
    }

    fn map_config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }
}

impl<S, K: Clone> Layer<S> for RedlockLayer<K> {
    type Service = RedlockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RedlockService {
            inner,
            key: self.key.clone(),
            config: Arc::clone(&self.config),
        }
    }
}
