//! gRPC behind the layer: rejections a gRPC client can act on (a status, not
//! a JSON document it would read as a message), the end of a stream whose
//! lock was lost, and keys from a gRPC request's method and metadata.
//!
//! A tonic server is a tower service, so [`RedlockLayer`](crate::RedlockLayer)
//! wraps it as it wraps an axum router. What changes for a gRPC request
//! (`content-type: application/grpc`, `application/grpc+proto`, …, or every
//! request once [`GrpcMode::Always`] is set):
//!
//! | case | HTTP answer | gRPC answer |
//! | --- | --- | --- |
//! | lock busy | 409 + `Retry-After` | `ABORTED` (10), or `RESOURCE_EXHAUSTED` (8) with [`GrpcBusyCode`]; `grpc-retry-pushback-ms` from the holder's remaining TTL |
//! | no quorum of nodes | 503 | `UNAVAILABLE` (14), pushback 1000 ms |
//! | lock lost before the response head | 503 | `UNAVAILABLE` (14), pushback 1000 ms |
//! | lock lost while the response streams | the stream is reset | the stream ends with trailers `grpc-status: 14` and a message |
//! | no key, or a key the lock refuses | 400 | `INVALID_ARGUMENT` (3) |
//! | no `Redlock` handle, bad lock settings | 500 | `INTERNAL` (13) |
//!
//! Each rejection is a *trailers-only* response: HTTP 200, `content-type:
//! application/grpc`, and `grpc-status`, `grpc-message` (percent-encoded, as
//! the gRPC spec says) and `grpc-retry-pushback-ms` in the head, with no
//! body. gRPC rejections do not go through
//! [`on_rejection`](crate::RedlockLayer::on_rejection) (its answers are HTTP
//! documents): set [`GrpcMode::Never`] to answer every request with it.
//!
//! A lock lost mid-stream ends the stream after the last whole frame the
//! handler's body gave out (tonic gives out whole messages), so the client
//! reads the messages sent under the lock, then the status.

mod keys;
pub(crate) mod status;

#[cfg(feature = "tonic")]
use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderMap;

pub use keys::{ByGrpcMethod, ByMetadata};

/// Which requests the layer answers the gRPC way (see the [module
/// docs](crate::grpc)). Set with
/// [`RedlockLayer::grpc`](crate::RedlockLayer::grpc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrpcMode {
    /// Requests whose `content-type` is `application/grpc`, or
    /// `application/grpc+<codec>` / `application/grpc;<params>` (the
    /// default). gRPC-Web requests count once `tonic-web` (outside the lock
    /// layer) has translated them.
    #[default]
    Detect,
    /// Every request: a layer in front of a gRPC server only.
    Always,
    /// No request: HTTP answers (and `on_rejection`) for all.
    Never,
}

/// The gRPC status of a busy lock. Set with
/// [`RedlockLayer::grpc_busy_code`](crate::RedlockLayer::grpc_busy_code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrpcBusyCode {
    /// `ABORTED` (10): a concurrency conflict, retry the whole call (the
    /// default; the gRPC spec's code for a conflict between callers).
    #[default]
    Aborted,
    /// `RESOURCE_EXHAUSTED` (8): for clients that treat a busy resource as a
    /// quota to back off from.
    ResourceExhausted,
}

impl GrpcBusyCode {
    /// The numeric `grpc-status`.
    pub fn code(self) -> u16 {
        match self {
            GrpcBusyCode::Aborted => 10,
            GrpcBusyCode::ResourceExhausted => 8,
        }
    }
}

/// The gRPC settings of a layer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GrpcSettings {
    pub(crate) mode: GrpcMode,
    pub(crate) busy: GrpcBusyCode,
}

impl GrpcSettings {
    /// Whether a request with these headers gets gRPC answers.
    pub(crate) fn answers_grpc(&self, headers: &HeaderMap) -> bool {
        match self.mode {
            GrpcMode::Detect => is_grpc(headers),
            GrpcMode::Always => true,
            GrpcMode::Never => false,
        }
    }
}

/// Whether `headers` are a gRPC request's: `content-type` is
/// `application/grpc`, alone or followed by `+` (a codec) or `;`
/// (parameters), in any case.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    const GRPC: &[u8] = b"application/grpc";
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

#[cfg(feature = "tonic")]
static NOT_LOCKED_LOGGED: AtomicBool = AtomicBool::new(false);

/// Logs a handler asking for the lock of an unlocked gRPC request: at error
/// level once per process (the cause is the app's code), then at debug level.
#[cfg(feature = "tonic")]
pub(crate) fn log_not_locked() {
    if NOT_LOCKED_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::debug!("a gRPC handler asked for the lock of an unlocked request");
    } else {
        tracing::error!(
            "a gRPC handler calls `Held::from_tonic`, but its request holds no lock: the service \
             is not behind a RedlockLayer, or the request ran unlocked (no key, or fail-open); \
             use `Held::of_tonic` there. Logged once."
        );
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn with_type(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn grpc_requests_are_told_by_their_content_type() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "application/GRPC+json",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is_grpc(&with_type(grpc)), "{grpc}");
        }
        for other in [
            "application/json",
            "application/grpc-web",
            "application/grpcx",
            "application/grp",
        ] {
            assert!(!is_grpc(&with_type(other)), "{other}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }
}
