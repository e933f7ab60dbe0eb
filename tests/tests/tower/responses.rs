//! What `RedlockLayer` answers when it does not simply run the handler: a busy
//! key (409 problem+json, a custom status, a custom rejection handler), a backend
//! without quorum (503, or fail-open), a missing `Redlock` handle (500), a request
//! without a key (pass through, or 400), and which handle wins when one is bound
//! on the layer and another sits in the extensions.

use std::time::Duration;

use std::sync::Arc;

use crate::common::*;
use axum::body::Body;
use axum::http::Uri;
use axum::routing::get;
use axum::{Extension, Router};
use http::{HeaderName, Request, StatusCode};
use redlock_core::{LockHandle, Redlock};
use redlock_tests::Cluster;
use redlock_tests::http_timing::Gate;
use redlock_tower::{MissingKeyPolicy, RedlockLayer, Rejection};
use tower::ServiceExt;

/// Holds the lock for `?hold=<ms>`, or with `?gate` until the test opens the
/// gate; answers with the lock's key, or `unlocked`.
async fn hold(
    uri: Uri,
    gate: Option<Extension<Arc<Gate>>>,
    lock: Option<Extension<LockHandle>>,
) -> String {
    match gate {
        Some(Extension(gate)) if uri.query() == Some("gate") => gate.passed().await,
        _ => tokio::time::sleep(hold_of(&uri)).await,
    }
    lock.map_or_else(|| "unlocked".to_owned(), |l| l.key().to_owned())
}

/// Serves `app`, starts a request that holds `/busy` until the returned gate
/// opens, and waits until its lock is on every node. Returns the server, the
/// holder's task and its gate.
async fn with_busy_key(
    cluster: &Cluster,
    app: Router,
) -> (Server, tokio::task::JoinHandle<Reply>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let server = Server::start(app.layer(Extension(gate.clone()))).await;
    let holder = tokio::spawn({
        let url = server.url("/busy?gate");
        async move { http_get(&client(), &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || cluster
            .count_with_key("redlock:/busy")
            == 3)
        .await,
        "the holder never took the lock"
    );
    (server, holder, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_key_answers_409_with_retry_after_and_a_problem_json_body() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/busy", get(hold))
        .layer(RedlockLayer::by_path())
        .layer(Extension(cluster.patient_redlock()));
    let (server, holder, gate) = with_busy_key(&cluster, app).await;

    let busy = http_get(&client(), &server.url("/busy")).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    let retry_after = busy.retry_after().expect("a numeric Retry-After");
    assert!(
        (1..=5).contains(&retry_after),
        "Retry-After {retry_after} s must be at least 1 and at most the 5 s TTL"
    );
    assert_eq!(
        busy.header("content-type"),
        Some("application/problem+json")
    );
    let doc = busy.json();
    assert_eq!(doc["status"], 409, "{doc}");
    assert_eq!(doc["key"], "redlock:/busy", "{doc}");
    assert!(doc["title"].is_string(), "{doc}");

    gate.open();
    let held = holder.await.unwrap();
    assert_eq!(held.status, StatusCode::OK);
    assert_eq!(held.text(), "redlock:/busy");
    assert!(
        on_no_node(&cluster, "redlock:/busy").await,
        "the lock is released after the response"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_status_locked_answers_423() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/busy", get(hold))
        .layer(RedlockLayer::by_path().busy_status(StatusCode::LOCKED))
        .layer(Extension(cluster.patient_redlock()));
    let (server, holder, gate) = with_busy_key(&cluster, app).await;

    let busy = http_get(&client(), &server.url("/busy")).await;
    assert_eq!(busy.status, StatusCode::LOCKED);
    assert!(busy.retry_after().is_some_and(|s| s >= 1));
    assert_eq!(busy.json()["status"], 423);
    gate.open();
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_rejection_handler_builds_the_busy_response() {
    let cluster = Cluster::start(3);
    let layer = RedlockLayer::by_path().on_rejection(|rejection: &Rejection| {
        http::Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("x-rejection-status", rejection.status().as_str())
            .header("content-type", "text/plain")
            .body(format!("custom: {}", rejection.title()))
            .unwrap()
    });
    let app = Router::new()
        .route("/busy", get(hold))
        .layer(layer)
        .layer(Extension(cluster.patient_redlock()));
    let (server, holder, gate) = with_busy_key(&cluster, app).await;

    let busy = http_get(&client(), &server.url("/busy")).await;
    assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.header("x-rejection-status"), Some("409"));
    assert_eq!(busy.header("content-type"), Some("text/plain"));
    assert_eq!(busy.text(), "custom: Resource is locked");
    gate.open();
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_nodes_down_answers_503_with_retry_after() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/job", get(hold))
        .layer(RedlockLayer::by_path())
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;
    let client = client();
    assert_eq!(
        http_get(&client, &server.url("/job")).await.status,
        StatusCode::OK,
        "healthy backend first"
    );

    cluster.node(1).kill();
    cluster.node(2).kill();
    let down = http_get(&client, &server.url("/job")).await;
    assert_eq!(
        down.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        down.text()
    );
    assert!(
        down.retry_after().is_some_and(|s| s >= 1),
        "{:?}",
        down.headers
    );
    assert_eq!(down.json()["status"], 503);
    assert!(
        on_no_node(&cluster, "redlock:/job").await,
        "the failed attempt is released on the live node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_runs_the_handler_unlocked_when_nodes_are_down() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/job", get(hold))
        .layer(RedlockLayer::by_path().fail_open())
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;
    cluster.node(1).kill();
    cluster.node(2).kill();

    let reply = http_get(&client(), &server.url("/job")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text(),
        "unlocked",
        "no LockHandle when running unlocked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_bound_handle_and_no_extension_answers_500() {
    let app = Router::new()
        .route("/job", get(hold))
        .layer(RedlockLayer::by_path());
    let reply = app
        .oneshot(Request::get("/job").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = axum::body::to_bytes(reply.into_body(), 1 << 16)
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["status"], 500);
}

fn tenant_app(cluster: &Cluster, layer: RedlockLayer<redlock_tower::ByHeader>) -> Router {
    Router::new()
        .route("/jobs", get(hold))
        .layer(layer)
        .layer(Extension(cluster.patient_redlock()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_header_key_passes_through_unlocked_by_default() {
    let cluster = Cluster::start(3);
    let app = tenant_app(
        &cluster,
        RedlockLayer::by_header(HeaderName::from_static("x-tenant-id")),
    );

    let request = |tenant: Option<&str>| {
        let mut req = Request::get("/jobs");
        if let Some(t) = tenant {
            req = req.header("x-tenant-id", t);
        }
        req.body(Body::empty()).unwrap()
    };
    let without = app.clone().oneshot(request(None)).await.unwrap();
    assert_eq!(without.status(), StatusCode::OK);
    let body = axum::body::to_bytes(without.into_body(), 1 << 16)
        .await
        .unwrap();
    assert_eq!(&body[..], b"unlocked", "no LockHandle without a key");

    let with = app.oneshot(request(Some("acme"))).await.unwrap();
    assert_eq!(with.status(), StatusCode::OK);
    let body = axum::body::to_bytes(with.into_body(), 1 << 16)
        .await
        .unwrap();
    assert_eq!(
        &body[..],
        b"redlock:x-tenant-id=acme",
        "the header's name and value are the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_header_key_is_rejected_with_400_when_the_policy_says_so() {
    let cluster = Cluster::start(3);
    let app = tenant_app(
        &cluster,
        RedlockLayer::by_header(HeaderName::from_static("x-tenant-id"))
            .on_missing_key(MissingKeyPolicy::Reject),
    );
    let server = Server::start(app).await;
    let client = client();

    let without = http_get(&client, &server.url("/jobs")).await;
    assert_eq!(without.status, StatusCode::BAD_REQUEST);
    assert_eq!(without.json()["status"], 400);
    let empty = http_get_with(&client, &server.url("/jobs"), &[("x-tenant-id", "")]).await;
    assert_eq!(
        empty.status,
        StatusCode::BAD_REQUEST,
        "an empty value is no key"
    );
    let with = http_get_with(&client, &server.url("/jobs"), &[("x-tenant-id", "acme")]).await;
    assert_eq!(with.status, StatusCode::OK);
    assert_eq!(with.text(), "redlock:x-tenant-id=acme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_bound_on_the_layer_wins_over_the_extension() {
    let cluster = Cluster::start(3);
    let bound = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .key_prefix("bound:")
        .build()
        .unwrap();
    let extension = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .key_prefix("extension:")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/job", get(hold))
        .layer(RedlockLayer::by_path().with_redlock(bound))
        .layer(Extension(extension));

    let reply = app
        .oneshot(Request::get("/job").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let body = axum::body::to_bytes(reply.into_body(), 1 << 16)
        .await
        .unwrap();
    assert_eq!(&body[..], b"bound:redlock:/job");
}
