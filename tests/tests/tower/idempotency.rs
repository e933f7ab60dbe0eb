//! `IdempotencyLayer` on real `redis-server` processes: concurrent copies of
//! one key run the work once, replays are byte-identical, 422 / 400 / 5xx,
//! and a lock lost before the record leaves no record.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use http::Method;
use redlock_core::Redlock;
use redlock_core::idempotency::IdempotencyPolicy;
use redlock_core::request::LostPolicy;
use redlock_tests::Cluster;
use redlock_tests::http::{send, send_retrying_busy};
use redlock_tower::idempotency::IdempotencyLayer;

use crate::common::{Server, answered, client, ms, short_ttl_redlock, timing};
use redlock_tests::http_timing::busy_retries;

/// `POST /pay`: counts its runs, takes `?hold=<ms>`, answers 201 with the
/// run number and the body. `POST /fail`: counts, answers 500.
fn app(redlock: Redlock, policy: IdempotencyPolicy, runs: Arc<AtomicUsize>) -> Router {
    let fails = Arc::clone(&runs);
    Router::new()
        .route(
            "/pay",
            post(move |uri: http::Uri, body: String| {
                let runs = Arc::clone(&runs);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(crate::common::hold_of(&uri)).await;
                    (
                        StatusCode::CREATED,
                        [("content-type", "text/plain"), ("x-run", "not-replayed")],
                        format!("paid #{n}: {body}"),
                    )
                }
            }),
        )
        .route(
            "/fail",
            post(move || {
                let runs = Arc::clone(&fails);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::INTERNAL_SERVER_ERROR, format!("failed #{n}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(redlock).policy(policy))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_copies_run_the_work_once_and_agree() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    // Every node's connection is up before the burst (see the actix twin),
    // and the handle is patient: this test is about the copies agreeing, not
    // about slow nodes.
    let redlock = cluster.patient_redlock();
    redlock.check_nodes().await.unwrap();
    let server = Server::start(app(
        redlock,
        IdempotencyPolicy::default(),
        Arc::clone(&runs),
    ))
    .await;
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
    let mut busy_retries = 0;
    let mut replayed = 0;
    for reply in &replies {
        let (reply, retries) = reply.as_ref().unwrap();
        busy_retries += retries;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
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
    assert_eq!(replayed, 49, "every copy but the first is a replay");
    assert!(busy_retries > 0, "no copy met the first in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_byte_identical_and_says_so() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server::start(app(
        cluster.patient_redlock(),
        IdempotencyPolicy::default(),
        Arc::clone(&runs),
    ))
    .await;
    let client = client();
    let key = [("idempotency-key", "order-7")];
    let first = send(&client, Method::POST, &server.url("/pay"), &key, "x")
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = send(&client, Method::POST, &server.url("/pay"), &key, "x")
        .await
        .unwrap();
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("content-type"), Some("text/plain"));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    // Not on the allowlist: not replayed.
    assert_eq!(first.header("x-run"), Some("not-replayed"));
    assert_eq!(again.header("x-run"), None);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatch_is_422_and_a_missing_or_bad_key_is_400() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server::start(app(
        cluster.patient_redlock(),
        IdempotencyPolicy::default(),
        Arc::clone(&runs),
    ))
    .await;
    let client = client();
    let url = server.url("/pay");
    let key = [("idempotency-key", "order-8")];
    let first = send(&client, Method::POST, &url, &key, "a").await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send(&client, Method::POST, &url, &key, "b").await.unwrap();
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(other.json()["status"], 422);
    let missing = send(&client, Method::POST, &url, &[], "a").await.unwrap();
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    let long = "k".repeat(256);
    let bad = send(
        &client,
        Method::POST,
        &url,
        &[("idempotency-key", &long)],
        "a",
    )
    .await
    .unwrap();
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Over the request cap: 413, not run.
    let small = IdempotencyPolicy::default().max_request_body(4);
    let server = Server::start(app(cluster.patient_redlock(), small, Arc::clone(&runs))).await;
    let big = send(
        &client,
        Method::POST,
        &server.url("/pay"),
        &[("idempotency-key", "big-1")],
        Bytes::from_static(b"12345"),
    )
    .await
    .unwrap();
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_is_not_stored_and_a_retry_runs_again() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server::start(app(
        cluster.patient_redlock(),
        IdempotencyPolicy::default(),
        Arc::clone(&runs),
    ))
    .await;
    let client = client();
    let key = [("idempotency-key", "fail-1")];
    for n in 1..=2 {
        let (reply, _) = send_retrying_busy(
            &client,
            Method::POST,
            &server.url("/fail"),
            &key,
            "",
            busy_retries(timing::settled(), ms(50)),
            ms(50),
        )
        .await
        .unwrap();
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.text(), format!("failed #{n}"));
        assert_eq!(reply.header("idempotent-replayed"), None);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_before_the_record_leaves_none_and_the_next_copy_runs() {
    let cluster = Cluster::start(3);
    for lost in [LostPolicy::Abort, LostPolicy::Signal] {
        let runs = Arc::new(AtomicUsize::new(0));
        // Renewal stops after 200 ms; the handler stalls 1.5 s, past the
        // validity of its 500 ms TTL.
        let policy =
            IdempotencyPolicy::default().lock(|l| l.ttl(ms(500)).max_hold(ms(200)).on_lost(lost));
        // The TTL is the subject: the short node timeout.
        let server =
            Server::start(app(short_ttl_redlock(&cluster), policy, Arc::clone(&runs))).await;
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
        match lost {
            LostPolicy::Abort => {
                assert_eq!(stalled.status, StatusCode::SERVICE_UNAVAILABLE, "{lost:?}")
            }
            _ => assert_eq!(stalled.status, StatusCode::CREATED, "{lost:?}"),
        }
        assert_eq!(stalled.header("idempotent-replayed"), None);
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
        assert_eq!(
            next.status,
            StatusCode::CREATED,
            "{lost:?}: {}",
            next.text()
        );
        assert_eq!(next.header("idempotent-replayed"), None, "{lost:?}");
        assert_eq!(next.text(), "paid #2: s", "{lost:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{lost:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_response_is_passed_through_then_not_replayed_nor_run_again() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = IdempotencyPolicy::default().max_response_body(8);
    let server = Server::start(app(cluster.patient_redlock(), policy, Arc::clone(&runs))).await;
    let client = client();
    let key = [("idempotency-key", "big-response-1")];
    let url = server.url("/pay");
    let first = send(&client, Method::POST, &url, &key, "a long body")
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
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
    assert_eq!(again.status, StatusCode::GONE, "{}", again.text());
    assert_eq!(
        again.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(again.json()["original_status"], 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_header_keys_and_a_scope_separates_clients() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/hook",
            post(move |body: String| {
                let runs = Arc::clone(&counter);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    format!("hook #{n}: {body}")
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(cluster.patient_redlock())
                .key_header(http::HeaderName::from_static("x-github-delivery"))
                .scope(|parts| {
                    parts
                        .headers
                        .get("x-tenant")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                }),
        );
    let server = Server::start(app).await;
    let client = client();
    let url = server.url("/hook");
    let deliver = |tenant: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            send_retrying_busy(
                &client,
                Method::POST,
                &url,
                &[("x-github-delivery", "72d3162e-cc78"), ("x-tenant", tenant)],
                "push",
                busy_retries(timing::settled(), ms(50)),
                ms(50),
            )
            .await
            .unwrap()
            .0
        }
    };
    let a = deliver("a").await;
    let b = deliver("b").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(
        b.header("idempotent-replayed"),
        None,
        "tenant b saw a's record"
    );
    assert_ne!(a.body, b.body);
    let again = deliver("a").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, a.body);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The Idempotency-Key header means nothing to this layer: no delivery id, 400.
    let none = send(
        &client,
        Method::POST,
        &url,
        &[("idempotency-key", "k")],
        "push",
    )
    .await
    .unwrap();
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
}

/// The key read from the buffered body (Stripe puts its event id in the JSON
/// body): two deliveries of one event run the handler once; another event
/// runs it again; a body without an id is refused with 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_from_the_body_names_the_delivery() {
    use redlock_core::idempotency::IdempotencyKey;
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/stripe",
            post(move |body: String| {
                let runs = Arc::clone(&counter);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    format!("event handled #{n}: {body}")
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(cluster.patient_redlock()).key_fn(|_parts, body| {
                let v: serde_json::Value = serde_json::from_slice(body).ok()?;
                let id = v.get("id")?.as_str()?;
                Some(IdempotencyKey::parse(id.as_bytes()))
            }),
        );
    let server = Server::start(app).await;
    let client = client();
    let url = server.url("/stripe");
    let post_body = |body: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move { send(&client, Method::POST, &url, &[], body).await.unwrap() }
    };
    let first = post_body(r#"{"id":"evt_1","type":"charge.succeeded"}"#).await;
    let again = post_body(r#"{"id":"evt_1","type":"charge.succeeded"}"#).await;
    let other = post_body(r#"{"id":"evt_2","type":"charge.succeeded"}"#).await;
    let none = post_body(r#"{"type":"ping"}"#).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body, "the replay is byte-identical");
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.header("idempotent-replayed"), None);
    assert_eq!(
        none.status,
        StatusCode::BAD_REQUEST,
        "no id in the body: missing key"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "evt_1 once, evt_2 once");
}

/// Duplicates may wait instead of getting 409: the second copy, sent while the
/// first runs, waits for it (woken by its release) and gets its recorded
/// answer, without running the work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_waits_and_gets_the_recorded_answer() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = IdempotencyPolicy::default().lock(|l| l.wait(answered(ms(600))));
    let server = Server::start(app(cluster.patient_redlock(), policy, Arc::clone(&runs))).await;
    let client = client();
    let url = server.url("/pay?hold=600");
    let headers = [("idempotency-key", "\"wait-1\"")];
    let first = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            send(&client, Method::POST, &url, &headers, "7 EUR")
                .await
                .unwrap()
        })
    };
    // The second copy goes once the first is inside its handler.
    assert!(
        crate::common::eventually(answered(std::time::Duration::ZERO), || runs
            .load(Ordering::SeqCst)
            == 1)
        .await
    );
    let second = send(&client, Method::POST, &url, &headers, "7 EUR")
        .await
        .unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(second.status, StatusCode::CREATED, "waited, not 409");
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
