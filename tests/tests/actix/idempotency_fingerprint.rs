//! What makes two requests with one `Idempotency-Key` "the same request"
//! (issue 37, items 4 and 5), the twin of the tower suite: the full path
//! (inside a `web::scope` too), and the query.

use actix_web::{App, HttpRequest, HttpResponse, web};
use http::{Method, StatusCode};
use redlock_actix::idempotency::IdempotencyMiddleware;
use redlock_tests::Cluster;
use redlock_tests::http::send;

use crate::common::client;

/// A tenant scope wrapped by the middleware: the same key sent to tenant a,
/// then to tenant b, must not answer b with a's response (b gets 422).
#[actix_web::test]
async fn in_a_scope_one_tenant_is_never_answered_another_tenants_response() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let server = serve!(move || {
        App::new().service(
            web::scope("/tenants/{t}")
                .wrap(IdempotencyMiddleware::new(redlock.clone()))
                .route(
                    "/pay",
                    web::post().to(|path: web::Path<String>, body: String| async move {
                        HttpResponse::Created().body(format!("paid by tenant {path}: {body}"))
                    }),
                ),
        )
    });
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

/// `?to=x` then `?to=y` with one key and body: 422, not a replay; the same
/// query again is a retry.
#[actix_web::test]
async fn another_query_with_the_same_key_is_422_not_a_replay() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let server = serve!(move || {
        App::new()
            .wrap(IdempotencyMiddleware::new(redlock.clone()))
            .route(
                "/transfer",
                web::post().to(|req: HttpRequest, body: String| async move {
                    HttpResponse::Created().body(format!("sent {body} {}", req.query_string()))
                }),
            )
    });
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
