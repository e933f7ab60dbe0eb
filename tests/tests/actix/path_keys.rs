//! `by_path()` keys name what the router serves: spellings of one path that
//! actix-web routes to the same handler with the same parameters
//! (`/orders/42` and `/orders/%34%32`; `%4a`, `%4A` and `J`) take one lock,
//! while `%2F` stays another path than a real `/`.

use std::time::Duration;

use crate::common::*;
use actix_web::{App, HttpRequest, web};
use futures_util::future::join_all;
use redlock_actix::{LockHandle, RedlockMiddleware};
use redlock_tests::Cluster;
use redlock_tests::http_timing::Inside;

/// Inside the gauge for `?hold=<ms>`, or with `?gate` until the test opens the
/// gate; answers with the parameter as the handler sees it and the lock's key.
async fn hold(
    inside: web::Data<Inside>,
    id: web::Path<String>,
    req: HttpRequest,
    lock: web::ReqData<LockHandle>,
) -> String {
    let _inside = inside.enter();
    if req.query_string() == "gate" {
        inside.gate.passed().await;
    } else {
        let hold = req
            .query_string()
            .split('&')
            .find_map(|kv| kv.strip_prefix("hold="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        actix_web::rt::time::sleep(ms(hold)).await;
    }
    format!("{} {}", id.into_inner(), lock.key())
}

fn server(cluster: &Cluster, middleware: RedlockMiddleware) -> (Server, web::Data<Inside>) {
    let inside = web::Data::new(Inside::default());
    let redlock = cluster.patient_redlock();
    let shared = inside.clone();
    let server = serve!(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(redlock.clone())
            .wrap(middleware.clone())
            .route("/orders/{id}", web::get().to(hold))
            .route("/users/{id}", web::get().to(hold))
            .route("/files/{id:.*}", web::get().to(hold))
    });
    (server, inside)
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
    let first = actix_web::rt::spawn({
        let (client, url) = (client.clone(), server.url(&format!("{first}?{hold}")));
        async move { get(&client, &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the first request never reached its handler"
    );
    let others = others.iter().map(|path| {
        let (client, url) = (client.clone(), server.url(&format!("{path}?hold=200")));
        async move { get(&client, &url).await }
    });
    let others = join_all(others).await;
    inside.gate.open();
    let mut replies = vec![first.await.unwrap()];
    replies.extend(others);
    replies
}

fn bodies(replies: &[Reply]) -> Vec<(u16, String)> {
    replies
        .iter()
        .map(|r| (r.status.as_u16(), r.text()))
        .collect()
}

#[actix_web::test]
async fn a_percent_encoded_spelling_of_a_path_waits_for_the_same_lock() {
    let cluster = Cluster::start(3);
    let middleware = RedlockMiddleware::by_path().wait(answered(ms(1500)));
    let (server, inside) = server(&cluster, middleware);

    let replies =
        while_the_first_holds(&server, &inside, "/orders/42", &["/orders/%34%32"], false).await;
    assert_eq!(
        inside.max(),
        1,
        "/orders/42 and /orders/%34%32 were inside the handler at once"
    );
    let want = (200, "42 redlock:/orders/42".to_owned());
    assert_eq!(
        bodies(&replies),
        [want.clone(), want],
        "one resource, one key"
    );
}

#[actix_web::test]
async fn percent_escapes_in_either_case_and_the_raw_letter_take_one_lock() {
    let cluster = Cluster::start(3);
    let (server, inside) = server(&cluster, RedlockMiddleware::by_path());

    let replies = while_the_first_holds(
        &server,
        &inside,
        "/users/J",
        &["/users/%4a", "/users/%4A"],
        true,
    )
    .await;
    assert_eq!(
        (replies[0].status.as_u16(), replies[0].text().as_str()),
        (200, "J redlock:/users/J")
    );
    for reply in &replies[1..] {
        assert_eq!(
            reply.status,
            409,
            "busy while /users/J holds: {}",
            reply.text()
        );
        assert_eq!(reply.json()["key"], "redlock:/users/J", "{}", reply.text());
    }
    assert_eq!(inside.max(), 1, "two spellings of /users/J ran at once");
}

#[actix_web::test]
async fn an_encoded_slash_is_another_key_than_a_real_one() {
    let cluster = Cluster::start(3);
    let (server, inside) = server(&cluster, RedlockMiddleware::by_path());

    let replies =
        while_the_first_holds(&server, &inside, "/files/a%2Fb", &["/files/a/b"], true).await;
    assert_eq!(
        bodies(&replies),
        [
            // `%` in a resource: its Redis key is one escaped hash tag.
            (200, "a/b {redlock:/files/a%252Fb}".to_owned()),
            (200, "a/b redlock:/files/a/b".to_owned()),
        ],
        "two paths, two locks (by_path_param is the key for a tail route)"
    );
    assert_eq!(
        inside.max(),
        2,
        "the second ran while the first held its lock"
    );
}
