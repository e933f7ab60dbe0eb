//! What makes two requests with one `Idempotency-Key` "the same request"
//! (issue 37, items 4 and 5): the path the client sent, not the one a nested
//! router sees, and the query.

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use http::Method;
use redlock_tests::Cluster;
use redlock_tests::http::send;
use redlock_tower::idempotency::IdempotencyLayer;

use crate::common::{Server, client};

/// A nested tenant router: the same key sent to tenant a, then to tenant b,
/// must not answer b with a's response (b gets 422: the key was used for
/// another request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_nest_one_tenant_is_never_answered_another_tenants_response() {
    let cluster = Cluster::start(3);
    let tenant = Router::new()
        .route(
            "/pay",
            post(|Path(t): Path<String>, body: String| async move {
                (StatusCode::CREATED, format!("paid by tenant {t}: {body}"))
            }),
        )
        .layer(IdempotencyLayer::new(cluster.patient_redlock()));
    let server = Server::start(Router::new().nest("/tenants/{t}", tenant)).await;
    let client = client();
    let key = [("idempotency-key", "\"same-key-1\"")];
    let a = send(
        &client,
        Method::POST,
        &server.url("/tenants/a/pay"),
        &key,
        "10 EUR",
    )
    .await
    .unwrap();
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.text(), "paid by tenant a: 10 EUR");
    let b = send(
        &client,
        Method::POST,
        &server.url("/tenants/b/pay"),
        &key,
        "10 EUR",
    )
    .await
    .unwrap();
    assert_eq!(
        (b.status, b.header("idempotent-replayed")),
        (StatusCode::UNPROCESSABLE_ENTITY, None),
        "tenant b answered: {}",
        b.text()
    );
    // Tenant a's own retry still replays.
    let again = send(
        &client,
        Method::POST,
        &server.url("/tenants/a/pay"),
        &key,
        "10 EUR",
    )
    .await
    .unwrap();
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.text(), "paid by tenant a: 10 EUR");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
}

/// The query is part of the request: `?to=x` then `?to=y` with one key and
/// body is the key reused for another request (422), while the same query
/// again is a retry (replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_query_with_the_same_key_is_422_not_a_replay() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route(
            "/transfer",
            post(|uri: http::Uri, body: String| async move {
                (
                    StatusCode::CREATED,
                    format!("sent {body} {}", uri.query().unwrap_or("")),
                )
            }),
        )
        .layer(IdempotencyLayer::new(cluster.patient_redlock()));
    let server = Server::start(app).await;
    let client = client();
    let key = [("idempotency-key", "\"transfer-1\"")];
    let x = send(
        &client,
        Method::POST,
        &server.url("/transfer?to=x"),
        &key,
        "5",
    )
    .await
    .unwrap();
    assert_eq!(x.status, StatusCode::CREATED);
    assert_eq!(x.text(), "sent 5 to=x");
    let y = send(
        &client,
        Method::POST,
        &server.url("/transfer?to=y"),
        &key,
        "5",
    )
    .await
    .unwrap();
    assert_eq!(
        (y.status, y.header("idempotent-replayed")),
        (StatusCode::UNPROCESSABLE_ENTITY, None),
        "?to=y answered: {}",
        y.text()
    );
    let retry = send(
        &client,
        Method::POST,
        &server.url("/transfer?to=x"),
        &key,
        "5",
    )
    .await
    .unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.text(), "sent 5 to=x");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
}
