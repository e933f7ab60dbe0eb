//! The gRPC answers: a rejection as a trailers-only response, and the
//! trailers that end a stream whose lock was lost.

#[cfg(feature = "idempotency")]
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use redlock_core::request::Rejection;

use super::GrpcBusyCode;
use crate::rejection::RejectionBody;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// `INVALID_ARGUMENT`.
const INVALID_ARGUMENT: u16 = 3;
/// `INTERNAL`.
const INTERNAL: u16 = 13;
/// `UNAVAILABLE`.
const UNAVAILABLE: u16 = 14;

/// The pushback of an unavailable answer: the HTTP answer's `Retry-After: 1`.
const UNAVAILABLE_PUSHBACK_MS: u64 = 1000;

/// What `grpc-message` percent-encodes (the gRPC spec): every byte outside
/// printable ASCII (space to `~`), and `%`.
const MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// The gRPC status code of `rejection`, and its retry pushback in ms.
pub(crate) fn code_of(rejection: &Rejection, busy: GrpcBusyCode) -> (u16, Option<u64>) {
    match rejection {
        Rejection::Busy { retry_after, .. } => {
            let ms = retry_after.map_or(UNAVAILABLE_PUSHBACK_MS, |d| {
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
            });
            (busy.code(), Some(ms))
        }
        Rejection::Unavailable { .. } | Rejection::Lost { .. } => {
            (UNAVAILABLE, Some(UNAVAILABLE_PUSHBACK_MS))
        }
        Rejection::MissingKey | Rejection::InvalidKey { .. } => (INVALID_ARGUMENT, None),
        Rejection::MissingHandle | Rejection::Misconfigured { .. } => (INTERNAL, None),
        // A rejection added later (e.g. permits over their limit): by its
        // HTTP status, a busy one if it is one of the busy statuses.
        other => {
            let pushback = other.retry_after_secs().map(|s| s.saturating_mul(1000));
            match other.status() {
                StatusCode::CONFLICT | StatusCode::LOCKED | StatusCode::TOO_MANY_REQUESTS => {
                    (busy.code(), pushback)
                }
                StatusCode::SERVICE_UNAVAILABLE => (UNAVAILABLE, pushback),
                status if status.is_client_error() => (INVALID_ARGUMENT, None),
                _ => (INTERNAL, None),
            }
        }
    }
}

/// `text`, percent-encoded as `grpc-message` wants it.
fn message(text: &str) -> HeaderValue {
    let encoded = utf8_percent_encode(text, MESSAGE).to_string();
    HeaderValue::from_str(&encoded).unwrap_or(HeaderValue::from_static("lock rejected"))
}

/// The message of `rejection`: its title and the key it is about.
fn message_of(rejection: &Rejection) -> HeaderValue {
    match rejection.key() {
        Some(key) => message(&format!("{}: {key}", rejection.title())),
        None => message(rejection.title()),
    }
}

/// A trailers-only response: HTTP 200 with the status in the head and no body.
fn trailers_only(
    code: u16,
    message: HeaderValue,
    pushback_ms: Option<u64>,
) -> Response<RejectionBody> {
    let mut response = Response::new(
        Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from(code));
    headers.insert(GRPC_MESSAGE, message);
    if let Some(ms) = pushback_ms {
        headers.insert(GRPC_PUSHBACK, HeaderValue::from(ms));
    }
    response
}

/// The gRPC answer to `rejection` (see the [module docs](super)).
pub(crate) fn response(rejection: &Rejection, busy: GrpcBusyCode) -> Response<RejectionBody> {
    let (code, pushback) = code_of(rejection, busy);
    trailers_only(code, message_of(rejection), pushback)
}

/// The trailers that end a stream whose lock on `resource` was lost.
pub(crate) fn lost_trailers(resource: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert(GRPC_STATUS, HeaderValue::from(UNAVAILABLE));
    trailers.insert(
        GRPC_MESSAGE,
        message(&format!(
            "{}: {resource}; the stream was stopped",
            Rejection::Lost {
                key: resource.into()
            }
            .title()
        )),
    );
    trailers
}

#[cfg(feature = "idempotency")]
static IDEMPOTENCY_LOGGED: AtomicBool = AtomicBool::new(false);

/// The idempotency layer's answer to a gRPC request: `INTERNAL`, before the
/// handler runs. Its records keep no trailers, where a gRPC response's status
/// is, so a replay could not be the response it replays.
#[cfg(feature = "idempotency")]
pub(crate) fn idempotency_refused() -> Response<RejectionBody> {
    const WHY: &str = "the idempotency layer does not serve gRPC: its records keep no trailers \
                       (grpc-status), so a replay could not be the response it replays; keep \
                       gRPC services outside it";
    if IDEMPOTENCY_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::debug!("a gRPC request reached the idempotency layer; refused");
    } else {
        tracing::error!("{WHY}. Logged once.");
    }
    trailers_only(INTERNAL, message(WHY), None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http_body::Body;

    use super::*;

    #[test]
    fn busy_is_the_chosen_code_with_the_holders_ttl_as_pushback() {
        let busy = Rejection::Busy {
            key: Arc::from("redlock:x-tenant=acme"),
            status: StatusCode::CONFLICT,
            retry_after: Some(Duration::from_millis(1234)),
            quota: None,
        };
        let response = response(&busy, GrpcBusyCode::Aborted);
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "10");
        assert_eq!(headers["grpc-retry-pushback-ms"], "1234");
        assert_eq!(
            headers["grpc-message"],
            "Resource is locked: redlock:x-tenant=acme"
        );
        assert!(response.body().is_end_stream());
        let (code, _) = code_of(&busy, GrpcBusyCode::ResourceExhausted);
        assert_eq!(code, 8);
    }

    #[test]
    fn messages_are_percent_encoded() {
        let value = message("50% of é\n");
        assert_eq!(value, "50%25 of %C3%A9%0A");
        let trailers = lost_trailers("redlock:t=a");
        assert_eq!(trailers["grpc-status"], "14");
        assert_eq!(
            trailers["grpc-message"],
            "Lock lost: redlock:t=a; the stream was stopped"
        );
    }

    #[test]
    fn key_errors_are_invalid_argument_and_setup_errors_internal() {
        assert_eq!(
            code_of(&Rejection::MissingKey, GrpcBusyCode::Aborted),
            (3, None)
        );
        assert_eq!(
            code_of(&Rejection::MissingHandle, GrpcBusyCode::Aborted),
            (13, None)
        );
        assert_eq!(
            code_of(
                &Rejection::Lost {
                    key: Arc::from("k")
                },
                GrpcBusyCode::Aborted
            ),
            (14, Some(1000))
        );
    }
}
