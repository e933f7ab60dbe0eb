//! `by_path()` keys name what the router serves: spellings of one path that
//! axum routes to the same handler with the same parameters
//! (`/orders/42` and `/orders/%34%32`; `%4a`, `%4A` and `J`) take one lock,
//! while `%2F` stays another path than a real `/`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::future::join_all;
use http::StatusCode;
use redlock_core::LockHandle;
use redlock_tests::Cluster;
use redlock_tests::http_timing::Inside;
use redlock_tower::RedlockLayer;

/// Inside the gauge for `?hold=<ms>`, or with `?gate` until the test opens the
/// gate; answers with the parameter as the handler sees it and the lock's key.
async fn hold(
    State(inside): State<Arc<Inside>>,
    Path(id): Path<String>,
    uri: Uri,
    lock: Extension<LockHandle>,
) -> String {
    let _inside = inside.enter();
    if uri.query() == Some("gate") {
        inside.gate.passed().await;
    } else {
        tokio::time::sleep(hold_of(&uri)).await;
    }
    format!("{id} {}", lock.key())
}

async fn server(cluster: &Cluster, layer: RedlockLayer) -> (Server, Arc<Inside>) {
    let inside = Arc::new(Inside::default());
    let app = Router::new()
        .route("/orders/{id}", get(hold))
        .route("/users/{id}", get(hold))
        .route("/files/{*id}", get(hold))
        .with_state(inside.clone())
        .layer(layer)
        .layer(Extension(cluster.patient_redlock()));
    (Server::start(app).await, inside)
}

/// Sends `first`, waits until its handler is inside, then sends each of
/// `others` at once; returns every reply, `first`'s first. With `gated`, the
/// first holds until the others were answered; else (when the others wait for
/// it) for 1.5 s.
async fn while_the_first_holds(
    server: &Server,
    inside: &Inside,
    first: &str,
    others: &[&str],
    gated: bool,
) -> Vec<Reply> {
    let client = client();
    let hold = if gated { "gate" } else { "hold=1500" };
    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url(&format!("{first}?{hold}")));
        async move { http_get(&client, &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the first request never reached its handler"
    );
    let others = others.iter().map(|path| {
        let (client, url) = (client.clone(), server.url(&format!("{path}?hold=200")));
        tokio::spawn(async move { http_get(&client, &url).await })
    });
    let others = join_all(others).await;
    inside.gate.open();
    let mut replies = vec![first.await.unwrap()];
    replies.extend(others.into_iter().map(|r| r.unwrap()));
    replies
}

fn bodies(replies: &[Reply]) -> Vec<(StatusCode, String)> {
    replies.iter().map(|r| (r.status, r.text())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_encoded_spelling_of_a_path_waits_for_the_same_lock() {
    let cluster = Cluster::start(3);
    let layer = RedlockLayer::by_path().wait(answered(ms(1500)));
    let (server, inside) = server(&cluster, layer).await;

    let replies =
        while_the_first_holds(&server, &inside, "/orders/42", &["/orders/%34%32"], false).await;
    assert_eq!(
        inside.max(),
        1,
        "/orders/42 and /orders/%34%32 were inside the handler at once"
    );
    let want = (StatusCode::OK, "42 redlock:/orders/42".to_owned());
    assert_eq!(
        bodies(&replies),
        [want.clone(), want],
        "one resource, one key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_escapes_in_either_case_and_the_raw_letter_take_one_lock() {
    let cluster = Cluster::start(3);
    let (server, inside) = server(&cluster, RedlockLayer::by_path()).await;

    let replies = while_the_first_holds(
        &server,
        &inside,
        "/users/J",
        &["/users/%4a", "/users/%4A"],
        true,
    )
    .await;
    assert_eq!(
        (replies[0].status, replies[0].text().as_str()),
        (StatusCode::OK, "J redlock:/users/J")
    );
    for reply in &replies[1..] {
        assert_eq!(
            reply.status,
            StatusCode::CONFLICT,
            "busy while /users/J holds: {}",
            reply.text()
        );
        assert_eq!(reply.json()["key"], "redlock:/users/J", "{}", reply.text());
    }
    assert_eq!(inside.max(), 1, "two spellings of /users/J ran at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_slash_is_another_key_than_a_real_one() {
    let cluster = Cluster::start(3);
    let (server, inside) = server(&cluster, RedlockLayer::by_path()).await;

    let replies =
        while_the_first_holds(&server, &inside, "/files/a%2Fb", &["/files/a/b"], true).await;
    assert_eq!(
        bodies(&replies),
        [
            // `%` in a resource: its Redis key is one escaped hash tag.
            (StatusCode::OK, "a/b {redlock:/files/a%252Fb}".to_owned()),
            (StatusCode::OK, "a/b redlock:/files/a/b".to_owned()),
        ],
        "two paths, two locks (by_path_param is the key for a wildcard route)"
    );
    assert_eq!(
        inside.max(),
        2,
        "the second ran while the first held its lock"
    );
}
