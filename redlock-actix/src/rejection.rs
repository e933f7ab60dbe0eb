//! [`LockRejection`]: a [`Rejection`] as an actix [`ResponseError`], and the
//! lookup of the `Redlock` handle shared by the middleware and the extractor.

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use redlock_core::Redlock;
use redlock_core::request::Rejection;

/// Why a request did not get its lock, or lost it: the error of the
/// [`HeldLock`](crate::HeldLock) extractor, and of the middleware when the lock
/// is lost while the handler runs.
///
/// Its response is an RFC 9457 `application/problem+json` document with the
/// status of [`Rejection::status`] (409 or the configured busy status, 503, 400,
/// 500), a `Retry-After` header for busy, unavailable and lost, and on a
/// `permits(n)` route's busy answer the `RateLimit-Policy` and `RateLimit`
/// fields when the middleware asks for them
/// ([`rate_limit_fields`](crate::RedlockMiddleware::rate_limit_fields)).
#[derive(Debug, Clone)]
pub struct LockRejection(Rejection);

impl LockRejection {
    /// The framework-independent reason.
    pub fn rejection(&self) -> &Rejection {
        &self.0
    }

    /// Unwraps the framework-independent reason.
    pub fn into_rejection(self) -> Rejection {
        self.0
    }
}

impl From<Rejection> for LockRejection {
    fn from(rejection: Rejection) -> Self {
        Self(rejection)
    }
}

impl fmt::Display for LockRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.title())?;
        match self.0.key() {
            Some(key) => write!(f, " ({key})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for LockRejection {}

impl ResponseError for LockRejection {
    fn status_code(&self) -> StatusCode {
        // actix-web 4 is on `http` 0.2, the core on `http` 1: same codes, two types.
        StatusCode::from_u16(self.0.status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut builder = HttpResponse::build(self.status_code());
        builder.content_type(Rejection::CONTENT_TYPE);
        if let Some(secs) = self.0.retry_after_secs() {
            builder.insert_header((header::RETRY_AFTER, HeaderValue::from(secs)));
        }
        for field in self.0.rate_limit_fields().into_iter().flatten() {
            builder.insert_header(field);
        }
        builder.body(self.0.problem_json())
    }
}

/// The `Redlock` handle registered on the app: `app_data::<Redlock>()`, then
/// `app_data::<web::Data<Redlock>>()`.
pub(crate) fn registered_redlock(req: &HttpRequest) -> Option<Redlock> {
    req.app_data::<Redlock>().cloned().or_else(|| {
        req.app_data::<web::Data<Redlock>>()
            .map(|data| Redlock::clone(data))
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use actix_web::body::MessageBody;

    use super::*;

    fn parts(rejection: Rejection) -> (u16, Option<String>, Option<String>, serde_json::Value) {
        let response = LockRejection::from(rejection).error_response();
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let (content_type, retry_after) = (header("content-type"), header("retry-after"));
        let status = response.status().as_u16();
        let body = response.into_body().try_into_bytes().unwrap();
        (
            status,
            content_type,
            retry_after,
            serde_json::from_slice(&body).unwrap(),
        )
    }

    #[test]
    fn busy_maps_to_its_status_with_retry_after_and_a_problem_document() {
        let (status, content_type, retry_after, doc) = parts(Rejection::Busy {
            key: "redlock:/a".into(),
            status: redlock_core::request::StatusCode::LOCKED,
            retry_after: Some(Duration::from_millis(1500)),
            quota: None,
        });
        assert_eq!(status, 423);
        assert_eq!(content_type.as_deref(), Some("application/problem+json"));
        assert_eq!(retry_after.as_deref(), Some("2"));
        assert_eq!(doc["key"], "redlock:/a");
        assert_eq!(doc["status"], 423);
    }

    #[test]
    fn other_rejections_map_to_503_400_and_500() {
        let lost = parts(Rejection::Lost { key: "k".into() });
        assert_eq!((lost.0, lost.2.as_deref()), (503, Some("1")));
        let missing = parts(Rejection::MissingKey);
        assert_eq!((missing.0, missing.2), (400, None));
        let handle = parts(Rejection::MissingHandle);
        assert_eq!((handle.0, handle.2), (500, None));
        assert_eq!(
            LockRejection::from(Rejection::Lost { key: "k".into() }).to_string(),
            "Lock lost (k)"
        );
    }
}
