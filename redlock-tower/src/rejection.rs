//! The answer to a [`Rejection`]: the app's own (`RedlockLayer::on_rejection`),
//! or an `application/problem+json` document with its status, `Retry-After`
//! and, on a `permits(n)` route's busy answer if asked for, the `RateLimit`
//! fields.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, header};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use redlock_core::request::Rejection;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a rejection: the default document, or whatever the app's
/// handler answered.
pub(crate) type RejectionBody = UnsyncBoxBody<Bytes, BoxError>;

/// Builds the response for a rejected request.
pub(crate) type RejectionHandler = Arc<dyn Fn(&Rejection) -> Response<RejectionBody> + Send + Sync>;

/// `response` with its body boxed.
pub(crate) fn boxed<B>(response: Response<B>) -> Response<RejectionBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    response.map(|body| body.map_err(Into::into).boxed_unsync())
}

/// The response for `rejection`: the handler's, if the app set one, else the
/// problem+json document with `Retry-After` and the `RateLimit` fields where
/// they apply.
pub(crate) fn response(
    rejection: &Rejection,
    handler: Option<&RejectionHandler>,
) -> Response<RejectionBody> {
    if let Some(handler) = handler {
        return handler(rejection);
    }
    let mut response = boxed(Response::new(Full::new(Bytes::from(
        rejection.problem_json(),
    ))));
    *response.status_mut() = rejection.status();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(Rejection::CONTENT_TYPE),
    );
    if let Some(secs) = rejection.retry_after_secs() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    for (name, value) in rejection.rate_limit_fields().into_iter().flatten() {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;

    #[tokio::test]
    async fn busy_is_a_problem_document_with_its_status_and_retry_after() {
        let busy = Rejection::Busy {
            key: "redlock:/a".into(),
            status: StatusCode::LOCKED,
            retry_after: Some(Duration::from_millis(1500)),
            quota: None,
        };
        let response = super::response(&busy, None);
        assert_eq!(response.status(), StatusCode::LOCKED);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        assert_eq!(response.headers()["retry-after"], "2");
        assert!(!response.headers().contains_key("ratelimit"));
        assert!(!response.headers().contains_key("ratelimit-policy"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let doc = String::from_utf8_lossy(&body);
        assert!(doc.contains(r#""key":"redlock:/a""#), "{doc}");
    }
}
