//! A lock lost while the handler runs (its key deleted on 2 of 3 nodes): by
//! default the handler's future is dropped before the validity it had ends and
//! the client gets 503; with `LostPolicy::Signal` the handler sees `is_lost()` and
//! its own response is sent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use redlock_core::LockHandle;
use redlock_tests::Cluster;
use redlock_tower::{LostPolicy, RedlockLayer};

/// Long enough that the patient handle renews it (a renewal needs two node
/// timeouts of validity).
const TTL: Duration = PATIENT_NODE_TIMEOUT.saturating_mul(4);
const KEY: &str = "redlock:/work";

/// What the handler leaves behind for the test.
#[derive(Default)]
struct Seen {
    handle: Mutex<Option<LockHandle>>,
    dropped_at: Arc<Mutex<Option<Instant>>>,
    finished: Mutex<bool>,
    lost_seen_at: Mutex<Option<Instant>>,
}

/// Publishes its lock handle, then works for longer than any bound of the
/// tests unless dropped.
async fn long_work(
    State(seen): State<Arc<Seen>>,
    Extension(lock): Extension<LockHandle>,
) -> &'static str {
    let _recorder = DropRecorder(seen.dropped_at.clone());
    *seen.handle.lock().unwrap() = Some(lock);
    tokio::time::sleep(liveness(TTL) * 2).await;
    *seen.finished.lock().unwrap() = true;
    "finished"
}

/// Starts one request and waits until its handler runs under the lock; returns
/// the request's task and the handler's lock handle.
async fn start_and_wait_for_handler(
    server: &Server,
    cluster: &Cluster,
    seen: &Seen,
) -> (tokio::task::JoinHandle<Reply>, LockHandle) {
    let request = tokio::spawn({
        let url = server.url("/work");
        async move { http_get(&client(), &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || seen
            .handle
            .lock()
            .unwrap()
            .is_some())
        .await,
        "the handler never ran"
    );
    // The lock holds: a quorum has the key (every node is not promised to a
    // test with a short node timeout on a loaded machine).
    let holding = cluster.settled_count(KEY, cluster.len()).await;
    assert!(holding >= 2, "the lock is on a quorum: {holding} of 3");
    let handle = seen.handle.lock().unwrap().clone().unwrap();
    (request, handle)
}

/// Deletes the lock's key on nodes 0 and 1: the holder keeps only a minority.
fn steal_majority(cluster: &Cluster) {
    for i in 0..2 {
        cluster.node(i).cmd(&["DEL", KEY]);
    }
    assert_eq!(cluster.count_with_key(KEY), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_drops_the_handler_before_its_validity_ends_and_answers_503() {
    let cluster = Cluster::start(3);
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route("/work", get(long_work))
        .with_state(seen.clone())
        .layer(RedlockLayer::by_path().ttl(TTL))
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let (request, handle) = start_and_wait_for_handler(&server, &cluster, &seen).await;
    steal_majority(&cluster);
    // No renewal can succeed from here on, so this deadline is final.
    let valid_until = handle.valid_until();
    assert!(valid_until > Instant::now(), "validity already over");

    let reply = within(liveness(TTL), "the 503", request).await.unwrap();
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert!(reply.retry_after().is_some_and(|s| s >= 1));
    let doc = reply.json();
    assert_eq!(doc["status"], 503, "{doc}");
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
        !*seen.finished.lock().unwrap(),
        "the handler must not finish"
    );
    assert!(handle.is_lost());
    assert!(
        on_no_node(&cluster, KEY).await,
        "the remaining key is released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_mode_lets_the_handler_see_the_loss_and_send_its_own_response() {
    let cluster = Cluster::start(3);
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route(
            "/work",
            get(
                |State(seen): State<Arc<Seen>>, Extension(lock): Extension<LockHandle>| async move {
                    *seen.handle.lock().unwrap() = Some(lock.clone());
                    let started = Instant::now();
                    // Poll the flag every 20 ms, within a liveness bound.
                    while started.elapsed() < liveness(TTL) {
                        if lock.is_lost() {
                            *seen.lost_seen_at.lock().unwrap() = Some(Instant::now());
                            return (
                                StatusCode::OK,
                                format!("saw loss after {:?}", started.elapsed()),
                            );
                        }
                        tokio::time::sleep(ms(20)).await;
                    }
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "never saw the loss".to_owned(),
                    )
                },
            ),
        )
        .with_state(seen.clone())
        .layer(RedlockLayer::by_path().ttl(TTL).on_lost(LostPolicy::Signal))
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let (request, handle) = start_and_wait_for_handler(&server, &cluster, &seen).await;
    steal_majority(&cluster);
    let valid_until = handle.valid_until();

    let reply = within(answered(TTL), "the response", request)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(reply.text().starts_with("saw loss"), "{}", reply.text());
    let lost_seen_at = seen.lost_seen_at.lock().unwrap().unwrap();
    assert!(
        lost_seen_at < valid_until,
        "the failed renewal must signal the loss before the validity ends (seen {:?} late)",
        lost_seen_at - valid_until
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_renewing_and_aborts_the_handler_when_the_last_validity_ends() {
    let cluster = Cluster::start(3);
    let ttl = ms(300);
    let max_hold = ms(900);
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route("/work", get(long_work))
        .with_state(seen.clone())
        .layer(RedlockLayer::by_path().ttl(ttl).max_hold(max_hold))
        .layer(Extension(short_ttl_redlock(&cluster)));
    let server = Server::start(app).await;

    let (request, _handle) = start_and_wait_for_handler(&server, &cluster, &seen).await;
    let started = Instant::now();
    let reply = within(liveness(max_hold + ttl), "the 503", request)
        .await
        .unwrap();
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    let held = seen
        .dropped_at
        .lock()
        .unwrap()
        .expect("the handler's future must be dropped")
        - started;
    // The holder is told at its last validity less the loss margin (the node
    // timeout): not before (safety); and within a liveness bound after.
    let margin = short_ttl_redlock(&cluster).node_timeout();
    assert!(
        held >= max_hold - ttl - margin && held <= liveness(max_hold + ttl),
        "handler dropped {held:?} after it started; max_hold {max_hold:?}, ttl {ttl:?}"
    );
    assert!(!*seen.finished.lock().unwrap());
}
