//! Keys a client chooses (issue 37, items 2, 3, 7 and 12), on real nodes: a
//! value in one key family never spells another family's key, keys joined
//! from parts stay apart, a 60 KB path puts a bounded key on the nodes, a
//! path ending in the waiters flag's suffix is the client's mistake (400),
//! and a lost lock's 503 names the resource, not the Redis key.

use std::time::Duration;

use crate::common::*;
use actix_web::http::header::HeaderName;
use actix_web::{App, HttpRequest, web};
use redlock_actix::{LockHandle, Redlock, RedlockMiddleware};
use redlock_core::request::MAX_KEY_BYTES;
use redlock_tests::http_timing::Inside;
use redlock_tests::{Cluster, RedisNode};

/// Inside the gauge for `?hold=<ms>`, or with `?gate` until the test opens the
/// gate; answers with the lock's key.
async fn hold(
    inside: web::Data<Inside>,
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
    lock.key().to_owned()
}

/// A server with one resource per `(path, middleware)`, all on one handle.
fn server(
    redlock: Redlock,
    routes: Vec<(&'static str, RedlockMiddleware)>,
) -> (Server, web::Data<Inside>) {
    let inside = web::Data::new(Inside::default());
    let shared = inside.clone();
    let server = serve!(move || {
        let mut app = App::new()
            .app_data(shared.clone())
            .app_data(redlock.clone());
        for (path, middleware) in &routes {
            app = app.service(
                web::resource(*path)
                    .wrap(middleware.clone())
                    .route(web::get().to(hold)),
            );
        }
        app
    });
    (server, inside)
}

/// Sends `first` (with its headers, holding until the second was answered),
/// waits until its handler is inside, then sends `second`; returns both
/// replies.
async fn while_the_first_holds(
    server: &Server,
    inside: &Inside,
    first: (&str, &[(&str, &str)]),
    second: (&str, &[(&str, &str)]),
) -> (Reply, Reply) {
    // Closed for this first request (an earlier one of the test opened it).
    inside.gate.close();
    let client = client();
    let first = actix_web::rt::spawn({
        let client = client.clone();
        let url = server.url(&format!("{}?gate", first.0));
        let headers: Vec<(String, String)> = first
            .1
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            redlock_tests::http::get_with(&client, &url, &headers).await
        }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the first request never reached its handler"
    );
    let second = redlock_tests::http::get_with(&client, &server.url(second.0), second.1).await;
    assert!(
        !first.is_finished(),
        "the first request must still hold its lock when the second is answered"
    );
    inside.gate.open();
    (first.await.unwrap(), second)
}

/// Item 7: a transfer from `tenant=acme` used to lock tenant acme's own key.
#[actix_web::test]
async fn a_path_value_cannot_take_another_family_s_lock() {
    let cluster = Cluster::start(3);
    let (server, inside) = server(
        cluster.patient_redlock(),
        vec![
            (
                "/transfers/{from}/{to}",
                RedlockMiddleware::by_path_params(["from", "to"]),
            ),
            (
                "/tenant-jobs",
                RedlockMiddleware::by_header_as(HeaderName::from_static("x-tenant"), "tenant"),
            ),
        ],
    );
    let (transfer, job) = while_the_first_holds(
        &server,
        &inside,
        ("/transfers/tenant=acme/x", &[]),
        ("/tenant-jobs", &[("x-tenant", "acme")]),
    )
    .await;
    assert_eq!(transfer.status, 200, "{}", transfer.text());
    assert_eq!(
        job.status,
        200,
        "tenant acme's job must not wait for a transfer whose path says \
         `tenant=acme`: {}",
        job.text()
    );
    assert_eq!(job.text(), "redlock:tenant=acme");
    assert_ne!(transfer.text(), job.text());
}

/// Item 7, joins: `a` + `b=c` against `a=b` + `c`, and `redlock:` +
/// `jobs:job=7` against `redlock:jobs:` + `job=7`.
#[actix_web::test]
async fn keys_joined_from_parts_cannot_spell_each_other() {
    let cluster = Cluster::start(3);
    let header = HeaderName::from_static;
    let (server, inside) = server(
        cluster.patient_redlock(),
        vec![
            (
                "/one",
                RedlockMiddleware::by_header_as(header("x-one"), "a"),
            ),
            (
                "/two",
                RedlockMiddleware::by_header_as(header("x-two"), "a=b"),
            ),
            ("/plain", RedlockMiddleware::by_header(header("x-tenant"))),
            (
                "/jobs",
                RedlockMiddleware::by_header_as(header("x-job"), "job").namespace("redlock:jobs:"),
            ),
        ],
    );
    let (one, two) = while_the_first_holds(
        &server,
        &inside,
        ("/one", &[("x-one", "b=c")]),
        ("/two", &[("x-two", "c")]),
    )
    .await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(
        two.status,
        200,
        "`a` + `b=c` and `a=b` + `c` are two keys: {}",
        two.text()
    );
    assert_ne!(one.text(), two.text());

    let (plain, job) = while_the_first_holds(
        &server,
        &inside,
        ("/plain", &[("x-tenant", "jobs:job=7")]),
        ("/jobs", &[("x-job", "7")]),
    )
    .await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(
        job.status,
        200,
        "a value under `redlock:` cannot reach into `redlock:jobs:`: {}",
        job.text()
    );
    assert_eq!(job.text(), "redlock:jobs:job=7");
}

/// Item 3: the reserved suffix in a path was answered 500; it is the
/// client's input: 400, problem+json, nothing written.
#[actix_web::test]
async fn a_path_ending_in_the_reserved_suffix_is_a_bad_request() {
    let cluster = Cluster::start(3);
    let (server, _) = server(
        cluster.patient_redlock(),
        vec![("/o/{rest:.*}", RedlockMiddleware::by_path())],
    );
    let client = client();
    let reply = get(&client, &server.url("/o/x:redlock-waiters")).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["status"], 400);
    for node in cluster.nodes() {
        assert_eq!(node.keys(), Vec::<String>::new(), "nothing written");
    }
    let fine = get(&client, &server.url("/o/x:redlock-waiter")).await;
    assert_eq!(fine.status, 200, "{}", fine.text());
}

/// The longest key name on `node`, in bytes (`SCAN`, bounded).
fn longest_key(node: &RedisNode) -> usize {
    let mut cursor = "0".to_owned();
    let mut longest = 0;
    for _ in 0..10_000 {
        let (next, keys): (String, Vec<Vec<u8>>) =
            node.raw(&["SCAN", &cursor, "COUNT", "1000"]).expect("SCAN");
        longest = keys.iter().map(Vec::len).fold(longest, usize::max);
        if next == "0" {
            return longest;
        }
        cursor = next;
    }
    panic!("SCAN did not finish in 10,000 rounds");
}

/// Item 2: a 60 KB path put a 60,011-byte key on every node. The key is at
/// most the namespace and `MAX_KEY_BYTES`, keeps a readable start, and still
/// names one path: the same path is busy, a path differing only in its last
/// byte is not.
#[actix_web::test]
async fn a_60_kb_path_puts_a_bounded_key_on_every_node() {
    const KEY_BOUND: usize = "redlock:".len() + MAX_KEY_BYTES;
    let cluster = Cluster::start(3);
    let (server, inside) = server(
        cluster.patient_redlock(),
        vec![("/o/{rest:.*}", RedlockMiddleware::by_path())],
    );
    let client = client();
    let long = format!("/o/{}", "a".repeat(60_000));
    let sibling = format!("/o/{}b", "a".repeat(59_999));

    let first = actix_web::rt::spawn({
        let (client, url) = (client.clone(), server.url(&format!("{long}?gate")));
        async move { get(&client, &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the first request never reached its handler"
    );
    assert!(
        eventually(timing::settled(), || cluster
            .nodes()
            .iter()
            .all(|n| !n.keys().is_empty()))
        .await,
        "the lock is on every node"
    );
    for (i, node) in cluster.nodes().iter().enumerate() {
        let longest = longest_key(node);
        assert!(
            longest <= KEY_BOUND,
            "node {i}: a key of {longest} bytes, over the bound of {KEY_BOUND}"
        );
    }
    let same = get(&client, &server.url(&long)).await;
    assert_eq!(same.status, 409, "{}", same.text());
    let other = get(&client, &server.url(&sibling)).await;
    assert_eq!(other.status, 200, "another path, another key");
    assert!(!first.is_finished(), "the first request still holds");
    inside.gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    let key = first.text();
    assert!(key.len() <= KEY_BOUND, "a key of {} bytes", key.len());
    assert!(
        key.starts_with("redlock:/o/aaaa"),
        "a readable start: {key}"
    );
    assert_ne!(key, other.text());
}

/// Item 12: the 503 of a lost lock named the Redis key with the handle's
/// prefix; it names the resource, as busy does.
#[actix_web::test]
async fn a_lost_lock_s_503_names_the_resource() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .key_prefix("app1:")
        .build()
        .unwrap();
    // A TTL the patient handle renews (two node timeouts).
    let ttl = PATIENT_NODE_TIMEOUT * 4;
    let (server, inside) = server(
        redlock,
        vec![("/o/{rest:.*}", RedlockMiddleware::by_path().ttl(ttl))],
    );
    let client = client();
    let request = actix_web::rt::spawn({
        // Held until the loss drops the handler (the gate never opens).
        let (client, url) = (client.clone(), server.url("/o/work?gate"));
        async move { get(&client, &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the handler never ran"
    );
    let key = "app1:redlock:/o/work";
    assert!(
        on_every_node(&cluster, key).await,
        "the lock is on every node"
    );
    let busy = get(&client, &server.url("/o/work")).await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.json()["key"], "redlock:/o/work", "{}", busy.text());
    for i in 0..2 {
        cluster.node(i).cmd(&["DEL", key]);
    }
    let reply = within(liveness(ttl), "the 503", request).await.unwrap();
    assert_eq!(reply.status, 503, "{}", reply.text());
    let doc = reply.json();
    assert_eq!(doc["title"], "Lock lost", "{doc}");
    assert_eq!(
        doc["key"], "redlock:/o/work",
        "the resource, as busy answers it: {doc}"
    );
}
