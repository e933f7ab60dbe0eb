//! `RedlockLayer::permits(n)` and `shared_for_safe_methods()` over real HTTP
//! and real Redis nodes (issue 41): at most n requests per key inside, the
//! rest answered 429 with `Retry-After` and problem+json (and, opted in, the
//! `RateLimit` fields: issue 51); safe methods share a key, the others hold
//! it alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::future::join_all;
use http::{Method, StatusCode};
use redlock_tests::Cluster;
use redlock_tests::http::send;
use redlock_tests::http_timing::Inside;
use redlock_tower::RedlockLayer;

/// Inside the gauge, at the gate until the test saw what it needs of the
/// others (bounded: a request never let through leaves after a liveness
/// bound).
async fn inside(State(s): State<Arc<Inside>>) -> &'static str {
    let _in = s.gauge.enter();
    let _ = tokio::time::timeout(answered(Duration::ZERO), s.gate.passed()).await;
    "done"
}

async fn warm(redlock: &redlock_core::Redlock) {
    let lock = redlock
        .mutex("warm-up")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    redlock.unlock(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_admit_n_requests_per_key_and_answer_the_rest_429() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    warm(&redlock).await;
    let state = Arc::new(Inside::default());
    let gauge = &state.gauge;
    let app = Router::new()
        .route("/exports", get(inside))
        .with_state(Arc::clone(&state))
        .layer(RedlockLayer::by_header(http::HeaderName::from_static("x-tenant")).permits(2))
        .layer(Extension(redlock));
    let server = Server::start(app).await;
    let client = client();
    let url = server.url("/exports");
    // The admitted requests stay inside until a client was answered 429.
    let replies = join_all((0..6).map(|_| {
        let (client, url, state) = (client.clone(), url.clone(), state.clone());
        async move {
            let reply = send(&client, Method::GET, &url, &[("x-tenant", "7")], "")
                .await
                .unwrap();
            if reply.status == StatusCode::TOO_MANY_REQUESTS {
                state.gate.open();
            }
            reply
        }
    }))
    .await;
    assert!(
        gauge.max() <= 2,
        "{} requests inside with 2 permits",
        gauge.max()
    );
    let ok = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    let limited: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!(
        ok + limited.len(),
        6,
        "other statuses: {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(
        ok >= 1 && !limited.is_empty(),
        "{ok} ok, {} limited",
        limited.len()
    );
    for r in limited {
        assert!(r.retry_after().is_some(), "429 without Retry-After");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
}

/// The route's busy answers, once the two permits of tenant 7 are held: the
/// opted-in route's 429 carries `RateLimit-Policy` and `RateLimit` with `t`
/// its `Retry-After`, the other route's on the same key does not, and an
/// opted-in mutex route's 409 does not either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permits_busy_answer_carries_the_rate_limit_fields_when_asked() {
    const TTL: Duration = Duration::from_secs(60);
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    warm(&redlock).await;
    let tenant = || RedlockLayer::by_header(http::HeaderName::from_static("x-tenant"));
    let app = Router::new()
        .route("/fields", get(|| async { "ran" }))
        .route_layer(tenant().permits(2).rate_limit_fields())
        .merge(
            Router::new()
                .route("/plain", get(|| async { "ran" }))
                .route_layer(tenant().permits(2)),
        )
        .merge(
            Router::new()
                .route("/mutex", get(|| async { "ran" }))
                .route_layer(tenant().namespace("jobs:").rate_limit_fields()),
        )
        .layer(Extension(redlock.clone()));
    let server = Server::start(app).await;
    let client = client();
    // The two permits of tenant 7 (the layer's resource: namespace, then
    // the header's key) and its mutex under `jobs:`, held from here.
    let taken = Instant::now();
    let permits = redlock.semaphore("redlock:x-tenant=7", 2).unwrap();
    let first = permits.try_acquire(TTL).await.unwrap();
    let second = permits.try_acquire(TTL).await.unwrap();
    let job = redlock
        .mutex("jobs:x-tenant=7")
        .try_acquire(TTL)
        .await
        .unwrap();
    let ask = |path: &str| {
        let (client, url) = (client.clone(), server.url(path));
        async move {
            send(&client, Method::GET, &url, &[("x-tenant", "7")], "")
                .await
                .unwrap()
        }
    };

    let limited = ask("/fields").await;
    let waited = taken.elapsed();
    assert_eq!(
        limited.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        limited.text()
    );
    assert_eq!(
        limited.header("ratelimit-policy"),
        Some(r#""permits";q=2;qu="concurrent-requests""#)
    );
    let t = limited.retry_after().expect("429 without Retry-After");
    assert_eq!(
        limited.header("ratelimit"),
        Some(format!(r#""permits";r=0;t={t}"#).as_str())
    );
    // `t` is when the sooner permit frees: within the holders' TTL, and no
    // earlier than what is left of it.
    assert!(
        t <= TTL.as_secs() && Duration::from_secs(t) + waited >= TTL,
        "t = {t} s for permits taken {waited:?} ago with a {TTL:?} TTL"
    );

    let plain = ask("/plain").await;
    assert_eq!(plain.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(plain.retry_after().is_some());
    assert_eq!(plain.header("ratelimit-policy"), None, "fields by default");
    assert_eq!(plain.header("ratelimit"), None, "fields by default");

    let busy = ask("/mutex").await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert!(busy.retry_after().is_some());
    assert_eq!(busy.header("ratelimit-policy"), None, "fields on a mutex");
    assert_eq!(busy.header("ratelimit"), None, "fields on a mutex");

    for lock in [first, second, job] {
        redlock.unlock(lock).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safe_methods_share_a_key_and_other_methods_hold_it_alone() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    warm(&redlock).await;
    let state = Arc::new(Inside::default());
    let gauge = &state.gauge;
    let app = Router::new()
        .route("/reports/7", get(inside).post(inside))
        .with_state(Arc::clone(&state))
        .layer(RedlockLayer::by_path().shared_for_safe_methods())
        .layer(Extension(redlock));
    let server = Server::start(app).await;
    let client = client();
    let url = server.url("/reports/7");
    let reads = join_all((0..3).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        async move { send(&client, Method::GET, &url, &[], "").await.unwrap() }
    }));
    let write = async {
        // Once the reads are inside: the write is refused (fail fast). The
        // reads stay inside until it was answered.
        assert!(eventually(answered(Duration::ZERO), || gauge.now() >= 2).await);
        let write = send(&client, Method::POST, &url, &[], "").await.unwrap();
        state.gate.open();
        write
    };
    let (reads, write) = tokio::join!(reads, write);
    assert!(reads.iter().all(|r| r.status == StatusCode::OK));
    assert!(gauge.max() >= 2, "reads never shared the key");
    assert_eq!(
        write.status,
        StatusCode::CONFLICT,
        "a write ran beside reads"
    );
    // Alone, the write runs (once the readers' releases, sent as their
    // bodies ended, have landed).
    let mut alone = StatusCode::CONFLICT;
    let end = std::time::Instant::now() + timing::settled();
    while alone == StatusCode::CONFLICT && std::time::Instant::now() < end {
        alone = send(&client, Method::POST, &url, &[], "")
            .await
            .unwrap()
            .status;
    }
    assert_eq!(alone, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_many_distinct_paths_leave_no_key_on_the_nodes() {
    const PATHS: usize = 60;
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    warm(&redlock).await;
    let app = Router::new()
        .route("/r/{id}", get(|| async { "read" }))
        .layer(RedlockLayer::by_path().shared_for_safe_methods())
        .layer(Extension(redlock));
    let server = Server::start(app).await;
    let client = client();
    for id in 0..PATHS {
        let url = server.url(&format!("/r/{id}"));
        let r = send(&client, Method::GET, &url, &[], "").await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "GET /r/{id}");
    }
    // Each read's release is sent as its body ends; wait for them to land.
    let clean = cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| n.keys().is_empty())
    });
    let left: Vec<Vec<String>> = cluster.nodes().iter().map(|n| n.keys()).collect();
    assert!(
        clean,
        "{PATHS} reads of distinct paths left keys on the nodes: {} / {} / {}, e.g. {:?}",
        left[0].len(),
        left[1].len(),
        left[2].len(),
        left[0].iter().take(3).collect::<Vec<_>>()
    );
}
