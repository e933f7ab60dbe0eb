//! [`Rejection`]: why a request was not run under its lock (or was stopped),
//! and its HTTP answer: a status, `Retry-After`, on a `permits(n)` route's
//! busy answer the `RateLimit` fields if asked for, and an RFC 9457
//! `application/problem+json` document.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::StatusCode;

use super::rate_limit;
use crate::error::Error;

/// Why a request was not run (or was stopped). Each adapter turns this into its
/// own response with [`Rejection::status`], [`Rejection::retry_after_secs`],
/// [`Rejection::rate_limit_fields`] and [`Rejection::problem_json`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rejection {
    /// Another request holds the lock.
    Busy {
        /// The resource: the policy's namespace and the extracted key.
        key: Arc<str>,
        /// The status to answer with (from the policy's `busy_status`).
        status: StatusCode,
        /// When the holder's keys expire, if known.
        retry_after: Option<Duration>,
        /// The route's `permits(n)` when its policy sends the `RateLimit`
        /// fields (`rate_limit_fields`): the quota they advertise. `None`
        /// otherwise, and then the answer has no such fields.
        quota: Option<u32>,
    },
    /// No quorum of Redis nodes gave the lock: too few answered, or some
    /// answered with an error (a refusal: credentials, a replica, out of
    /// memory; named in the document's `refused` member).
    Unavailable {
        /// The resource: the policy's namespace and the extracted key.
        key: Arc<str>,
        /// The error, for logs.
        error: Error,
    },
    /// The request had no key and the policy rejects such requests.
    MissingKey,
    /// No [`Redlock`](crate::Redlock) handle was bound to the middleware or
    /// found in the request.
    MissingHandle,
    /// The lock was lost while the handler ran, and the handler was stopped.
    Lost {
        /// The resource ([`LockHandle::resource`](crate::LockHandle::resource)):
        /// the policy's namespace and the extracted key, as
        /// [`Busy`](Self::Busy) names it, not the Redis key, which has the
        /// handle's key prefix before it.
        key: Arc<str>,
    },
    /// The request's key is one the lock refuses: empty, or ending with
    /// `:redlock-waiters`, the suffix of the waiters flags (a path can end
    /// with it). The client's input, answered 400 and logged at debug level:
    /// a client must not be able to fill the error log.
    InvalidKey {
        /// The resource: the policy's namespace and the extracted key.
        key: Arc<str>,
        /// Why the lock refused it.
        error: Error,
    },
    /// The lock could not be taken for another reason (for example, a TTL outside
    /// the handle's bounds). A server-side misconfiguration.
    Misconfigured {
        /// The error.
        error: Error,
    },
}

/// Set once the missing handle has been logged at error level: the cause is
/// the app's setup, so every request would say the same thing.
static MISSING_HANDLE_LOGGED: AtomicBool = AtomicBool::new(false);

impl Rejection {
    /// The media type of [`Rejection::problem_json`].
    pub const CONTENT_TYPE: &'static str = "application/problem+json";

    /// The HTTP status to answer with.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Busy { status, .. } => *status,
            Rejection::Unavailable { .. } | Rejection::Lost { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Rejection::MissingKey | Rejection::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            Rejection::MissingHandle | Rejection::Misconfigured { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The `Retry-After` value in whole seconds (at least 1), when there is one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        let d = match self {
            Rejection::Busy { retry_after, .. } => retry_after.unwrap_or(Duration::from_secs(1)),
            Rejection::Unavailable { .. } | Rejection::Lost { .. } => Duration::from_secs(1),
            _ => return None,
        };
        Some(d.as_millis().div_ceil(1000).max(1) as u64)
    }

    /// The `RateLimit-Policy` and `RateLimit` fields of the answer, as
    /// (lower-case name, value) pairs: on the busy answer of a `permits(n)`
    /// route whose policy sets `rate_limit_fields`, and on no other. They
    /// follow draft-ietf-httpapi-ratelimit-headers-11: a quota of `n` in its
    /// `concurrent-requests` unit, none of it available for the
    /// `Retry-After` seconds. The policy is named `"permits"`; nothing from
    /// the request is in either field.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_core::request::{Rejection, StatusCode};
    ///
    /// let busy = Rejection::Busy {
    ///     key: "redlock:x-tenant=7".into(),
    ///     status: StatusCode::TOO_MANY_REQUESTS,
    ///     retry_after: Some(Duration::from_millis(2500)),
    ///     quota: Some(2),
    /// };
    /// assert_eq!(busy.retry_after_secs(), Some(3));
    /// assert_eq!(
    ///     busy.rate_limit_fields(),
    ///     Some([
    ///         ("ratelimit-policy", r#""permits";q=2;qu="concurrent-requests""#.to_owned()),
    ///         ("ratelimit", r#""permits";r=0;t=3"#.to_owned()),
    ///     ])
    /// );
    /// ```
    pub fn rate_limit_fields(&self) -> Option<[(&'static str, String); 2]> {
        let Rejection::Busy {
            quota: Some(permits),
            ..
        } = self
        else {
            return None;
        };
        let secs = self.retry_after_secs()?;
        Some([
            (rate_limit::POLICY_FIELD, rate_limit::policy(*permits)),
            (rate_limit::LIMIT_FIELD, rate_limit::limit(secs)),
        ])
    }

    /// A short title for the problem.
    pub fn title(&self) -> &'static str {
        match self {
            Rejection::Busy { .. } => "Resource is locked",
            Rejection::Unavailable { .. } => "Lock service unavailable",
            Rejection::MissingKey => "Missing lock key",
            Rejection::InvalidKey { .. } => "Invalid lock key",
            Rejection::MissingHandle => "Lock middleware is not configured",
            Rejection::Lost { .. } => "Lock lost",
            Rejection::Misconfigured { .. } => "Lock middleware is misconfigured",
        }
    }

    /// The key the rejection is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Rejection::Busy { key, .. }
            | Rejection::Unavailable { key, .. }
            | Rejection::Lost { key }
            | Rejection::InvalidKey { key, .. } => Some(key),
            _ => None,
        }
    }

    fn detail(&self) -> &'static str {
        match self {
            Rejection::Busy { .. } => {
                "Another request holds the lock for this resource. Retry after the given delay."
            }
            Rejection::Unavailable { .. } if self.refusals().is_some() => {
                "The lock nodes answered but refused to take the lock; the request was not run."
            }
            Rejection::Unavailable { .. } => {
                "Not enough lock nodes answered to take the lock safely."
            }
            Rejection::MissingKey => "The request carries no value to lock on.",
            Rejection::InvalidKey { .. } => {
                "The request's lock key cannot be used: it is empty or ends with a reserved suffix."
            }
            Rejection::MissingHandle => "The server has no Redlock handle configured.",
            Rejection::Lost { .. } => {
                "The lock expired, was taken away, or reached the longest hold allowed while \
                 the request ran; the work was stopped."
            }
            Rejection::Misconfigured { .. } => "The server's lock settings are invalid.",
        }
    }

    /// For an unavailable answer where nodes answered with an error: the
    /// kinds of refusal (`auth`, `read_only`, `oom`, …, the `kind` labels of
    /// the node-error metric), sorted, without the nodes' own words (those
    /// go to the log).
    fn refusals(&self) -> Option<String> {
        let Rejection::Unavailable { error, .. } = self else {
            return None;
        };
        let kinds: std::collections::BTreeSet<&str> = error
            .report()
            .into_iter()
            .flat_map(|r| r.errors())
            .filter(|(_, e)| e.is_refusal())
            .map(|(_, e)| crate::metrics::error_kind(e))
            .collect();
        (!kinds.is_empty()).then(|| kinds.into_iter().collect::<Vec<_>>().join(", "))
    }

    /// The body: an RFC 9457 `application/problem+json` document.
    pub fn problem_json(&self) -> String {
        let mut doc = serde_json::Map::new();
        doc.insert("type".into(), "about:blank".into());
        doc.insert("title".into(), self.title().into());
        doc.insert("status".into(), self.status().as_u16().into());
        doc.insert("detail".into(), self.detail().into());
        if let Some(key) = self.key() {
            doc.insert("key".into(), key.into());
        }
        if let Some(secs) = self.retry_after_secs() {
            doc.insert("retry_after".into(), secs.into());
        }
        if let Some(refusals) = self.refusals() {
            doc.insert("refused".into(), refusals.into());
        }
        serde_json::Value::Object(doc).to_string()
    }

    /// Logs the rejection at a level that fits it. A missing handle is an error
    /// in the app's setup, logged at error level once per process (then at
    /// debug level), not once per request.
    pub fn log(&self) {
        match self {
            Rejection::MissingHandle => {
                if MISSING_HANDLE_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::debug!("no Redlock handle (logged at error level once)");
                } else {
                    tracing::error!(
                        "no Redlock handle: bind one on the middleware, or add it to the request \
                         (axum: `.layer(Extension(redlock))` outside the lock layer; actix: \
                         `.app_data(redlock)`). Requests that need a lock get 500. Logged once."
                    )
                }
            }
            Rejection::Misconfigured { error } => {
                tracing::error!(%error, "lock middleware misconfigured")
            }
            Rejection::Unavailable { key, error } => {
                tracing::warn!(%key, %error, "lock backend unavailable");
            }
            Rejection::Lost { key } => tracing::warn!(%key, "lock lost while the handler ran"),
            Rejection::Busy {
                key, retry_after, ..
            } => tracing::debug!(%key, ?retry_after, "lock busy"),
            Rejection::MissingKey => tracing::debug!("request has no lock key"),
            Rejection::InvalidKey { key, error } => {
                tracing::debug!(%key, %error, "request's lock key refused")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_status_and_retry_after() {
        let busy = Rejection::Busy {
            key: "k".into(),
            status: StatusCode::CONFLICT,
            retry_after: Some(Duration::from_millis(1200)),
            quota: None,
        };
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        assert_eq!(busy.retry_after_secs(), Some(2));
        assert_eq!(busy.rate_limit_fields(), None);
        let doc: serde_json::Value = serde_json::from_str(&busy.problem_json()).unwrap();
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["key"], "k");
        assert_eq!(doc["retry_after"], 2);
        let short = Rejection::Busy {
            key: "k".into(),
            status: StatusCode::LOCKED,
            retry_after: Some(Duration::from_millis(10)),
            quota: None,
        };
        assert_eq!(short.retry_after_secs(), Some(1));
        assert_eq!(short.status(), StatusCode::LOCKED);
        assert_eq!(Rejection::MissingKey.status(), StatusCode::BAD_REQUEST);
        assert_eq!(Rejection::MissingKey.retry_after_secs(), None);
        assert_eq!(
            Rejection::MissingHandle.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            Rejection::Lost { key: "k".into() }.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let invalid = Rejection::InvalidKey {
            key: "redlock:/x:redlock-waiters".into(),
            error: Error::ReservedResource {
                resource: "redlock:/x:redlock-waiters".into(),
            },
        };
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        assert_eq!(invalid.retry_after_secs(), None);
        let doc: serde_json::Value = serde_json::from_str(&invalid.problem_json()).unwrap();
        assert_eq!(doc["status"], 400);
        assert_eq!(doc["key"], "redlock:/x:redlock-waiters");
    }

    #[test]
    fn only_a_busy_answer_with_a_quota_carries_the_rate_limit_fields() {
        let busy = |quota, retry_after| Rejection::Busy {
            key: "redlock:/exports".into(),
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after,
            quota,
        };
        let fields = busy(Some(5), Some(Duration::from_millis(4001))).rate_limit_fields();
        assert_eq!(
            fields,
            Some([
                (
                    "ratelimit-policy",
                    r#""permits";q=5;qu="concurrent-requests""#.to_owned()
                ),
                ("ratelimit", r#""permits";r=0;t=5"#.to_owned()),
            ])
        );
        // An unknown holder's expiry: `t` is the `Retry-After` sent, 1 s.
        let unknown = busy(Some(1), None).rate_limit_fields().unwrap();
        assert_eq!(unknown[1].1, r#""permits";r=0;t=1"#);
        assert_eq!(
            busy(None, Some(Duration::from_secs(2))).rate_limit_fields(),
            None
        );
        assert_eq!(
            Rejection::Lost { key: "k".into() }.rate_limit_fields(),
            None
        );
    }
}
