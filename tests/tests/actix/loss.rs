//! Losing and leaving a lock in a real actix server. A lock lost while the
//! handler runs (its key deleted on 2 of 3 nodes): by default the handler future
//! is dropped before the validity it had ends and the client gets 503; with
//! `LostPolicy::Signal` the handler sees `is_lost()` and answers itself. A
//! handler that panics or returns an error, and a client that disconnects
//! (during the handler or during a streamed body), leave the lock released
//! within 2 s, far sooner than its TTL.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{App, HttpResponse, web};
use bytes::Bytes;
use redlock_actix::{LockHandle, LostPolicy, Redlock, RedlockMiddleware};
use redlock_tests::Cluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Long enough that the patient handle renews it (a renewal needs two node
/// timeouts of validity).
const TTL: Duration = PATIENT_NODE_TIMEOUT.saturating_mul(4);

/// How long a release may take to land everywhere: a liveness bound.
fn release_bound() -> Duration {
    timing::settled()
}

/// Long enough that a release within [`release_bound`] cannot be an expiry.
fn long_ttl() -> Duration {
    release_bound() * 3
}
const KEY: &str = "redlock:/work";

/// What the handler leaves behind for the test.
#[derive(Default)]
struct Seen {
    handle: Mutex<Option<LockHandle>>,
    dropped_at: Arc<Mutex<Option<Instant>>>,
    finished: AtomicBool,
    lost_seen_at: Mutex<Option<Instant>>,
}

impl Seen {
    fn handle(&self) -> Option<LockHandle> {
        self.handle.lock().unwrap().clone()
    }
}

/// Publishes its lock handle, then works for longer than any bound of the
/// tests unless dropped.
async fn long_work(seen: web::Data<Seen>, lock: web::ReqData<LockHandle>) -> &'static str {
    let _recorder = DropRecorder(seen.dropped_at.clone());
    *seen.handle.lock().unwrap() = Some(lock.into_inner());
    actix_web::rt::time::sleep(liveness(TTL) * 2).await;
    seen.finished.store(true, Ordering::SeqCst);
    "finished"
}

/// Polls `is_lost()` every 20 ms, within a liveness bound of the TTL, and
/// answers what it saw.
async fn watchful_work(seen: web::Data<Seen>, lock: web::ReqData<LockHandle>) -> HttpResponse {
    *seen.handle.lock().unwrap() = Some(LockHandle::clone(&lock));
    let started = Instant::now();
    while started.elapsed() < liveness(TTL) {
        if lock.is_lost() {
            *seen.lost_seen_at.lock().unwrap() = Some(Instant::now());
            return HttpResponse::Ok().body(format!("saw loss after {:?}", started.elapsed()));
        }
        actix_web::rt::time::sleep(ms(20)).await;
    }
    HttpResponse::InternalServerError().body("never saw the loss")
}

/// A server with `/work` behind `middleware`, sharing `seen` with the handler.
fn work_server<F, Fut>(
    cluster: &Cluster,
    middleware: RedlockMiddleware,
    seen: &web::Data<Seen>,
    handler: F,
) -> Server
where
    F: actix_web::Handler<(web::Data<Seen>, web::ReqData<LockHandle>), Output = Fut> + Clone + Send,
    Fut: actix_web::Responder + 'static,
{
    let (redlock, seen) = (cluster.patient_redlock(), seen.clone());
    serve!(move || {
        App::new()
            .app_data(redlock.clone())
            .app_data(seen.clone())
            .wrap(middleware.clone())
            .route("/work", web::get().to(handler.clone()))
    })
}

/// Starts `GET /work` and waits until its handler runs under the lock; returns
/// the request's task and the handler's lock handle.
async fn start_and_wait_for_handler(
    server: &Server,
    cluster: &Cluster,
    seen: &Seen,
) -> (tokio::task::JoinHandle<Reply>, LockHandle) {
    let request = actix_web::rt::spawn({
        let url = server.url("/work");
        async move { get(&client(), &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || seen.handle().is_some()).await,
        "the handler never ran"
    );
    // The acquire is decided at a quorum; the third `SET` may still be on
    // its way when the handler starts.
    assert!(
        on_every_node(cluster, KEY).await,
        "the lock is on every node"
    );
    (request, seen.handle().unwrap())
}

/// Deletes the lock's key on nodes 0 and 1: the holder keeps only a minority.
fn steal_majority(cluster: &Cluster) {
    for i in 0..2 {
        cluster.node(i).cmd(&["DEL", KEY]);
    }
    assert_eq!(cluster.count_with_key(KEY), 1);
}

#[actix_web::test]
async fn lost_lock_drops_the_handler_before_its_validity_ends_and_answers_503() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let server = work_server(
        &cluster,
        RedlockMiddleware::by_path().ttl(TTL),
        &seen,
        long_work,
    );

    let (request, handle) = start_and_wait_for_handler(&server, &cluster, &seen).await;
    steal_majority(&cluster);
    // No renewal can succeed from here on, so this deadline is final.
    let valid_until = handle.valid_until();
    assert!(valid_until > Instant::now(), "validity already over");

    let reply = within(liveness(TTL), "the 503", request).await.unwrap();
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert!(reply.retry_after().is_some_and(|s| s >= 1), "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let doc = reply.json();
    assert_eq!(doc["status"], 503, "{doc}");
    assert_eq!(doc["title"], "Lock lost", "{doc}");
    assert_eq!(doc["key"], KEY, "{doc}");

    let dropped_at = seen
        .dropped_at
        .lock()
        .unwrap()
        .expect("the handler's future must be dropped");
    assert!(
        dropped_at < valid_until,
        "handler dropped {:?} after its validity ended",
        dropped_at - valid_until
    );
    assert!(
        !seen.finished.load(Ordering::SeqCst),
        "the handler must not finish"
    );
    assert!(handle.is_lost());
    assert!(
        eventually(release_bound(), || cluster.count_with_key(KEY) == 0).await,
        "the remaining key is released"
    );
}

#[actix_web::test]
async fn signal_mode_lets_the_handler_see_the_loss_and_send_its_own_response() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let middleware = RedlockMiddleware::by_path()
        .ttl(TTL)
        .on_lost(LostPolicy::Signal);
    let server = work_server(&cluster, middleware, &seen, watchful_work);

    let (request, handle) = start_and_wait_for_handler(&server, &cluster, &seen).await;
    steal_majority(&cluster);
    let valid_until = handle.valid_until();

    let reply = within(answered(TTL), "the response", request)
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().starts_with("saw loss"), "{}", reply.text());
    let lost_seen_at = seen.lost_seen_at.lock().unwrap().unwrap();
    assert!(
        lost_seen_at < valid_until,
        "the failed renewal must signal the loss before the validity ends (seen {:?} late)",
        lost_seen_at - valid_until
    );
}

/// The app of the ending tests: every handler runs under a lock with a
/// [`long_ttl`] and publishes its handle; `/panic` panics, `/fail` returns an
/// error, `/slow` sleeps a [`long_ttl`] and `/short` 1 s (recording a drop and
/// its end), and `/stream` streams a chunk every 100 ms for 100 s.
fn ending_app(
    redlock: Redlock,
    seen: web::Data<Seen>,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    fn publish(seen: &Seen, lock: web::ReqData<LockHandle>) {
        *seen.handle.lock().unwrap() = Some(lock.into_inner());
    }
    async fn sleep_for(seen: &Seen, how_long: Duration) -> &'static str {
        let _recorder = DropRecorder(seen.dropped_at.clone());
        actix_web::rt::time::sleep(how_long).await;
        seen.finished.store(true, Ordering::SeqCst);
        "finished"
    }
    App::new()
        .app_data(redlock)
        .app_data(seen)
        .wrap(RedlockMiddleware::by_path().ttl(long_ttl()))
        .route(
            "/panic",
            web::get().to(
                |seen: web::Data<Seen>, lock: web::ReqData<LockHandle>| async move {
                    publish(&seen, lock);
                    if !seen.finished.load(Ordering::SeqCst) {
                        panic!("the handler blew up");
                    }
                    "unreachable"
                },
            ),
        )
        .route(
            "/fail",
            web::get().to(
                |seen: web::Data<Seen>, lock: web::ReqData<LockHandle>| async move {
                    publish(&seen, lock);
                    Err::<&str, _>(actix_web::error::ErrorInternalServerError(
                        "the handler failed",
                    ))
                },
            ),
        )
        .route(
            "/slow",
            web::get().to(
                |seen: web::Data<Seen>, lock: web::ReqData<LockHandle>| async move {
                    publish(&seen, lock);
                    sleep_for(&seen, long_ttl()).await
                },
            ),
        )
        .route(
            "/short",
            web::get().to(
                |seen: web::Data<Seen>, lock: web::ReqData<LockHandle>| async move {
                    publish(&seen, lock);
                    sleep_for(&seen, Duration::from_secs(1)).await
                },
            ),
        )
        .route(
            "/stream",
            web::get().to(
                |seen: web::Data<Seen>, lock: web::ReqData<LockHandle>| async move {
                    publish(&seen, lock);
                    let chunks = futures_util::stream::unfold(0u32, |i| async move {
                        if i >= 1000 {
                            return None;
                        }
                        if i > 0 {
                            actix_web::rt::time::sleep(ms(100)).await;
                        }
                        Some((
                            Ok::<_, Infallible>(Bytes::from(format!("chunk {i}\n"))),
                            i + 1,
                        ))
                    });
                    HttpResponse::Ok().streaming(chunks)
                },
            ),
        )
}

/// Waits until the handler of `path` holds its lock on all nodes.
async fn wait_for_lock(cluster: &Cluster, seen: &Seen, key: &str) {
    assert!(
        eventually(answered(Duration::ZERO), || seen.handle().is_some()
            && cluster.count_with_key(key) == 3)
        .await,
        "the handler never held {key}"
    );
}

/// Waits until no node has `key`; returns how long that took.
async fn released(cluster: &Cluster, key: &str) -> Duration {
    let started = Instant::now();
    assert!(
        eventually(release_bound(), || cluster.count_with_key(key) == 0).await,
        "{key} still held {:?} later (its TTL is {:?})",
        release_bound(),
        long_ttl()
    );
    started.elapsed()
}

/// Connects, sends `GET path` and returns the open stream.
async fn raw_request(server: &Server, path: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

#[actix_web::test]
async fn panicking_handler_releases_the_lock() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let (redlock, shared) = (cluster.patient_redlock(), seen.clone());
    let server = serve!(1, move || ending_app(redlock.clone(), shared.clone()));
    let client = client();

    let outcome = try_get(&client, &server.url("/panic"), &[]).await;
    let key = "redlock:/panic";
    assert!(seen.handle().is_some(), "the handler ran under the lock");
    assert!(
        !matches!(&outcome, Ok(reply) if reply.status == 200),
        "a panicking handler cannot answer 200: {outcome:?}"
    );
    let took = released(&cluster, key).await;
    eprintln!("panic: client saw {outcome:?}; released after {took:?}");

    // The worker goes on serving (actix-rt catches the panic of the
    // connection's task; the lock went with that task's state).
    let after = within(
        answered(Duration::ZERO),
        "a request after the panic",
        try_get(&client, &server.url("/fail"), &[]),
    )
    .await;
    assert!(
        matches!(&after, Ok(reply) if reply.status == 500),
        "the server must still answer: {after:?}"
    );
}

#[actix_web::test]
async fn handler_returning_an_error_releases_the_lock() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let (redlock, shared) = (cluster.patient_redlock(), seen.clone());
    let server = serve!(1, move || ending_app(redlock.clone(), shared.clone()));

    let reply = get(&client(), &server.url("/fail")).await;
    assert_eq!(reply.status, 500, "{}", reply.text());
    assert!(seen.handle().is_some(), "the handler ran under the lock");
    let took = released(&cluster, "redlock:/fail").await;
    eprintln!("error: released after {took:?}");
}

#[actix_web::test]
async fn client_leaving_during_the_handler_drops_it_and_releases_when_half_close_is_off() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let (redlock, shared) = (cluster.patient_redlock(), seen.clone());
    // With half-closed connections refused, actix drops the handler as soon as
    // it reads the client's EOF.
    let server = serve!(
        1,
        move || ending_app(redlock.clone(), shared.clone()),
        .h1_allow_half_closed(false)
    );

    let stream = raw_request(&server, "/slow").await;
    wait_for_lock(&cluster, &seen, "redlock:/slow").await;
    let left_at = Instant::now();
    drop(stream);
    let took = released(&cluster, "redlock:/slow").await;
    let dropped_at = seen
        .dropped_at
        .lock()
        .unwrap()
        .expect("the handler's future must be dropped");
    assert!(
        dropped_at - left_at < release_bound(),
        "dropped {:?} after the client left",
        dropped_at - left_at
    );
    assert!(
        !seen.finished.load(Ordering::SeqCst),
        "the long handler must not finish"
    );
    eprintln!("disconnect during handler: released after {took:?}");
}

#[actix_web::test]
async fn client_leaving_during_the_handler_releases_when_it_ends_by_actix_default() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let (redlock, shared) = (cluster.patient_redlock(), seen.clone());
    let server = serve!(1, move || ending_app(redlock.clone(), shared.clone()));

    let stream = raw_request(&server, "/short").await;
    wait_for_lock(&cluster, &seen, "redlock:/short").await;
    let left_at = Instant::now();
    drop(stream);
    // actix allows half-closed connections by default: the 1 s handler runs to
    // its end, and the lock goes with the response nobody reads.
    let took = released(&cluster, "redlock:/short").await;
    assert!(
        seen.finished.load(Ordering::SeqCst),
        "by default actix lets the handler finish"
    );
    eprintln!(
        "disconnect during handler (default): released {took:?} after the client left at {:?}",
        left_at.elapsed()
    );
}

#[actix_web::test]
async fn client_leaving_during_a_streamed_body_releases_the_lock() {
    let cluster = Cluster::start(3);
    let seen = web::Data::new(Seen::default());
    let (redlock, shared) = (cluster.patient_redlock(), seen.clone());
    let server = serve!(1, move || ending_app(redlock.clone(), shared.clone()));

    let mut stream = raw_request(&server, "/stream").await;
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    // Read until the fourth chunk is in, 300 ms into the body (bounded by the
    // client timeout).
    within(CLIENT_TIMEOUT, "the fourth chunk", async {
        while !String::from_utf8_lossy(&received).contains("chunk 3") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "connection closed early: {:?}",
                String::from_utf8_lossy(&received)
            );
            received.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(String::from_utf8_lossy(&received).starts_with("HTTP/1.1 200"));
    assert!(
        on_every_node(&cluster, "redlock:/stream").await,
        "held while streaming"
    );
    drop(stream);
    // The body has ~100 s to go; the dropped connection drops it, and the lock.
    let took = released(&cluster, "redlock:/stream").await;
    eprintln!("disconnect during stream: released after {took:?}");
}
