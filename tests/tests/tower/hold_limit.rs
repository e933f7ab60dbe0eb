//! How long a request may hold its lock (`max_hold`, issue 37 item 8): a
//! client chooses how slowly it sends its body and reads the response, so
//! without a limit one slow connection holds a path's lock for as long as it
//! likes. A layer built with defaults holds a lock at most 30 s; here the
//! limit is set to 1 s (the TTL stays at its default, 5 s), and a trickling
//! request body or a response body the client never reads loses the lock at
//! the limit: the holder is told, the key leaves the nodes, and another
//! request gets the lock.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Method, Uri};
use redlock_core::{LockHandle, LockOptions};
use redlock_tests::Cluster;
use redlock_tests::http::send_retrying_busy;
use redlock_tests::http_timing::busy_retries;
use redlock_tests::slow::{stall_after_head, trickle};
use redlock_tower::{Held, LostPolicy, RedlockLayer};

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
fn a_layer_built_with_defaults_holds_a_lock_at_most_30_s() {
    let layer = RedlockLayer::by_path();
    assert_eq!(
        layer.lock_policy().lock_options().hold_limit(),
        Some(DEFAULT_LIMIT)
    );
    // Options without a cap of their own keep the policy's.
    let with_options = RedlockLayer::by_path().options(LockOptions::new(Duration::from_secs(2)));
    assert_eq!(
        with_options.lock_policy().lock_options().hold_limit(),
        Some(DEFAULT_LIMIT)
    );
    let opted_out = RedlockLayer::by_path().max_hold(Duration::MAX);
    assert_eq!(
        opted_out.lock_policy().lock_options().hold_limit(),
        Some(Duration::MAX)
    );
}

/// What the handlers leave for the test.
#[derive(Default)]
struct Seen {
    handle: Mutex<Option<LockHandle>>,
    /// When the handler's `lost()` completed, and what `is_lost()` said then.
    lost: Mutex<Option<(Instant, bool)>>,
    finished: Mutex<bool>,
}

/// Reads the whole body (the probe's is one byte, the trickler's never ends).
async fn order(body: Bytes) -> String {
    format!("read {} bytes", body.len())
}

/// Under `LostPolicy::Signal`: reads the body while watching the lock, notes
/// the loss, and goes on reading.
async fn watched_order(
    State(seen): State<Arc<Seen>>,
    Held(lock): Held,
    body: Body,
) -> &'static str {
    let read = axum::body::to_bytes(body, 1 << 16);
    tokio::pin!(read);
    tokio::select! {
        _ = lock.lost() => {
            *seen.lost.lock().unwrap() = Some((Instant::now(), lock.is_lost()));
        }
        _ = &mut read => return "read before the loss",
    }
    let _ = read.await;
    *seen.finished.lock().unwrap() = true;
    "read after the loss"
}

/// A large streamed body, or a short one for `?probe`.
async fn download(
    State(seen): State<Arc<Seen>>,
    Extension(lock): Extension<LockHandle>,
    uri: Uri,
) -> Body {
    if uri.query() == Some("probe") {
        return Body::from("probe");
    }
    *seen.handle.lock().unwrap() = Some(lock);
    // 256 MiB in 64 KiB chunks: far more than the socket buffers hold.
    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
    let chunks =
        futures_util::stream::iter((0..4096).map(move |_| Ok::<_, Infallible>(chunk.clone())));
    Body::from_stream(chunks)
}

fn app(cluster: &Cluster, layer: RedlockLayer) -> (Router, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let router = Router::new()
        .route("/orders/{id}", post(order))
        .route("/watched/{id}", post(watched_order))
        .route("/download", get(download))
        .with_state(seen.clone())
        .layer(layer)
        .layer(Extension(redlock_with_timeout(cluster, NODE_TIMEOUT)));
    (router, seen)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_request_body_loses_its_lock_at_max_hold() {
    let cluster = Cluster::start(3);
    let (app, _) = app(&cluster, RedlockLayer::by_path().max_hold(LIMIT));
    let server = Server::start(app).await;

    let started = Instant::now();
    let trickler = trickle(server.addr, "/orders/42", 1000, ms(200), 50);
    assert!(
        on_every_node(&cluster, "redlock:/orders/42").await,
        "the trickling request holds the lock"
    );
    let reply = until_not_busy(Method::POST, &server.url("/orders/42")).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_is_told_at_max_hold_and_the_key_leaves_the_nodes() {
    let cluster = Cluster::start(3);
    let (app, seen) = app(
        &cluster,
        RedlockLayer::by_path()
            .max_hold(LIMIT)
            .on_lost(LostPolicy::Signal),
    );
    let server = Server::start(app).await;

    let started = Instant::now();
    let trickler = trickle(server.addr, "/watched/7", 1000, ms(200), 25);
    assert!(
        on_every_node(&cluster, "redlock:/watched/7").await,
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
            .count_with_key("redlock:/watched/7")
            == 0)
        .await,
        "the key outlived the limit on some node"
    );
    assert!(!*seen.finished.lock().unwrap(), "the handler still runs");
    let reply = until_not_busy(Method::POST, &server.url("/watched/7")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    drop(within(liveness(TRICKLE), "trickler", trickler).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_the_client_never_reads_loses_its_lock_at_max_hold() {
    let cluster = Cluster::start(3);
    let (app, seen) = app(&cluster, RedlockLayer::by_path().max_hold(LIMIT));
    let server = Server::start(app).await;

    let started = Instant::now();
    let (stalled, head) = stall_after_head(server.addr, "/download").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let reply = until_not_busy(Method::GET, &server.url("/download?probe")).await;
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
