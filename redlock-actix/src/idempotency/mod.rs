//! [`IdempotencyMiddleware`] (feature `idempotency`): idempotent requests and
//! webhooks on actix-web, the twin of `redlock-tower`'s `IdempotencyLayer`.
//! Only key extraction and the mapping to and from actix types live here; the
//! flow is [`redlock_core::idempotency`].
//!
//! ```no_run
//! use actix_web::{App, HttpResponse, HttpServer, web};
//! use redlock_actix::Redlock;
//! use redlock_actix::idempotency::IdempotencyMiddleware;
//!
//! async fn pay(body: String) -> HttpResponse {
//!     HttpResponse::Created().body(format!("paid {body}"))
//! }
//!
//! # async fn run(redlock: Redlock) -> std::io::Result<()> {
//! HttpServer::new(move || {
//!     App::new()
//!         .wrap(IdempotencyMiddleware::new(redlock.clone()))
//!         .route("/payments", web::post().to(pay))
//! })
//! .bind(("127.0.0.1", 8080))?
//! .run()
//! .await
//! # }
//! ```
//!
//! The request payload is buffered (up to the policy's cap, else 413) and
//! handed to the handler whole. The response body is buffered up to its cap
//! to be recorded, under the lock and its loss watch as the handler is; a
//! larger one is streamed on, still under the lock, and recorded "completed,
//! not replayable" once it has ended (the lock is held until then). A body
//! that fails, is cut off by the loss of the lock, or is dropped before its
//! end records nothing: the next copy runs the work. A lock lost while the
//! handler runs, or while the body is buffered, is answered through actix's
//! error path (503, see `RedlockMiddleware`).

use std::fmt;
use std::future::{Ready, ready};
use std::pin::Pin;
use std::rc::Rc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{Error, HttpMessage, HttpResponse, ResponseError};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use redlock_core::idempotency::{Begin, KEY_HEADER, REPLAYED_HEADER, Replay, RequestParts};
pub use redlock_core::idempotency::{
    Fingerprint, Fingerprinter, Idempotency, IdempotencyKey, IdempotencyPolicy,
    IdempotencyRejection, IdempotencyStore, KeyError, RedisStore, StorePolicy,
};
use redlock_core::request;

mod recording;
use recording::RecordingBody;

type KeyFn = dyn Fn(&ServiceRequest, &Bytes) -> Option<Result<IdempotencyKey, KeyError>>;
type ScopeFn = dyn Fn(&ServiceRequest) -> Option<String>;

#[derive(Clone)]
enum KeySource {
    IdempotencyKey,
    Header(HeaderName),
    Fn(Rc<KeyFn>),
}

/// actix-web middleware that makes requests idempotent by key (see the module
/// docs, and [`IdempotencyPolicy`] for the defaults).
#[derive(Clone)]
#[must_use = "a middleware does nothing until it wraps an App, Scope or Resource"]
pub struct IdempotencyMiddleware {
    engine: Idempotency,
    key: KeySource,
    scope: Option<Rc<ScopeFn>>,
}

impl fmt::Debug for IdempotencyMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl IdempotencyMiddleware {
    redlock_core::idempotency_setters!(header = HeaderName, what = "middleware");

    /// Keys from `f`, which may read the buffered body. `None`: no key.
    pub fn key_fn(
        mut self,
        f: impl Fn(&ServiceRequest, &Bytes) -> Option<Result<IdempotencyKey, KeyError>> + 'static,
    ) -> Self {
        self.key = KeySource::Fn(Rc::new(f));
        self
    }

    /// Scopes keys by what `f` returns (a tenant, an authenticated
    /// principal). Trust only what the request cannot forge.
    pub fn scope(mut self, f: impl Fn(&ServiceRequest) -> Option<String> + 'static) -> Self {
        self.scope = Some(Rc::new(f));
        self
    }
}

impl<S, B> Transform<S, ServiceRequest> for IdempotencyMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Transform = IdempotencyService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(IdempotencyService {
            inner: Rc::new(service),
            config: Rc::new(self.clone()),
        }))
    }
}

/// The service of [`IdempotencyMiddleware`].
pub struct IdempotencyService<S> {
    inner: Rc<S>,
    config: Rc<IdempotencyMiddleware>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// An [`IdempotencyRejection`] as an actix error: the answer when the lock is
/// lost while the handler runs (the request went to the handler, so only the
/// error path can answer).
#[derive(Debug, Clone)]
pub struct IdempotencyError(pub IdempotencyRejection);

impl fmt::Display for IdempotencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.title())
    }
}

impl std::error::Error for IdempotencyError {}

impl ResponseError for IdempotencyError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.0.status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut builder = HttpResponse::build(self.status_code());
        builder.content_type(IdempotencyRejection::CONTENT_TYPE);
        if let Some(secs) = self.0.retry_after_secs() {
            builder.insert_header((header::RETRY_AFTER, HeaderValue::from(secs)));
        }
        builder.body(self.0.problem_json())
    }
}

fn rejection(r: IdempotencyRejection) -> HttpResponse {
    IdempotencyError(r).error_response()
}

/// The recorded response, with `Idempotent-Replayed: true`.
fn replayed(replay: Replay) -> HttpResponse {
    let status = StatusCode::from_u16(replay.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    for (name, value) in &replay.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            response.append_header((name, value));
        }
    }
    response.insert_header((REPLAYED_HEADER, "true"));
    response.body(replay.body)
}

/// The request's headers as `http` 1 headers (actix-web 4 is on `http` 0.2),
/// for a fingerprinter that reads them.
fn headers_of(req: &ServiceRequest) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in req.headers() {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_str().as_bytes()),
            http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// Reads the payload whole, up to `limit` bytes: `Err(true)` over the cap,
/// `Err(false)` when the payload failed.
async fn read_payload(payload: &mut Payload, limit: usize) -> Result<Bytes, bool> {
    let mut buf = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| false)?;
        if buf.len() + chunk.len() > limit {
            return Err(true);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

impl<S, B> Service<ServiceRequest> for IdempotencyService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(inner);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let inner = Rc::clone(&self.inner);
        let config = Rc::clone(&self.config);
        Box::pin(async move {
            let engine = &config.engine;
            let limit = engine.current_policy().request_body_cap();
            let mut payload = req.take_payload();
            let body = match read_payload(&mut payload, limit).await {
                Ok(body) => body,
                Err(true) => {
                    let r = rejection(IdempotencyRejection::BodyTooLarge { limit });
                    return Ok(req.into_response(r));
                }
                Err(false) => return Ok(req.into_response(HttpResponse::BadRequest().finish())),
            };
            let key = match &config.key {
                KeySource::IdempotencyKey => req
                    .headers()
                    .get(KEY_HEADER)
                    .map(|v| IdempotencyKey::parse(v.as_bytes())),
                KeySource::Header(name) => req.headers().get(name).map(|v| {
                    v.to_str()
                        .map_err(|_| KeyError::BadChar { at: 0 })
                        .and_then(IdempotencyKey::from_value)
                }),
                KeySource::Fn(f) => f(&req, &body),
            };
            let scope = config.scope.as_ref().and_then(|f| f(&req));
            let headers = headers_of(&req);
            let begin = engine
                .begin(
                    key,
                    scope.as_deref(),
                    &RequestParts {
                        method: req.method().as_str(),
                        path: req.path(),
                        query: Some(req.query_string()).filter(|q| !q.is_empty()),
                        headers: &headers,
                        body: &body,
                    },
                )
                .await;
            req.set_payload(Payload::from(body));
            let running = match begin {
                Err(r) => return Ok(req.into_response(rejection(r))),
                Ok(Begin::Replay(replay)) => return Ok(req.into_response(replayed(replay))),
                Ok(Begin::PassThrough) => {
                    return Ok(inner.call(req).await?.map_into_boxed_body());
                }
                Ok(Begin::Run(running)) => running,
            };
            req.extensions_mut().insert(running.lock().handle());
            if let Some(token) = running.lock().handle().fencing_token() {
                req.extensions_mut().insert(token);
            }
            let work = inner.call(req);
            let response =
                match request::guard(work, Some(running.lock()), running.lock_policy()).await {
                    Err(lost) => {
                        return Err(IdempotencyError(IdempotencyRejection::Lock(lost)).into());
                    }
                    Ok(result) => result?,
                };
            let status = response.status().as_u16();
            if !running.policy().stores(status) {
                let _ = running.finish(status, std::iter::empty(), None).await;
                return Ok(response.map_into_boxed_body());
            }
            let cap = running.policy().response_body_cap();
            let (request, response) = response.into_parts();
            let (head, body) = response.into_parts();
            let mut body = Box::pin(body);
            // The body is produced under the lock and its loss watch, as the
            // handler was: what is made after the loss is not recorded.
            let buffered = request::guard(
                buffer(body.as_mut(), cap),
                Some(running.lock()),
                running.lock_policy(),
            )
            .await;
            let (prefix, over) = match buffered {
                Err(lost) => {
                    return Err(IdempotencyError(IdempotencyRejection::Lock(lost)).into());
                }
                Ok(Err(())) => {
                    // Nothing recorded: the next copy runs the work.
                    drop(running);
                    return Ok(ServiceResponse::new(
                        request,
                        HttpResponse::BadGateway().finish(),
                    ));
                }
                Ok(Ok(read)) => read,
            };
            if over {
                // Streamed on under the lock, and recorded "completed, not
                // replayable" only once it has ended well.
                let body = RecordingBody::new(prefix, body, running, status);
                return Ok(ServiceResponse::new(
                    request,
                    head.set_body(body).map_into_boxed_body(),
                ));
            }
            let recorded_headers: Vec<(String, Vec<u8>)> = head
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            let finished = running
                .finish(
                    status,
                    recorded_headers
                        .iter()
                        .map(|(n, v)| (n.as_str(), v.as_slice())),
                    Some(prefix.clone()),
                )
                .await;
            if let Err(r) = finished {
                return Ok(ServiceResponse::new(request, rejection(r)));
            }
            Ok(ServiceResponse::new(
                request,
                head.set_body(prefix).map_into_boxed_body(),
            ))
        })
    }
}

/// Reads `body` up to `cap` bytes: what was read, and whether it went over
/// (the rest is still in `body`); `Err` when the body failed.
async fn buffer<B: MessageBody>(mut body: Pin<&mut B>, cap: usize) -> Result<(Bytes, bool), ()> {
    let mut buf = BytesMut::new();
    while let Some(chunk) = futures_util::future::poll_fn(|cx| body.as_mut().poll_next(cx)).await {
        let chunk = chunk.map_err(|_| ())?;
        buf.extend_from_slice(&chunk);
        if buf.len() > cap {
            return Ok((buf.freeze(), true));
        }
    }
    Ok((buf.freeze(), false))
}
