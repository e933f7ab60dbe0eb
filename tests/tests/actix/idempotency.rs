//! `IdempotencyMiddleware` on real `redis-server` processes, the twin of the
//! tower suite: concurrent copies of one key run the work once, replays are
//! byte-identical, 422 / 400 / 5xx, and a lock lost before the record leaves
//! no record.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix_web::{App, HttpRequest, HttpResponse, web};
use http::Method;
use redlock_actix::idempotency::{IdempotencyMiddleware, IdempotencyPolicy};
use redlock_core::Redlock;
use redlock_core::request::LostPolicy;
use redlock_tests::Cluster;
use redlock_tests::http::{send, send_retrying_busy};

use crate::common::{Server, answered, client, ms, short_ttl_redlock, timing};
use redlock_tests::http_timing::busy_retries;

/// `POST /pay`: counts its runs, takes `?hold=<ms>`, answers 201 with the run
/// number and the body. `POST /fail`: counts, answers 500.
fn server(cluster: &Cluster, policy: IdempotencyPolicy, runs: Arc<AtomicUsize>) -> Server {
    server_on(cluster.patient_redlock(), policy, runs)
}

/// [`server`] on a given handle.
fn server_on(redlock: Redlock, policy: IdempotencyPolicy, runs: Arc<AtomicUsize>) -> Server {
    serve!(move || {
        let (pay_runs, fail_runs) = (Arc::clone(&runs), Arc::clone(&runs));
        App::new()
            .wrap(IdempotencyMiddleware::new(redlock.clone()).policy(policy.clone()))
            .route(
                "/pay",
                web::post().to(move |req: HttpRequest, body: String| {
                    let runs = Arc::clone(&pay_runs);
                    async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        let hold = req
                            .query_string()
                            .strip_prefix("hold=")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        actix_web::rt::time::sleep(ms(hold)).await;
                        HttpResponse::Created()
                            .content_type("text/plain")
                            .insert_header(("x-run", "not-replayed"))
                            .body(format!("paid #{n}: {body}"))
                    }
                }),
            )
            .route(
                "/fail",
                web::post().to(move || {
                    let runs = Arc::clone(&fail_runs);
                    async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        HttpResponse::InternalServerError().body(format!("failed #{n}"))
                    }
                }),
            )
    })
}

#[actix_web::test]
async fn fifty_concurrent_copies_run_the_work_once_and_agree() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    // Every node's connection is up before the burst: 150 first calls at once
    // on cold connections can outlast the node timeout on a loaded machine,
    // and this test is about the copies, not the connects. Each worker (a
    // runtime) opens its own: one request on a connection of its own per
    // worker, which actix hands to its workers in turn. Each worker's thread
    // also reads its own connections' answers, between the 25 copies it
    // serves: the handle is patient.
    let redlock = cluster.patient_redlock();
    let server = server_on(redlock, IdempotencyPolicy::default(), Arc::clone(&runs));
    // A cold worker may answer 503 while it connects: its connection attempt
    // goes on, and the same client (the same worker) asks again.
    for i in 0..2 {
        let (warm_client, key) = (client(), format!("\"warm-{i}\""));
        let mut statuses = Vec::new();
        let end = std::time::Instant::now() + answered(std::time::Duration::ZERO);
        while std::time::Instant::now() < end {
            let warm = send(
                &warm_client,
                Method::POST,
                &server.url("/warm-up"),
                &[("idempotency-key", key.as_str())],
                "",
            )
            .await
            .unwrap();
            statuses.push(warm.status);
            if warm.status != 503 {
                break;
            }
            actix_web::rt::time::sleep(ms(100)).await;
        }
        assert_eq!(
            statuses.last().copied(),
            Some(http::StatusCode::NOT_FOUND),
            "{statuses:?}"
        );
    }
    let client = client();
    let url = server.url("/pay?hold=300");
    let copies = (0..50).map(|_| {
        send_retrying_busy(
            &client,
            Method::POST,
            &url,
            &[("idempotency-key", "\"burst-1\"")],
            "42 EUR",
            busy_retries(answered(ms(300)), ms(50)),
            ms(50),
        )
    });
    let replies = futures_util::future::join_all(copies).await;
    let (mut busy_retries, mut replayed) = (0, 0);
    for reply in &replies {
        let (reply, retries) = reply.as_ref().unwrap();
        busy_retries += retries;
        assert_eq!(reply.status, 201, "{}", reply.text());
        assert_eq!(reply.text(), "paid #1: 42 EUR");
        if reply.header("idempotent-replayed") == Some("true") {
            replayed += 1;
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran more than once"
    );
    assert_eq!(replayed, 49);
    assert!(busy_retries > 0, "no copy met the first in flight");
}

#[actix_web::test]
async fn replay_mismatch_missing_key_and_5xx() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let server = server(&cluster, IdempotencyPolicy::default(), Arc::clone(&runs));
    let client = client();
    let url = server.url("/pay");
    let key = [("idempotency-key", "order-7")];
    let first = send(&client, Method::POST, &url, &key, "x").await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = send(&client, Method::POST, &url, &key, "x").await.unwrap();
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(again.header("content-type"), Some("text/plain"));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("x-run"), None);
    let other = send(&client, Method::POST, &url, &key, "y").await.unwrap();
    assert_eq!(other.status, 422);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    let missing = send(&client, Method::POST, &url, &[], "x").await.unwrap();
    assert_eq!(missing.status, 400);
    let long = "k".repeat(256);
    let bad = send(
        &client,
        Method::POST,
        &url,
        &[("idempotency-key", &long)],
        "x",
    )
    .await
    .unwrap();
    assert_eq!(bad.status, 400);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let fail_key = [("idempotency-key", "fail-1")];
    for n in 2..=3 {
        let (reply, _) = send_retrying_busy(
            &client,
            Method::POST,
            &server.url("/fail"),
            &fail_key,
            "",
            busy_retries(timing::settled(), ms(50)),
            ms(50),
        )
        .await
        .unwrap();
        assert_eq!(reply.status, 500);
        assert_eq!(reply.text(), format!("failed #{n}"), "a 5xx was replayed");
    }
}

#[actix_web::test]
async fn a_lock_lost_before_the_record_leaves_none_and_the_next_copy_runs() {
    let cluster = Cluster::start(3);
    for lost in [LostPolicy::Abort, LostPolicy::Signal] {
        let runs = Arc::new(AtomicUsize::new(0));
        let policy =
            IdempotencyPolicy::default().lock(|l| l.ttl(ms(500)).max_hold(ms(200)).on_lost(lost));
        // The TTL is the subject: the short node timeout.
        let server = server_on(short_ttl_redlock(&cluster), policy, Arc::clone(&runs));
        let client = client();
        let name = format!("stalled-{lost:?}");
        let key = [("idempotency-key", name.as_str())];
        let stalled = send(
            &client,
            Method::POST,
            &server.url("/pay?hold=1500"),
            &key,
            "s",
        )
        .await
        .unwrap();
        let expected = if lost == LostPolicy::Abort { 503 } else { 201 };
        assert_eq!(stalled.status, expected, "{lost:?}: {}", stalled.text());
        let (next, _) = send_retrying_busy(
            &client,
            Method::POST,
            &server.url("/pay"),
            &key,
            "s",
            busy_retries(timing::settled(), ms(50)),
            ms(50),
        )
        .await
        .unwrap();
        assert_eq!(next.status, 201, "{lost:?}: {}", next.text());
        assert_eq!(next.header("idempotent-replayed"), None, "{lost:?}");
        assert_eq!(next.text(), "paid #2: s", "{lost:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{lost:?}");
    }
}

#[actix_web::test]
async fn an_oversize_response_is_passed_through_then_not_replayed_nor_run_again() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = IdempotencyPolicy::default().max_response_body(8);
    let server = server(&cluster, policy, Arc::clone(&runs));
    let client = client();
    let key = [("idempotency-key", "big-response-1")];
    let url = server.url("/pay");
    let first = send(&client, Method::POST, &url, &key, "a long body")
        .await
        .unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(first.text(), "paid #1: a long body", "passed through whole");
    let (again, _) = send_retrying_busy(
        &client,
        Method::POST,
        &url,
        &key,
        "a long body",
        busy_retries(timing::settled(), ms(50)),
        ms(50),
    )
    .await
    .unwrap();
    assert_eq!(again.status, 410, "{}", again.text());
    assert_eq!(again.json()["original_status"], 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run again");
}

#[actix_web::test]
async fn a_request_body_over_the_cap_is_413_and_not_run() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let small = IdempotencyPolicy::default().max_request_body(4);
    let server = server(&cluster, small, Arc::clone(&runs));
    let client = client();
    let url = server.url("/pay");
    let big = send(
        &client,
        Method::POST,
        &url,
        &[("idempotency-key", "big-1")],
        "12345",
    )
    .await
    .unwrap();
    assert_eq!(big.status, 413, "{}", big.text());
    assert_eq!(big.header("content-type"), Some("application/problem+json"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "an oversize request ran");
    // At the cap it runs.
    let fits = send(
        &client,
        Method::POST,
        &url,
        &[("idempotency-key", "big-2")],
        "1234",
    )
    .await
    .unwrap();
    assert_eq!(fits.status, 201, "{}", fits.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[actix_web::test]
async fn two_scopes_with_one_key_do_not_see_each_other() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let redlock = cluster.patient_redlock();
    let counter = Arc::clone(&runs);
    let server = serve!(move || {
        let runs = Arc::clone(&counter);
        App::new()
            .wrap(IdempotencyMiddleware::new(redlock.clone()).scope(|req| {
                req.headers()
                    .get("x-client")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            }))
            .route(
                "/pay",
                web::post().to(move |req: HttpRequest| {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let who = req
                        .headers()
                        .get("x-client")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    async move { HttpResponse::Created().body(format!("{who} #{n}")) }
                }),
            )
    });
    let client = client();
    let url = server.url("/pay");
    let as_client = |who: &'static str| [("idempotency-key", "shared-1"), ("x-client", who)];
    let acme = send(&client, Method::POST, &url, &as_client("acme"), "x")
        .await
        .unwrap();
    let globex = send(&client, Method::POST, &url, &as_client("globex"), "x")
        .await
        .unwrap();
    assert_eq!(
        (acme.status.as_u16(), acme.text()),
        (201, "acme #1".to_owned())
    );
    assert_eq!(
        (
            globex.status.as_u16(),
            globex.text(),
            globex.header("idempotent-replayed")
        ),
        (201, "globex #2".to_owned(), None),
        "one client saw another's record"
    );
    let again = send(&client, Method::POST, &url, &as_client("acme"), "x")
        .await
        .unwrap();
    assert_eq!(again.text(), "acme #1");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
