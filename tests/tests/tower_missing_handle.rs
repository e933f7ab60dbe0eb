//! A `RedlockLayer` with no `Redlock` handle answers 500 to every request that
//! needs a lock, and logs the cause at error level once per process, not once
//! per request. Alone in its binary: the "once" is a process-wide flag.
//!
//! The test runs on a current-thread runtime so that the thread-local capturing
//! subscriber sees everything the requests log.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use redlock_tests::util::LogCapture as Capture;
use redlock_tower::RedlockLayer;
use tower::ServiceExt;

#[tokio::test(flavor = "current_thread")]
async fn a_missing_handle_answers_500_each_time_and_logs_one_error() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let capture = capture.clone();
            move || capture.clone()
        })
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let app = Router::new()
        .route("/job", get(|| async { "ran" }))
        .layer(RedlockLayer::by_path());
    for _ in 0..3 {
        let reply = app
            .clone()
            .oneshot(Request::get("/job").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    let logged = capture.text();
    let errors: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("no Redlock handle"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "one error line, not one per request:\n{logged}"
    );
    assert!(
        errors[0].contains(".layer(Extension(redlock))"),
        "the error names the fix: {}",
        errors[0]
    );
    assert_eq!(
        logged.matches("no Redlock handle").count(),
        3,
        "the later requests are still logged, at debug level:\n{logged}"
    );
}
