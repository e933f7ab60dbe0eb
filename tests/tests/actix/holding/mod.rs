//! How long `RedlockMiddleware` holds a lock in a real actix server: through a
//! response body streamed for longer than the TTL and no longer (default
//! `ReleasePolicy::BodyEnd`), only up to the response head with
//! `ReleasePolicy::ResponseHead`, through a handler that runs for several TTLs
//! (auto-extension by the renewal task on the worker's Tokio runtime), and what a
//! handler that blocks its worker does to it (loses it, and is stopped with a
//! 503), unlike one that moves the work to `web::block`. A streamed body whose
//! lock is lost is cut off (default `LostPolicy::Abort`), or streams on
//! (`LostPolicy::Signal`); a chunk made in the poll in which the lock was lost
//! is never given out.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::{App, HttpResponse, web};
use bytes::Bytes;
use http_body_util::BodyExt;
use redlock_actix::{LockHandle, RedlockMiddleware, ReleasePolicy};
use redlock_tests::Cluster;

mod cut_off;

/// Renewals through several TTLs are the subject here, not a slow node: the
/// handles are patient, and the TTL the shortest they renew (two node
/// timeouts).
const TTL: Duration = PATIENT_NODE_TIMEOUT.saturating_mul(2);
/// The stream's pace: a quarter TTL.
const STEP: Duration = Duration::from_millis(TTL.as_millis() as u64 / 4);
/// The TTL of the blocked-worker test, whose subject is a lock lost to a
/// starved renewal: short, with `short_ttl_redlock`'s node timeout.
const BLOCK_TTL: Duration = Duration::from_millis(300);
const KEY: &str = "redlock:/stream";

/// A body of 11 chunks, the first at once, then (once the app's gate, if any,
/// is open) one every 100 ms: about 1 s in all, more than three TTLs.
async fn stream(gate: Option<web::Data<Gate>>) -> HttpResponse {
    let chunks = futures_util::stream::unfold(0u32, move |i| {
        let gate = gate.clone();
        async move {
            if i > 10 {
                return None;
            }
            if let (1, Some(gate)) = (i, &gate) {
                gate.passed().await;
            }
            if i > 0 {
                actix_web::rt::time::sleep(STEP).await;
            }
            Some((
                Ok::<_, Infallible>(Bytes::from(format!("chunk {i}\n"))),
                i + 1,
            ))
        }
    });
    HttpResponse::Ok().streaming(chunks)
}

/// How long after a call that returned at quorum its last node has answered,
/// for the handles here.
fn settle(cluster: &Cluster) -> Duration {
    timing::settle(cluster.patient_redlock().node_timeout())
}

fn stream_server(
    cluster: &Cluster,
    middleware: RedlockMiddleware,
    gate: web::Data<Gate>,
) -> Server {
    let redlock = cluster.patient_redlock();
    let middleware = middleware.ttl(TTL);
    serve!(move || {
        App::new()
            .app_data(redlock.clone())
            .app_data(gate.clone())
            .wrap(middleware.clone())
            .route("/stream", web::get().to(stream))
    })
}

#[actix_web::test]
async fn streamed_body_holds_the_lock_until_its_last_chunk_and_no_longer() {
    let cluster = Cluster::start(3);
    let gate = web::Data::new(Gate::default());
    gate.open();
    let server = stream_server(&cluster, RedlockMiddleware::by_path(), gate);
    let client = client();
    let url = server.url("/stream");

    let response = open(&client, &url).await;
    assert_eq!(response.status(), 200);
    let head_at = Instant::now();
    let mut body = response.into_body();
    let (mut chunks, mut probes, mut text) = (0, Vec::new(), String::new());
    while let Some(frame) = within(CLIENT_TIMEOUT, "next chunk", body.frame()).await {
        let frame = frame.unwrap();
        let Some(data) = frame.data_ref() else {
            continue;
        };
        text.push_str(std::str::from_utf8(data).unwrap());
        chunks += 1;
        // Probe after chunks 3 and 9: the second past two TTLs, body not
        // done yet.
        if chunks == 4 || chunks == 10 {
            let elapsed = head_at.elapsed();
            let keys = cluster.count_with_key(KEY);
            let other = get(&client, &url).await;
            probes.push((elapsed, keys, other.status));
        }
    }
    let end_at = Instant::now();
    assert!(text.ends_with("chunk 10\n"), "whole body: {text:?}");
    assert!(
        end_at - head_at > TTL * 2,
        "the body must outlast the TTL: {:?}",
        end_at - head_at
    );
    assert_eq!(probes.len(), 2, "{probes:?}");
    for (elapsed, keys, status) in &probes {
        assert_eq!(
            *status, 409,
            "a request {elapsed:?} into the stream must find the lock busy"
        );
        assert!(
            *keys >= 2,
            "{keys} nodes hold the key {elapsed:?} into the stream"
        );
    }
    assert!(
        probes.iter().any(|(elapsed, ..)| *elapsed > TTL * 2),
        "one probe must come after two TTLs: {probes:?}"
    );

    let freed = eventually(settle(&cluster), || cluster.count_with_key(KEY) == 0)
        .await
        .then(Instant::now)
        .expect("the key must go once the body has ended");
    assert!(
        freed - end_at <= settle(&cluster),
        "released {:?} after the body's end",
        freed - end_at
    );
    let next = get(&client, &url).await;
    assert_eq!(next.status, 200, "the lock is free again");
}

#[actix_web::test]
async fn response_head_release_frees_the_lock_while_the_body_still_streams() {
    let cluster = Cluster::start(3);
    let gate = web::Data::new(Gate::default());
    let server = stream_server(
        &cluster,
        RedlockMiddleware::by_path().release_on(ReleasePolicy::ResponseHead),
        gate.clone(),
    );
    let client = client();
    let url = server.url("/stream");

    let response = open(&client, &url).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = within(CLIENT_TIMEOUT, "first chunk", body.frame())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.data_ref().map(|b| &b[..]), Some(&b"chunk 0\n"[..]));

    // The body waits at the gate after its first chunk; held to the body's
    // end, the key would stay (renewed) until the test opens it.
    assert!(
        eventually(settle(&cluster), || cluster.count_with_key(KEY) == 0).await,
        "the key must go at the response head"
    );
    let other = open(&client, &url).await;
    assert_eq!(
        other.status(),
        200,
        "a second request runs while the first body streams"
    );
    drop(other);
    gate.open();

    let rest = within(CLIENT_TIMEOUT, "rest of the body", body.collect())
        .await
        .unwrap()
        .to_bytes();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.starts_with("chunk 1\n") && rest.ends_with("chunk 10\n"),
        "the first body kept streaming: {rest:?}"
    );
}

#[actix_web::test]
async fn handler_running_three_ttls_stays_exclusive_through_auto_extension() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let gate = web::Data::new(Gate::default());
    let shared = gate.clone();
    let server = serve!(move || {
        App::new()
            .app_data(redlock.clone())
            .app_data(shared.clone())
            .wrap(RedlockMiddleware::by_path().ttl(TTL))
            .route(
                "/long",
                web::get().to(
                    |lock: web::ReqData<LockHandle>, gate: web::Data<Gate>| async move {
                        // Three TTLs at least, and until the test has probed.
                        actix_web::rt::time::sleep(TTL * 3 + ms(100)).await;
                        gate.passed().await;
                        format!("extensions={}", lock.extensions())
                    },
                ),
            )
    });
    let client = client();
    let url = server.url("/long");

    let long = actix_web::rt::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { get(&client, &url).await }
    });
    assert!(
        on_every_node(&cluster, "redlock:/long").await,
        "the long handler never took the lock"
    );
    let started = Instant::now();
    let mut probes = Vec::new();
    // One probe every ~100 ms while the long handler runs, until five probes
    // and one after two TTLs were made (the handler waits for them), within a
    // liveness bound.
    let end = started + liveness(TTL * 3 + ms(500));
    while !long.is_finished() && Instant::now() < end {
        let reply = get(&client, &url).await;
        if long.is_finished() {
            break; // the probe may have raced the release
        }
        probes.push((started.elapsed(), reply.status));
        if probes.len() >= 5 && probes.iter().any(|(t, _)| *t > TTL * 2) {
            break;
        }
        actix_web::rt::time::sleep(ms(100)).await;
    }
    gate.open();
    let long = long.await.unwrap();
    assert_eq!(long.status, 200);
    let extensions: u32 = long
        .text()
        .strip_prefix("extensions=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", long.text()));
    assert!(extensions >= 2, "3 TTLs need renewals, saw {extensions}");
    assert!(probes.len() >= 5, "too few probes: {probes:?}");
    assert!(
        probes.iter().any(|(t, _)| *t > TTL * 2),
        "no probe after two TTLs: {probes:?}"
    );
    assert!(
        probes.iter().all(|(_, s)| *s == 409),
        "every request during the handler must be rejected: {probes:?}"
    );
}

#[actix_web::test]
async fn handler_blocking_its_worker_past_the_ttl_loses_the_lock_and_gets_503() {
    let cluster = Cluster::start(3);
    let redlock = short_ttl_redlock(&cluster);
    let finished = Arc::new(AtomicBool::new(false));
    let flag = finished.clone();
    // One worker: the handler, and the renewal task of its lock, share a thread.
    let server = serve!(1, move || {
        let flag = flag.clone();
        App::new()
            .app_data(redlock.clone())
            .wrap(RedlockMiddleware::by_path().ttl(BLOCK_TTL))
            .route(
                "/blocking",
                web::get().to(move || {
                    let flag = flag.clone();
                    async move {
                        // CPU-bound work done wrong: the worker thread is stuck.
                        std::thread::sleep(BLOCK_TTL * 3);
                        actix_web::rt::time::sleep(ms(200)).await;
                        flag.store(true, Ordering::SeqCst);
                        "finished"
                    }
                }),
            )
            .route(
                "/offloaded",
                web::get().to(|lock: web::ReqData<LockHandle>| async move {
                    // The same work done right: the worker keeps renewing the lock.
                    web::block(|| std::thread::sleep(BLOCK_TTL * 3))
                        .await
                        .unwrap();
                    format!("extensions={} lost={}", lock.extensions(), lock.is_lost())
                }),
            )
    });
    let client = client();

    let blocked = get(&client, &server.url("/blocking")).await;
    assert_eq!(blocked.status, 503, "{}", blocked.text());
    let doc = blocked.json();
    assert_eq!(doc["title"], "Lock lost", "{doc}");
    assert_eq!(doc["key"], "redlock:/blocking", "{doc}");
    assert!(blocked.retry_after().is_some_and(|s| s >= 1));
    actix_web::rt::time::sleep(ms(400)).await;
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler must be dropped at its first await after the loss"
    );

    let offloaded = get(&client, &server.url("/offloaded")).await;
    assert_eq!(offloaded.status, 200, "{}", offloaded.text());
    let text = offloaded.text();
    let extensions: u32 = text
        .strip_prefix("extensions=")
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(extensions >= 2, "renewed while web::block ran: {text}");
    assert!(text.ends_with("lost=false"), "{text}");
}

/// An in-memory answer is released before its head is sent (so head and body go
/// out together, and the client never finds its own request still holding the
/// key); a streamed one keeps the lock past the head, until its end.
#[actix_web::test]
async fn an_in_memory_body_is_released_before_the_head_and_a_stream_after_it() {
    use actix_web::body::{EitherBody, MessageBody};
    use actix_web::test;

    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .wrap(RedlockMiddleware::by_path().ttl(Duration::from_secs(30)))
            .route("/whole", web::get().to(|| async { "whole" }))
            .route("/stream", web::get().to(stream)),
    )
    .await;
    let holds = |body: &EitherBody<redlock_actix::LockedBody<_>>| match body {
        EitherBody::Left { body } => body.holds_lock(),
        EitherBody::Right { .. } => panic!("rejected"),
    };

    let whole = test::call_service(&app, test::TestRequest::get().uri("/whole").to_request()).await;
    assert_eq!(whole.status(), 200);
    assert!(!holds(whole.response().body()), "released before the head");
    // Released at quorum before the head: at most a minority key is left,
    // and its delete is already on its way.
    assert!(
        cluster.count_with_key("redlock:/whole") <= 1,
        "a quorum of keys released"
    );
    assert!(on_no_node(&cluster, "redlock:/whole").await, "no key left");
    assert_eq!(
        whole.response().body().size(),
        actix_web::body::BodySize::Sized(5)
    );
    assert_eq!(test::read_body(whole).await, Bytes::from("whole"));

    let streamed =
        test::call_service(&app, test::TestRequest::get().uri("/stream").to_request()).await;
    assert!(
        holds(streamed.response().body()),
        "a stream holds the lock past the head"
    );
    assert!(cluster.count_with_key(KEY) >= 2, "held on a quorum");
    let body = test::read_body(streamed).await;
    assert!(body.ends_with(b"chunk 10\n"), "{body:?}");
    // Released at quorum before the end was reported: at most a minority key
    // is left, and its delete is already on its way.
    assert!(
        cluster.count_with_key(KEY) <= 1,
        "a quorum of keys released before the end was reported"
    );
    assert!(on_no_node(&cluster, KEY).await, "no key left");
}
