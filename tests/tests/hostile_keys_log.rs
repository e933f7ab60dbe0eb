//! Issue 37, item 3: a key the client chose that the lock refuses (a path
//! ending with the waiters flag's suffix) is answered 400 by both adapters and
//! logged below error level: an error line per request is the operator's
//! alarm, and the client must not be able to ring it.
//!
//! In a binary of its own, with one test and a global subscriber: tracing
//! caches each callsite's interest process-wide, so tests running beside it
//! could hide events from a scoped one (see `core_tracing.rs`).

use redlock_tests::Cluster;
use redlock_tests::util::LogCapture as Capture;

/// The lines of `log` at error level.
fn errors(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("ERROR")).collect()
}

const PATH: &str = "/o/x:redlock-waiters";

async fn tower_status(cluster: &Cluster) -> u16 {
    use axum::routing::get;
    use axum::{Extension, Router};
    use tower::ServiceExt;
    let app = Router::new()
        .route("/o/{*rest}", get(|| async { "ran" }))
        .layer(redlock_tower::RedlockLayer::by_path())
        .layer(Extension(cluster.patient_redlock()));
    let req = http::Request::get(PATH)
        .body(axum::body::Body::empty())
        .unwrap();
    app.oneshot(req).await.unwrap().status().as_u16()
}

async fn actix_status(cluster: &Cluster) -> u16 {
    use actix_web::{App, test, web};
    let app = test::init_service(
        App::new().app_data(cluster.patient_redlock()).service(
            web::resource("/o/{rest:.*}")
                .wrap(redlock_actix::RedlockMiddleware::by_path())
                .route(web::get().to(|| async { "ran" })),
        ),
    )
    .await;
    let req = test::TestRequest::get().uri(PATH).to_request();
    test::call_service(&app, req).await.status().as_u16()
}

#[test]
fn a_reserved_suffix_in_the_path_is_answered_400_and_not_logged_as_an_error() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer({
            let capture = capture.clone();
            move || capture.clone()
        })
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let cluster = Cluster::start(3);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for round in 0..3 {
        let status = runtime.block_on(tower_status(&cluster));
        let log = capture.text();
        assert_eq!(
            (status, errors(&log)),
            (400, vec![]),
            "tower, request {round}: the client's key, a 400 without an error line; log:\n{log}"
        );
        assert!(log.contains(PATH), "logged below error level: {log}");
        capture.clear();
    }
    drop(runtime);

    actix_web::rt::System::new().block_on(async {
        for round in 0..3 {
            let status = actix_status(&cluster).await;
            let log = capture.text();
            assert_eq!(
                (status, errors(&log)),
                (400, vec![]),
                "actix, request {round}: the client's key, a 400 without an error line; log:\n{log}"
            );
            assert!(log.contains(PATH), "logged below error level: {log}");
            capture.clear();
        }
    });
}
