//! The idempotency middleware's response body under its lock (issue 37,
//! item 11), the twin of the tower suite: a body is produced under the lock
//! and its loss watch, and is recorded as completed only once it has ended
//! well.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpResponse, web};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use redlock_actix::idempotency::{IdempotencyMiddleware, IdempotencyPolicy};
use redlock_core::Redlock;
use redlock_core::request::LostPolicy;
use redlock_tests::Cluster;
use redlock_tests::http::{receive, send, send_retrying_busy};
use tokio::sync::mpsc;

use crate::common::{Server, answered, client, ms, short_ttl_redlock, timing, within};
use redlock_tests::http_timing::busy_retries;

type Chunk = Result<Bytes, std::io::Error>;

/// The first run's body, over the 8-byte cap from its first chunk: what the
/// test sends on the channel. Later runs answer `paid #n` whole.
fn server(
    redlock: Redlock,
    policy: IdempotencyPolicy,
    runs: Arc<AtomicUsize>,
    first: mpsc::UnboundedReceiver<Chunk>,
) -> Server {
    let first = Arc::new(Mutex::new(Some(first)));
    let policy = policy.max_response_body(8);
    serve!(move || {
        let (runs, first) = (Arc::clone(&runs), Arc::clone(&first));
        App::new()
            .wrap(IdempotencyMiddleware::new(redlock.clone()).policy(policy.clone()))
            .route(
                "/pay",
                web::post().to(move || {
                    let runs = Arc::clone(&runs);
                    let first = first.lock().unwrap().take();
                    async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        match first {
                            Some(rx) => {
                                let chunks =
                                    futures_util::stream::unfold(rx, |mut rx| async move {
                                        rx.recv().await.map(|c| (c, rx))
                                    });
                                HttpResponse::Created().streaming(chunks)
                            }
                            None => HttpResponse::Created().body(format!("paid #{n}")),
                        }
                    }
                }),
            )
    })
}

/// Sends the first request and waits for its head: the body streams on.
async fn open_pay(server: &Server, key: &str) -> http::Response<hyper::body::Incoming> {
    let req = Request::post(server.url("/pay"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let client = client();
    within(
        answered(Duration::ZERO),
        "the first response's head",
        async move { client.request(req).await.unwrap() },
    )
    .await
}

const OVER_CAP: &[u8] = b"0123456789abcdef";

/// A body over the cap that fails midway records nothing: the next request
/// with the key runs the handler again, not a 410.
#[actix_web::test]
async fn a_body_that_fails_midway_is_not_recorded_and_the_key_runs_again() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let server = server(
        cluster.patient_redlock(),
        IdempotencyPolicy::default(),
        Arc::clone(&runs),
        rx,
    );
    tx.send(Ok(Bytes::from_static(OVER_CAP))).unwrap();
    let first = open_pay(&server, "\"fails-midway\"").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    tx.send(Err(std::io::Error::other("disk gone"))).unwrap();
    let received = receive(first.into_body()).await;
    assert!(received.error.is_some(), "the failed body ended cleanly");
    let (next, _) = send_retrying_busy(
        &client(),
        Method::POST,
        &server.url("/pay"),
        &[("idempotency-key", "\"fails-midway\"")],
        "x",
        busy_retries(timing::settled(), ms(50)),
        ms(50),
    )
    .await
    .unwrap();
    assert_eq!(
        (next.status, next.text().as_str()),
        (StatusCode::CREATED, "paid #2"),
        "the key was not run again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The lock lost while an over-cap body streams (renewal stops after 200 ms,
/// the last chunk comes 1.5 s later): the body is cut off and nothing is
/// recorded, so the next request runs the work.
#[actix_web::test]
async fn a_body_still_streaming_when_the_lock_is_lost_is_not_recorded() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let policy = IdempotencyPolicy::default()
        .lock(|l| l.ttl(ms(500)).max_hold(ms(200)).on_lost(LostPolicy::Abort));
    // The TTL is the subject: the short node timeout.
    let server = server(short_ttl_redlock(&cluster), policy, Arc::clone(&runs), rx);
    tx.send(Ok(Bytes::from_static(OVER_CAP))).unwrap();
    let first = open_pay(&server, "\"lost-midway\"").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let sender = actix_web::rt::spawn(async move {
        actix_web::rt::time::sleep(ms(1500)).await;
        let _ = tx.send(Ok(Bytes::from_static(b"end")));
    });
    let received = receive(first.into_body()).await;
    assert!(
        received.error.is_some(),
        "the body was not cut off at the loss: {:?}",
        received.text
    );
    let (next, _) = send_retrying_busy(
        &client(),
        Method::POST,
        &server.url("/pay"),
        &[("idempotency-key", "\"lost-midway\"")],
        "x",
        busy_retries(timing::settled(), ms(50)),
        ms(50),
    )
    .await
    .unwrap();
    assert_eq!(
        (next.status, next.text().as_str()),
        (StatusCode::CREATED, "paid #2"),
        "recorded as completed"
    );
    sender.await.unwrap();
}

/// An over-cap body holds the lock until it has streamed: a copy that comes
/// meanwhile is busy (409), not told "completed" (410); once the body has
/// ended, the key is completed, not replayable, and the work does not run
/// again.
#[actix_web::test]
async fn an_oversize_body_holds_the_lock_until_it_has_streamed() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let server = server(
        cluster.patient_redlock(),
        IdempotencyPolicy::default(),
        Arc::clone(&runs),
        rx,
    );
    let key = [("idempotency-key", "\"big-stream\"")];
    tx.send(Ok(Bytes::from_static(OVER_CAP))).unwrap();
    let first = open_pay(&server, key[0].1).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let during = send(&client(), Method::POST, &server.url("/pay"), &key, "x")
        .await
        .unwrap();
    assert_eq!(
        during.status,
        StatusCode::CONFLICT,
        "while the body streams: {}",
        during.text()
    );
    tx.send(Ok(Bytes::from_static(b"-end"))).unwrap();
    drop(tx);
    let received = receive(first.into_body()).await;
    assert_eq!(received.error, None);
    assert_eq!(received.text, "0123456789abcdef-end");
    let (after, _) = send_retrying_busy(
        &client(),
        Method::POST,
        &server.url("/pay"),
        &key,
        "x",
        busy_retries(timing::settled(), ms(50)),
        ms(50),
    )
    .await
    .unwrap();
    assert_eq!(after.status, StatusCode::GONE, "{}", after.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run again");
}
