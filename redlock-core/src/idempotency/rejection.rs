//! [`IdempotencyRejection`]: why a request was answered without running (or
//! without its record), and its HTTP answer: status, `Retry-After`, and an
//! RFC 9457 `application/problem+json` body.

use http::StatusCode;

use super::key::KeyError;
use super::store::StoreError;
use crate::request::Rejection;

/// Why a request was answered without running, or why its result was not
/// recorded. Each adapter maps it with [`status`](Self::status),
/// [`retry_after_secs`](Self::retry_after_secs) and
/// [`problem_json`](Self::problem_json).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum IdempotencyRejection {
    /// The request carries no idempotency key and the policy requires one
    /// (400).
    MissingKey,
    /// The key is not valid (400).
    InvalidKey(KeyError),
    /// The key was used before with another request (another fingerprint)
    /// (422).
    Mismatch,
    /// The request body is over the cap (413).
    BodyTooLarge {
        /// The cap, in bytes.
        limit: usize,
    },
    /// The first request completed, but its response was too large to
    /// record; the work does not run again (the policy's status, 410 by
    /// default).
    NotReplayable {
        /// The status to answer with.
        status: StatusCode,
        /// The first response's status.
        original: u16,
    },
    /// The lock's answer: busy (409 + `Retry-After`), unavailable, lost, or
    /// a missing or misconfigured handle.
    Lock(Rejection),
    /// The store could not read or write the record (503).
    Store(StoreError),
}

impl From<Rejection> for IdempotencyRejection {
    fn from(r: Rejection) -> Self {
        Self::Lock(r)
    }
}

impl IdempotencyRejection {
    /// The media type of [`problem_json`](Self::problem_json).
    pub const CONTENT_TYPE: &'static str = Rejection::CONTENT_TYPE;

    /// The HTTP status to answer with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey(_) => StatusCode::BAD_REQUEST,
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotReplayable { status, .. } => *status,
            Self::Lock(r) => r.status(),
            Self::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `Retry-After` value in whole seconds, when there is one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Lock(r) => r.retry_after_secs(),
            Self::Store(_) => Some(1),
            _ => None,
        }
    }

    /// A short title.
    pub fn title(&self) -> &'static str {
        match self {
            Self::MissingKey => "Missing idempotency key",
            Self::InvalidKey(_) => "Invalid idempotency key",
            Self::Mismatch => "Idempotency key reused with another request",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::NotReplayable { .. } => "Response not replayable",
            Self::Lock(r) => r.title(),
            Self::Store(_) => "Idempotency store unavailable",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::MissingKey => "This endpoint requires an Idempotency-Key header.".into(),
            Self::InvalidKey(e) => format!("{e}."),
            Self::Mismatch => {
                "This idempotency key was used with a different request; use a new key.".into()
            }
            Self::BodyTooLarge { limit } => {
                format!("The request body is over the {limit}-byte limit.")
            }
            Self::NotReplayable { original, .. } => format!(
                "The request with this key completed with status {original}, but its response \
                 was too large to record; it is not run again."
            ),
            Self::Lock(Rejection::Busy { .. }) => {
                "A request with this idempotency key is in flight. Retry after the given delay."
                    .into()
            }
            Self::Lock(_) => "The request could not run under its idempotency lock.".into(),
            Self::Store(_) => "The idempotency records could not be read or written.".into(),
        }
    }

    /// The body: an RFC 9457 `application/problem+json` document.
    pub fn problem_json(&self) -> String {
        let mut doc = serde_json::Map::new();
        doc.insert("type".into(), "about:blank".into());
        doc.insert("title".into(), self.title().into());
        doc.insert("status".into(), self.status().as_u16().into());
        doc.insert("detail".into(), self.detail().into());
        if let Self::NotReplayable { original, .. } = self {
            doc.insert("original_status".into(), (*original).into());
        }
        if let Some(secs) = self.retry_after_secs() {
            doc.insert("retry_after".into(), secs.into());
        }
        serde_json::Value::Object(doc).to_string()
    }

    /// Logs the rejection at a level that fits it.
    pub fn log(&self) {
        match self {
            Self::Lock(r) => r.log(),
            Self::Store(error) => tracing::warn!(%error, "idempotency store failed"),
            other => tracing::debug!(title = other.title(), "idempotency rejection"),
        }
    }
}
