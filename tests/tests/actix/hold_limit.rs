//! How long a request may hold its lock (`max_hold`, issue 37 item 8), in a
//! real actix server: a client chooses how slowly it sends its body and reads
//! the response, so without a limit one slow connection holds a path's lock
//! for as long as it likes. A middleware (and a `HeldLockConfig`) built with
//! defaults holds a lock at most 30 s; here the limit is set to 1 s (the TTL
//! stays at its default, 5 s), and a trickling request body or a response
//! body the client never reads loses the lock at the limit: the holder is
//! told, the key leaves the nodes, and another request gets the lock.

use std::convert::Infallible;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::{App, HttpRequest, HttpResponse, web};
use bytes::Bytes;
use futures_util::StreamExt;
use http::Method;
use redlock_actix::{
    HeldLock, HeldLockConfig, LockHandle, LockPolicy, LostPolicy, Redlock, RedlockMiddleware,
};
use redlock_core::LockOptions;
use redlock_tests::Cluster;
use redlock_tests::http::send_retrying_busy;
use redlock_tests::http_timing::busy_retries;
use redlock_tests::slow::{stall_after_head, trickle};

/// The limit the behaviour tests set.
const LIMIT: Duration = Duration::from_secs(1);
/// How much later than the start another request may get the lock, or the
/// holder be told of its loss: a liveness bound of the limit and the loss
/// margin. Without the limit, the lock is held while the trickler sends (see
/// [`TRICKLE`]), which the bound must stay below to tell them apart.
fn limit_bound() -> Duration {
    let bound = liveness(LIMIT + NODE_TIMEOUT);
    assert!(
        bound < TRICKLE,
        "{bound:?} does not tell the limit from the trickle"
    );
    bound
}
/// How long the tricklers send: 50 bytes, one every 200 ms.
const TRICKLE: Duration = Duration::from_secs(10);
/// The handles' node timeout, which is also their loss margin: generous, so
/// that a first connection made on a loaded machine does not fail the
/// acquire.
const NODE_TIMEOUT: Duration = Duration::from_millis(300);
/// The documented default.
const DEFAULT_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_middleware_built_with_defaults_holds_a_lock_at_most_30_s() {
    let limit = |p: &LockPolicy| p.lock_options().hold_limit();
    assert_eq!(
        limit(RedlockMiddleware::by_path().lock_policy()),
        Some(DEFAULT_LIMIT)
    );
    assert_eq!(
        limit(HeldLockConfig::new().lock_policy()),
        Some(DEFAULT_LIMIT)
    );
    // Options without a cap of their own keep the policy's.
    let with_options =
        RedlockMiddleware::by_path().options(LockOptions::new(Duration::from_secs(2)));
    assert_eq!(limit(with_options.lock_policy()), Some(DEFAULT_LIMIT));
    let opted_out = RedlockMiddleware::by_path().max_hold(Duration::MAX);
    assert_eq!(limit(opted_out.lock_policy()), Some(Duration::MAX));
}

/// A handle over `cluster` with [`NODE_TIMEOUT`].
fn redlock_for(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// What the handlers leave for the test.
#[derive(Default)]
struct Seen {
    handle: Mutex<Option<LockHandle>>,
    /// When the handler's `lost()` completed, and what `is_lost()` said then.
    lost: Mutex<Option<(Instant, bool)>>,
    finished: Mutex<bool>,
}

/// Under `LostPolicy::Signal`: reads the body while watching the lock, notes
/// the loss, and goes on reading.
async fn watched_order(
    seen: web::Data<Seen>,
    lock: web::ReqData<LockHandle>,
    mut body: web::Payload,
) -> &'static str {
    let lost = lock.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            () = &mut lost => break,
            chunk = body.next() => if chunk.is_none() {
                return "read before the loss";
            },
        }
    }
    *seen.lost.lock().unwrap() = Some((Instant::now(), lock.is_lost()));
    // Bounded by the connection: the trickler stops and closes.
    while let Some(Ok(_)) = body.next().await {}
    *seen.finished.lock().unwrap() = true;
    "read after the loss"
}

/// A large streamed body, or a short one for `?probe`.
async fn download(
    req: HttpRequest,
    seen: web::Data<Seen>,
    lock: web::ReqData<LockHandle>,
) -> HttpResponse {
    if req.query_string() == "probe" {
        return HttpResponse::Ok().body("probe");
    }
    *seen.handle.lock().unwrap() = Some(lock.into_inner());
    // 256 MiB in 64 KiB chunks: far more than the socket buffers hold.
    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
    let chunks =
        futures_util::stream::iter((0..4096).map(move |_| Ok::<_, Infallible>(chunk.clone())));
    HttpResponse::Ok().streaming(chunks)
}

/// Answers whether the extracted lock is lost once the whole body is in.
async fn held_order(lock: HeldLock, body: web::Bytes) -> String {
    format!("read {} bytes, is_lost={}", body.len(), lock.is_lost())
}

fn app(
    redlock: Redlock,
    seen: web::Data<Seen>,
    middleware: RedlockMiddleware,
) -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .app_data(redlock)
        .app_data(seen)
        .app_data(
            HeldLockConfig::new()
                .key(|req| Some(req.path().to_owned()))
                .policy(LockPolicy::default().max_hold(LIMIT)),
        )
        .service(
            web::scope("/m")
                .wrap(middleware)
                .route(
                    "/orders/{id}",
                    web::post()
                        .to(|body: web::Bytes| async move { format!("read {} bytes", body.len()) }),
                )
                .route("/watched/{id}", web::post().to(watched_order))
                .route("/download", web::get().to(download)),
        )
        .route("/held/{id}", web::post().to(held_order))
}

/// Sends `method url` until it is not answered 409, 50 ms apart, for as long
/// as [`limit_bound`] (the lock is taken from its holder by then); returns
/// the last reply.
async fn until_not_busy(method: Method, url: &str) -> Reply {
    let pause = ms(50);
    let retries = busy_retries(limit_bound(), pause);
    let (reply, _) = send_retrying_busy(&client(), method, url, &[], "x", retries, pause)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    reply
}

#[actix_web::test]
async fn a_trickling_request_body_loses_its_lock_at_max_hold() {
    let cluster = Cluster::start(3);
    let (redlock, seen) = (redlock_for(&cluster), web::Data::new(Seen::default()));
    let server = serve!(1, move || app(
        redlock.clone(),
        seen.clone(),
        RedlockMiddleware::by_path().max_hold(LIMIT)
    ));

    let started = Instant::now();
    let trickler = trickle(server.addr, "/m/orders/42", 1000, ms(200), 50);
    assert!(
        on_every_node(&cluster, "redlock:/m/orders/42").await,
        "the trickling request holds the lock"
    );
    let reply = until_not_busy(Method::POST, &server.url("/m/orders/42")).await;
    let took = started.elapsed();
    eprintln!("another request got the lock {took:?} after the start (limit {LIMIT:?})");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        took <= limit_bound(),
        "another request got the lock {took:?} after the trickling one started \
         (limit {LIMIT:?})"
    );
    let trickled = within(liveness(TRICKLE), "trickler", trickler)
        .await
        .unwrap();
    assert_eq!(
        trickled.status(),
        Some(503),
        "the trickler is told its lock was lost: {trickled:?}"
    );
    assert!(trickled.sent < 50, "{trickled:?}");
}

#[actix_web::test]
async fn the_handler_is_told_at_max_hold_and_the_key_leaves_the_nodes() {
    let cluster = Cluster::start(3);
    let (redlock, seen) = (redlock_for(&cluster), web::Data::new(Seen::default()));
    let shared = seen.clone();
    let server = serve!(1, move || app(
        redlock.clone(),
        shared.clone(),
        RedlockMiddleware::by_path()
            .max_hold(LIMIT)
            .on_lost(LostPolicy::Signal)
    ));

    let started = Instant::now();
    let trickler = trickle(server.addr, "/m/watched/7", 1000, ms(200), 25);
    assert!(
        on_every_node(&cluster, "redlock:/m/watched/7").await,
        "the trickling request holds the lock"
    );
    assert!(
        eventually(limit_bound(), || seen.lost.lock().unwrap().is_some()).await,
        "the handler was not told of the loss {:?} after the start",
        limit_bound()
    );
    let (lost_at, is_lost) = seen.lost.lock().unwrap().unwrap();
    let lost_after = lost_at - started;
    eprintln!("the handler was told of the loss {lost_after:?} after the start");
    assert!(is_lost, "lost() completed but is_lost() is false");
    // The last renewals shorten the keys to expire at the limit, and the
    // holder is told a loss margin (the node timeout) and the drift earlier.
    assert!(
        lost_after >= LIMIT - NODE_TIMEOUT - ms(50) && lost_after <= limit_bound(),
        "told of the loss {lost_after:?} after the start (limit {LIMIT:?})"
    );
    // The handler reads on (the policy only signals), yet its key is gone.
    assert!(
        eventually(timing::settle(NODE_TIMEOUT), || cluster
            .count_with_key("redlock:/m/watched/7")
            == 0)
        .await,
        "the key outlived the limit on some node"
    );
    assert!(!*seen.finished.lock().unwrap(), "the handler still runs");
    let reply = until_not_busy(Method::POST, &server.url("/m/watched/7")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    drop(within(liveness(TRICKLE), "trickler", trickler).await);
}

#[actix_web::test]
async fn a_response_body_the_client_never_reads_loses_its_lock_at_max_hold() {
    let cluster = Cluster::start(3);
    let (redlock, seen) = (redlock_for(&cluster), web::Data::new(Seen::default()));
    let shared = seen.clone();
    let server = serve!(1, move || app(
        redlock.clone(),
        shared.clone(),
        RedlockMiddleware::by_path().max_hold(LIMIT)
    ));

    let started = Instant::now();
    let (stalled, head) = stall_after_head(server.addr, "/m/download").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let reply = until_not_busy(Method::GET, &server.url("/m/download?probe")).await;
    let took = started.elapsed();
    eprintln!("another request got the lock {took:?} after the start (limit {LIMIT:?})");
    assert_eq!(
        (reply.status.as_u16(), reply.text().as_str()),
        (200, "probe")
    );
    assert!(
        took <= limit_bound(),
        "another request got the lock {took:?} after the stalled one started \
         (limit {LIMIT:?})"
    );
    let handle = seen.handle.lock().unwrap().clone().unwrap();
    assert!(handle.is_lost(), "the stalled holder's view says held");
    drop(stalled);
}

#[actix_web::test]
async fn a_held_lock_extracted_before_a_trickling_body_is_lost_at_max_hold() {
    let cluster = Cluster::start(3);
    let (redlock, seen) = (redlock_for(&cluster), web::Data::new(Seen::default()));
    let server = serve!(1, move || app(
        redlock.clone(),
        seen.clone(),
        RedlockMiddleware::by_path()
    ));

    // 50 bytes, 200 ms apart: the body is in 10 s after the start.
    let started = Instant::now();
    let trickler = trickle(server.addr, "/held/9", 50, ms(200), 50);
    assert!(
        on_every_node(&cluster, "redlock:/held/9").await,
        "the extracted lock is held while the body trickles"
    );
    let reply = until_not_busy(Method::POST, &server.url("/held/9")).await;
    let took = started.elapsed();
    eprintln!("another request got the lock {took:?} after the start (limit {LIMIT:?})");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        took <= limit_bound(),
        "another request got the lock {took:?} after the trickling one started \
         (limit {LIMIT:?})"
    );
    let trickled = within(liveness(TRICKLE), "trickler", trickler)
        .await
        .unwrap();
    assert_eq!(trickled.status(), Some(200), "{trickled:?}");
    assert!(
        trickled.answer.contains("read 50 bytes, is_lost=true"),
        "the handler's HeldLock says held past the limit: {trickled:?}"
    );
}
