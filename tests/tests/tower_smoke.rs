//! A first check that `RedlockLayer::by_path()` fits an axum router and excludes.

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use redlock_core::{LockHandle, Redlock};
use redlock_tests::Cluster;
use redlock_tower::RedlockLayer;
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_path_layer_locks_and_rejects() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::from_urls(cluster.urls()).unwrap();
    let app = Router::new()
        .route(
            "/slow",
            get(|Extension(lock): Extension<LockHandle>| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                lock.key().to_owned()
            }),
        )
        .layer(RedlockLayer::by_path())
        .layer(Extension(redlock));
    let first = tokio::spawn(
        app.clone()
            .oneshot(Request::get("/slow").body(Body::empty()).unwrap()),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = app
        .clone()
        .oneshot(Request::get("/slow").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::CONFLICT);
    assert!(second.headers().contains_key("retry-after"));
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let body = axum::body::to_bytes(first.into_body(), 1 << 16)
        .await
        .unwrap();
    assert_eq!(&body[..], b"redlock:/slow");
    assert!(cluster.wait_until(
        Duration::from_secs(2),
        |c| c.count_with_key("redlock:/slow") == 0
    ));
}
