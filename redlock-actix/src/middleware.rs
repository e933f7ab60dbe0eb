//! [`RedlockMiddleware`] (the `Transform`) and [`RedlockService`] (the
//! `Service` it wraps around the app, a scope or a resource).

use std::fmt;
use std::future::{Ready, ready};
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::HeaderName;
use actix_web::{Error, HttpMessage, ResponseError};
use futures_util::future::LocalBoxFuture;
use redlock_core::request::{self, __private::Setting, LockPolicy, ReleasePolicy, RequestLock};
use redlock_core::{FencingToken, Redlock};

use crate::body::LockedBody;
use crate::key::KeySource;
use crate::rejection::{LockRejection, registered_redlock};

/// actix-web middleware that runs each request under a Redlock quorum lock on a
/// key taken from the request. Use it with `App::wrap`, `Scope::wrap` or
/// `Resource::wrap`.
///
/// ```no_run
/// use actix_web::{App, HttpServer, web};
/// use redlock_actix::{LockHandle, Redlock, RedlockMiddleware};
///
/// async fn rebuild(lock: web::ReqData<LockHandle>) -> String {
///     format!("rebuilt under {}", lock.key())
/// }
///
/// # async fn run(redlock: Redlock) -> std::io::Result<()> {
/// HttpServer::new(move || {
///     App::new()
///         .app_data(redlock.clone())                 // the handle the middleware uses
///         .wrap(RedlockMiddleware::by_path())        // one request per path at a time
///         .route("/reports/{id}/rebuild", web::post().to(rebuild))
/// })
/// .bind(("127.0.0.1", 8080))?
/// .run()
/// .await
/// # }
/// ```
///
/// # The key format
///
/// Every key made from what a client sent stays in its family and bounded
/// in bytes, whatever the client sent (the shared rules are
/// [`KeyFamily`](redlock_core::request::KeyFamily) and
/// [`bound_key`](redlock_core::request::bound_key)):
///
/// | key source | key of the lock |
/// |---|---|
/// | [`by_path`](Self::by_path) | the canonical path, `/orders/42` |
/// | [`by_header(x-tenant-id)`](Self::by_header) | `x-tenant-id=<value>` |
/// | [`by_header_as(.., "tenant")`](Self::by_header_as) | `tenant=<value>` |
/// | [`by_path_param("tenant")`](Self::by_path_param) | `tenant=<value>` |
/// | [`by_path_params(["from", "to"])`](Self::by_path_params) | `from,to=<value>`, one key per parameter |
/// | [`by_path_params_as([..], "account")`](Self::by_path_params_as) | `account=<value>`, one key per parameter |
/// | [`by_match_pattern`](Self::by_match_pattern) | the route pattern, `/tenants/{tenant}/jobs` |
/// | [`by_fn`](Self::by_fn) | what it returns |
///
/// A `<value>` is percent-encoded ([`escape_value`](redlock_core::request::escape_value)):
/// every byte but ASCII letters, digits, `-`, `.`, `_` and `~` is written
/// `%XX`, so `tenant=acme` in a path parameter is the key `from,to=tenant%3Dacme`,
/// not tenant acme's `tenant=acme`, and `a` + `b=c` (`a=b%3Dc`) is not
/// `a=b` + `c` (`a%3Db=c`). The policy's namespace goes before every key
/// (`redlock:` by default), and a key longer than
/// [`MAX_KEY_BYTES`](redlock_core::request::MAX_KEY_BYTES) (256) reaches the
/// nodes as its start and a SHA-256 digest (`/o/aaaa…#sha256-<hex>`). A
/// closure's key is bounded too, but its parts are its own: escape the
/// client's values in it with `escape_value`.
///
/// # Where the `Redlock` handle comes from
///
/// 1. the handle bound with [`with_redlock`](Self::with_redlock), if any;
/// 2. else `app_data::<Redlock>()` (`App::app_data(redlock)`);
/// 3. else `app_data::<web::Data<Redlock>>()` (`App::app_data(web::Data::new(redlock))`).
///
/// The middleware sees the data of the app and of the scope or resource it
/// wraps (`web::scope(..).app_data(redlock).wrap(..)` works too). With no
/// handle, a request that needs a lock gets a 500 and an error is logged that
/// names the fix.
///
/// # Responses
///
/// | case | default answer |
/// | --- | --- |
/// | lock busy | 409 + `Retry-After` + `application/problem+json` ([`busy_status`](Self::busy_status), [`wait`](Self::wait)) |
/// | over the limit of [`permits(n)`](Self::permits) | 429, as for busy; the `RateLimit-Policy` and `RateLimit` fields with [`rate_limit_fields`](Self::rate_limit_fields) |
/// | no quorum of nodes | 503 + `Retry-After` ([`fail_open`](Self::fail_open) to run unlocked) |
/// | lock lost mid-handler | handler future dropped, 503 + `Retry-After`; a streamed body is cut off ([`on_lost`](Self::on_lost)) |
/// | lock held 30 s (a slow body, a client that does not read) | lost: as above ([`max_hold`](Self::max_hold)) |
/// | no key in the request | run unlocked ([`on_missing_key`](Self::on_missing_key) for 400) |
///
/// Busy, unavailable and missing-key answers are ordinary responses (the right
/// side of the [`EitherBody`]). A lock lost mid-handler is answered through
/// actix's error path: the service resolves to `Err(actix_web::Error)` made
/// from a [`LockRejection`], which actix turns into the same 503 document. (The
/// request was handed to the handler, and actix forbids keeping a copy of it
/// while routing runs, so no `ServiceResponse` can be built there.)
///
/// The lock is renewed while the handler runs and released when the response
/// body ends or is dropped (see [`LockedBody`]), or at the response head with
/// [`ReleasePolicy::ResponseHead`]. Handlers read it with
/// `web::ReqData<LockHandle>`.
#[derive(Clone)]
#[must_use = "a middleware does nothing until it wraps an App, Scope or Resource"]
pub struct RedlockMiddleware {
    key: KeySource,
    redlock: Option<Redlock>,
    policy: LockPolicy,
}

impl fmt::Debug for RedlockMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockMiddleware")
            .field("key", &self.key)
            .field("bound_redlock", &self.redlock.is_some())
            .field("policy", &self.policy)
            .finish()
    }
}

impl RedlockMiddleware {
    fn with_key(key: KeySource) -> Self {
        Self {
            key,
            redlock: None,
            policy: LockPolicy::default(),
        }
    }

    /// One lock per request path (`/orders/42`, without the query string).
    ///
    /// The key is the path in canonical form ([`normalize_path`](redlock_core::request::normalize_path)),
    /// so that it names what the router serves: every percent-encoded octet is
    /// decoded (`/orders/%34%32` is `/orders/42`, `%4a` is `J`, `%2B` is `+`, as
    /// actix-web's router and `web::Path` read them) except where decoding
    /// would change the path's structure (`%2F` stays distinct from `/`), and
    /// `%` and the octets a path may not carry raw are re-encoded in upper-case
    /// hex, so decoding stays unambiguous (`%2541` is not `%41`). A key taken
    /// from the raw `req.path()` would let a client take a second lock on the
    /// same resource by spelling its path another way. Under a tail route
    /// (`/files/{rest:.*}`), whose `web::Path` decodes `a%2Fb` and `a/b` alike,
    /// key on the parameter with [`by_path_param`](Self::by_path_param).
    pub fn by_path() -> Self {
        Self::with_key(KeySource::Path)
    }

    /// One lock per value of a header (e.g. `X-Tenant-Id`), keyed
    /// `<header name>=<value>` (`x-tenant-id=acme`, the value percent-encoded,
    /// see [the key format](Self#the-key-format)). Requests without the
    /// header, or with an empty or non-UTF-8 value, follow the missing-key policy.
    ///
    /// The client chooses this value: use it where a client can only hurt itself
    /// by choosing another one, and check it against authentication where that
    /// matters.
    pub fn by_header(name: HeaderName) -> Self {
        Self::with_key(KeySource::header(name, None))
    }

    /// One lock per value of a header, keyed `name=<value>`: the key that
    /// [`by_path_param(name)`](Self::by_path_param) gives the same value, so a
    /// route that finds the tenant in the path and one that finds it in a header
    /// share one lock per tenant.
    pub fn by_header_as(header: HeaderName, name: &str) -> Self {
        Self::with_key(KeySource::header(header, Some(name)))
    }

    /// One lock per route pattern (`/tenants/{tenant}/jobs`), whatever its
    /// parameters; from `req.match_pattern()`, which works at any level,
    /// including `App::wrap`. Requests that match no route have no key.
    pub fn by_match_pattern() -> Self {
        Self::with_key(KeySource::MatchPattern)
    }

    /// One lock per value of a path parameter (`tenant` in
    /// `/tenants/{tenant}/…`), keyed `tenant=<value>`.
    ///
    /// The value is the parameter decoded as `web::Path<String>` gives it to
    /// the handler (`a%2Bb` is `a+b`), as text: parameters that the handler's
    /// type compares equal (`042` and `42` as numbers) are different keys
    /// unless [`by_fn`](Self::by_fn) normalises them.
    ///
    /// It reads `req.match_info()`, which actix fills only once the scope or
    /// resource that declares the parameter has matched. So wrap that scope or
    /// resource (`web::scope("/tenants/{tenant}").wrap(...)`). Wrapped on the
    /// `App`, the parameter is not there yet: every request has no key and runs
    /// unlocked (or gets 400 with [`MissingKeyPolicy::Reject`](crate::MissingKeyPolicy::Reject)); use
    /// [`by_match_pattern`](Self::by_match_pattern) or [`by_fn`](Self::by_fn)
    /// at that level.
    pub fn by_path_param(name: &str) -> Self {
        Self::with_key(KeySource::path_param(name))
    }

    /// One lock over several path parameters together (`from` and `to` in
    /// `/transfers/{from}/{to}`): each decoded value is a key (`from,to=<value>`,
    /// one family for all of them), and the request
    /// holds all of them as one lock
    /// ([`redlock_core::Redlock::mutex_many`](redlock_core::Redlock::mutex_many)), so two
    /// requests over the same pair in either order exclude each other and
    /// never deadlock. A request missing any of them has no key. Wrap the
    /// scope or resource that declares them, as for
    /// [`by_path_param`](Self::by_path_param).
    pub fn by_path_params<I, S>(params: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let params = params.into_iter().map(|p| Arc::from(p.as_ref())).collect();
        Self::with_key(KeySource::path_params(params, None))
    }

    /// [`by_path_params`](Self::by_path_params), each key `name=<value>`
    /// (e.g. `account=7`): the key `by_path_param(name)` gives the same value.
    pub fn by_path_params_as<I, S>(params: I, name: &str) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let params = params.into_iter().map(|p| Arc::from(p.as_ref())).collect();
        Self::with_key(KeySource::path_params(params, Some(name)))
    }

    /// One lock per key computed by `f`; `None` means the request has no key.
    /// A key longer than [`MAX_KEY_BYTES`](redlock_core::request::MAX_KEY_BYTES)
    /// is bounded as every key is; a client's value in it is `f`'s to escape
    /// ([`escape_value`](redlock_core::request::escape_value)), see [the key
    /// format](Self#the-key-format).
    ///
    /// ```
    /// use actix_web::dev::ServiceRequest;
    /// use redlock_actix::RedlockMiddleware;
    ///
    /// let by_method_and_path = RedlockMiddleware::by_fn(|req: &ServiceRequest| {
    ///     Some(format!("{} {}", req.method(), req.path()))
    /// });
    /// # let _ = by_method_and_path;
    /// ```
    pub fn by_fn<F>(f: F) -> Self
    where
        F: Fn(&ServiceRequest) -> Option<String> + Send + Sync + 'static,
    {
        Self::with_key(KeySource::Custom(Arc::new(f)))
    }

    /// Binds the `Redlock` handle; it then wins over the app data.
    pub fn with_redlock(mut self, redlock: Redlock) -> Self {
        self.redlock = Some(redlock);
        self
    }

    /// Replaces the whole policy (the other setters edit one setting each).
    pub fn policy(mut self, policy: LockPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The policy the middleware's requests are locked with.
    pub fn lock_policy(&self) -> &LockPolicy {
        &self.policy
    }

    // actix-web 4 has its own `StatusCode` (from `http` 0.2): `busy_status`
    // takes that one.
    redlock_core::lock_policy_setters!(apply = apply_setting, status = StatusCode);

    fn apply_setting(mut self, setting: Setting) -> Self {
        self.policy = setting.apply(self.policy);
        self
    }
}

impl<S, B> Transform<S, ServiceRequest> for RedlockMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = Error;
    type Transform = RedlockService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RedlockService {
            service: Rc::new(service),
            config: Rc::new(self.clone()),
        }))
    }
}

/// The service [`RedlockMiddleware`] wraps around the inner one (one per worker;
/// it is not `Send`, as actix services need not be).
pub struct RedlockService<S> {
    service: Rc<S>,
    config: Rc<RedlockMiddleware>,
}

impl<S> fmt::Debug for RedlockService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for RedlockService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let config = Rc::clone(&self.config);
        Box::pin(async move { serve_locked(&config, &*service, req).await })
    }
}

/// One request: take the lock, run the inner service under it, and hand the
/// lock to the response body (or drop it, per the release policy).
async fn serve_locked<S, B>(
    config: &RedlockMiddleware,
    service: &S,
    req: ServiceRequest,
) -> Result<ServiceResponse<EitherBody<LockedBody<B>>>, Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
    B: MessageBody,
{
    let key = config.key.keys_of(&req);
    let redlock = config
        .redlock
        .clone()
        .or_else(|| registered_redlock(req.request()));
    let reads = request::is_read_method(req.method().as_str());
    let lock = match request::acquire_keys_for(redlock.as_ref(), key, &config.policy, reads).await {
        Ok(lock) => lock,
        Err(rejection) => {
            let answer = LockRejection::from(rejection).error_response();
            return Ok(req.into_response(answer).map_into_right_body());
        }
    };
    let fencing_token = lend_lock(&req, lock.as_ref());

    // With `LostPolicy::Abort`, a lost lock ends this await with an error and the
    // handler's future is dropped with it.
    let response = request::guard(service.call(req), lock.as_ref(), &config.policy)
        .await
        .map_err(LockRejection::from)??;

    let Some(held) = lock else {
        return Ok(response.map_body(|_, body| {
            EitherBody::left(LockedBody::new(body, None, config.policy.lost_policy()))
        }));
    };
    Ok(hand_over(config, response, held, fencing_token).await)
}

/// Puts the lock's handle, and its fencing token if it has one, in the
/// request's extensions for the handler. Returns the token.
fn lend_lock(req: &ServiceRequest, lock: Option<&RequestLock>) -> Option<FencingToken> {
    let fencing_token = lock.and_then(|l| l.handle().fencing_token());
    if let Some(lock) = lock {
        if let Some(token) = fencing_token {
            req.extensions_mut().insert(token);
        }
        req.extensions_mut().insert(lock.handle());
    }
    fencing_token
}

/// The response of a request that ran under `held`: the fencing header, then
/// the lock released or handed to the body, per the release policy.
async fn hand_over<B: MessageBody>(
    config: &RedlockMiddleware,
    response: ServiceResponse<B>,
    held: RequestLock,
    fencing_token: Option<FencingToken>,
) -> ServiceResponse<EitherBody<LockedBody<B>>> {
    // Release before the head goes out, so the client never sees its own request
    // still holding the lock: at once with `ResponseHead`, and with `BodyEnd` when
    // the body is already in memory (it is complete, so the release does not wait
    // for anything, and head and body then go out together).
    let (req, mut response) = response.into_parts();
    let upgrade = request::is_upgrade(
        response.status().as_u16(),
        req.method() == actix_web::http::Method::CONNECT,
    );
    if let (Some(name), Some(token)) = (config.policy.fencing_header_name(), fencing_token)
        && let Ok(name) = actix_web::http::header::HeaderName::from_bytes(name.as_bytes())
    {
        response.headers_mut().insert(
            name,
            actix_web::http::header::HeaderValue::from(token.get()),
        );
    }
    let (response, body) = response.into_parts();
    let body = match config.policy.release_policy() {
        ReleasePolicy::ResponseHead => {
            held.release().await;
            LockedBody::new(body, None, config.policy.lost_policy())
        }
        ReleasePolicy::BodyEnd => match body.try_into_bytes() {
            Ok(bytes) => {
                // An upgrade's session runs after this body: the handles lent
                // to it hold the lock, if it kept any.
                let held = if upgrade {
                    held.keep_while_lent()
                } else {
                    Some(held)
                };
                if let Some(held) = held {
                    held.release().await;
                }
                LockedBody::whole(bytes)
            }
            // A streamed body holds the lock, and is cut off if it is lost
            // (with `LostPolicy::Abort`); an upgrade's (its frames) then hands
            // it to the handles lent to the session.
            Err(body) => {
                LockedBody::streamed(body, Some(held), config.policy.lost_policy(), upgrade)
            }
        },
    };
    ServiceResponse::new(req, response.set_body(EitherBody::left(body)))
}
