//! [`IdempotencyLayer`] (feature `idempotency`): idempotent requests and
//! webhooks on tower/axum. Only key extraction and the mapping to and from
//! `http` types live here; the flow is [`redlock_core::idempotency`], shared
//! with `redlock-actix`.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::idempotency::IdempotencyLayer;
//!
//! async fn pay(body: String) -> (axum::http::StatusCode, String) {
//!     (axum::http::StatusCode::CREATED, format!("paid {body}"))
//! }
//!
//! # fn app(redlock: Redlock) -> Router {
//! Router::new()
//!     .route("/payments", post(pay))
//!     // `Idempotency-Key` required; a retry gets the first response.
//!     .layer(IdempotencyLayer::new(redlock))
//! # }
//! ```
//!
//! The request body is buffered (up to the policy's cap, else 413) so it can
//! be fingerprinted, and the handler gets it whole. The response body is
//! produced under the lock and its loss watch, as the handler is, and
//! buffered up to its cap to be recorded; a larger one is streamed on, still
//! under the lock, and recorded "completed, not replayable" once it has ended
//! (the lock is held until then). A body that fails, is cut off by the loss of
//! the lock, or is dropped before its end (the client gone) records nothing:
//! the next copy of the request runs the work. Trailers of a recorded
//! response are not kept, so gRPC requests (`content-type:
//! application/grpc*`), whose status is in the trailers, are refused before
//! the handler runs: `grpc-status: 13` (`INTERNAL`) and a message that says
//! why. Keep gRPC services outside this layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use redlock_core::idempotency::{Begin, KEY_HEADER, REPLAYED_HEADER, Replay, RequestParts};
use redlock_core::request;
use tower_layer::Layer;
use tower_service::Service;

use crate::rejection::BoxError;

mod recording;
use recording::RecordingBody;

pub use redlock_core::idempotency::{
    Fingerprint, Fingerprinter, Idempotency, IdempotencyKey, IdempotencyPolicy,
    IdempotencyRejection, IdempotencyStore, KeyError, RedisStore, StorePolicy,
};

/// The response body of the layer: a replay or a rejection (whole), a
/// recorded response (whole), or the handler's own body (passed through).
pub type IdempotencyBody = UnsyncBoxBody<Bytes, BoxError>;

type KeyFn =
    dyn Fn(&http::request::Parts, &Bytes) -> Option<Result<IdempotencyKey, KeyError>> + Send + Sync;
type ScopeFn = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;

/// Where a request's key comes from.
#[derive(Clone)]
enum KeySource {
    /// `Idempotency-Key`: an sf-string or a bare token.
    IdempotencyKey,
    /// A named header, its value taken as is (`X-GitHub-Delivery`, …).
    Header(HeaderName),
    /// A closure, which may read the buffered body.
    Fn(Arc<KeyFn>),
}

/// A tower [`Layer`] that makes requests idempotent by key (see the module
/// docs and [`IdempotencyPolicy`] for the defaults).
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct IdempotencyLayer {
    engine: Idempotency,
    key: KeySource,
    scope: Option<Arc<ScopeFn>>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    redlock_core::idempotency_setters!(header = HeaderName, what = "layer");

    /// Keys from `f`, which may read the buffered body (Stripe puts its event
    /// id in the JSON body). `None`: the request has no key.
    pub fn key_fn(
        mut self,
        f: impl Fn(&http::request::Parts, &Bytes) -> Option<Result<IdempotencyKey, KeyError>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.key = KeySource::Fn(Arc::new(f));
        self
    }

    /// Scopes keys by what `f` returns (a tenant, an authenticated
    /// principal), so that one client cannot read another's result with the
    /// same key. Trust only what the request cannot forge.
    pub fn scope(
        mut self,
        f: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.scope = Some(Arc::new(f));
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`IdempotencyLayer`].
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    layer: IdempotencyLayer,
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<IdempotencyBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone-in-call pattern: the ready service goes into the future.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(handle(layer, inner, req))
    }
}

async fn handle<S, ReqBody, ResBody>(
    layer: IdempotencyLayer,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<IdempotencyBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    if crate::grpc::is_grpc(req.headers()) {
        return Ok(crate::grpc::status::idempotency_refused());
    }
    let policy = layer.engine.current_policy();
    let (mut parts, body) = req.into_parts();
    let limit = policy.request_body_cap();
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            if error.is::<http_body_util::LengthLimitError>() {
                return Ok(rejection(&IdempotencyRejection::BodyTooLarge { limit }));
            }
            tracing::debug!(%error, "request body unreadable");
            let mut response = whole(Bytes::new());
            *response.status_mut() = StatusCode::BAD_REQUEST;
            return Ok(response);
        }
    };
    let key = match &layer.key {
        KeySource::IdempotencyKey => parts
            .headers
            .get(KEY_HEADER)
            .map(|v| IdempotencyKey::parse(v.as_bytes())),
        KeySource::Header(name) => parts.headers.get(name).map(|v| {
            std::str::from_utf8(v.as_bytes())
                .map_err(|_| KeyError::BadChar { at: 0 })
                .and_then(IdempotencyKey::from_value)
        }),
        KeySource::Fn(f) => f(&parts, &bytes),
    };
    let scope = layer.scope.as_ref().and_then(|f| f(&parts));
    let uri = original_uri(&parts);
    let begin = layer
        .engine
        .begin(
            key,
            scope.as_deref(),
            &RequestParts {
                method: parts.method.as_str(),
                path: uri.path(),
                query: uri.query(),
                headers: &parts.headers,
                body: &bytes,
            },
        )
        .await;
    let running = match begin {
        Err(r) => return Ok(rejection(&r)),
        Ok(Begin::Replay(replay)) => return Ok(replayed(replay)),
        Ok(Begin::PassThrough) => {
            let response = inner
                .call(Request::from_parts(parts, Full::new(bytes)))
                .await?;
            return Ok(response.map(|b| b.map_err(Into::into).boxed_unsync()));
        }
        Ok(Begin::Run(running)) => running,
    };
    parts.extensions.insert(running.lock().handle());
    if let Some(token) = running.lock().handle().fencing_token() {
        parts.extensions.insert(token);
    }
    let work = inner.call(Request::from_parts(parts, Full::new(bytes)));
    let response = match request::guard(work, Some(running.lock()), running.lock_policy()).await {
        // Lost while the handler ran: dropped, nothing recorded.
        Err(lost) => return Ok(rejection(&IdempotencyRejection::Lock(lost))),
        Ok(result) => result?,
    };
    let (head, body) = response.into_parts();
    let status = head.status.as_u16();
    if !running.policy().stores(status) {
        // Not recorded (a 5xx, say): the next copy runs again.
        let _ = running.finish(status, std::iter::empty(), None).await;
        return Ok(Response::from_parts(
            head,
            body.map_err(Into::into).boxed_unsync(),
        ));
    }
    let cap = running.policy().response_body_cap();
    // The body is produced under the lock and its loss watch, as the
    // handler was: what is made after the loss is not recorded.
    let buffered = request::guard(
        buffer(Box::pin(body), cap),
        Some(running.lock()),
        running.lock_policy(),
    )
    .await;
    let buffered = match buffered {
        Err(lost) => return Ok(rejection(&IdempotencyRejection::Lock(lost))),
        Ok(buffered) => buffered,
    };
    match buffered {
        Buffered::Whole(bytes) => {
            let headers = head.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
            if let Err(r) = running.finish(status, headers, Some(bytes.clone())).await {
                return Ok(rejection(&r));
            }
            let mut head = head;
            head.headers.remove(header::CONTENT_LENGTH);
            Ok(Response::from_parts(head, whole(bytes).into_body()))
        }
        Buffered::Over { prefix, rest } => {
            // Streamed on under the lock, and recorded "completed, not
            // replayable" only once it has ended well.
            let body = RecordingBody::new(
                prefix,
                rest.map_err(Into::into).boxed_unsync(),
                running,
                status,
            );
            Ok(Response::from_parts(head, body.boxed_unsync()))
        }
        Buffered::Failed(error) => {
            tracing::warn!(%error, "response body failed; nothing recorded");
            drop(running);
            let mut response = whole(Bytes::new());
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            Ok(response)
        }
    }
}

/// The URI the client sent: inside a nested axum router, `parts.uri` has lost
/// the nest's prefix, and two tenants' `/tenants/{t}/pay` would both read
/// `/pay` (with the `axum` feature, its `OriginalUri` is taken).
fn original_uri(parts: &http::request::Parts) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}

/// A response body read up to a cap.
enum Buffered<B> {
    /// The whole body (trailers dropped).
    Whole(Bytes),
    /// Over the cap: what was read, and the rest.
    Over { prefix: Bytes, rest: B },
    /// The body failed.
    Failed(BoxError),
}

async fn buffer<B>(mut body: B, cap: usize) -> Buffered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > cap {
                        return Buffered::Over {
                            prefix: buf.freeze(),
                            rest: body,
                        };
                    }
                }
            }
            Err(e) => return Buffered::Failed(e.into()),
        }
    }
    Buffered::Whole(buf.freeze())
}

fn whole(bytes: Bytes) -> Response<IdempotencyBody> {
    Response::new(Full::new(bytes).map_err(|e| match e {}).boxed_unsync())
}

/// The recorded response, with `Idempotent-Replayed: true`.
fn replayed(replay: Replay) -> Response<IdempotencyBody> {
    let mut response = whole(replay.body);
    *response.status_mut() =
        StatusCode::from_u16(replay.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in replay.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            headers.append(name, value);
        }
    }
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// The problem+json answer to `rejection`, with `Retry-After` where it
/// applies.
fn rejection(rejection: &IdempotencyRejection) -> Response<IdempotencyBody> {
    let mut response = whole(Bytes::from(rejection.problem_json()));
    *response.status_mut() = rejection.status();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(IdempotencyRejection::CONTENT_TYPE),
    );
    if let Some(secs) = rejection.retry_after_secs() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}
