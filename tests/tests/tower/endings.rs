//! Every way a request can end early releases its lock at once (the TTL here is
//! 30 s, so only a release explains a key gone before it): a panicking handler
//! under `axum::serve`, a client that disconnects mid-handler or mid-body, and a
//! `ResponseFuture` dropped after it took the lock. A `ResponseFuture` dropped
//! while it is still acquiring must leave no key behind either.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::Request;
use redlock_core::LockHandle;
use redlock_tests::Cluster;
use redlock_tower::RedlockLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt};

const TTL: Duration = Duration::from_secs(30);

/// The handler's side of a test: it says when it runs and when it is dropped,
/// and waits for the test's go before its last step.
#[derive(Default)]
struct Probe {
    running: Notify,
    go: Notify,
    dropped_at: Arc<Mutex<Option<Instant>>>,
}

async fn panics(State(p): State<Arc<Probe>>) -> &'static str {
    p.running.notify_one();
    p.go.notified().await;
    panic!("handler panic (expected by the test)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handler_closes_the_connection_and_releases_the_lock() {
    let cluster = Cluster::start(3);
    let probe = Arc::new(Probe::default());
    let app = Router::new()
        .route("/panics", get(panics))
        .with_state(probe.clone())
        .layer(RedlockLayer::by_path().ttl(TTL))
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let request = tokio::spawn({
        let url = server.url("/panics");
        async move { try_get(&client(), &url, &[]).await }
    });
    within(
        answered(Duration::ZERO),
        "handler start",
        probe.running.notified(),
    )
    .await;
    assert!(
        on_every_node(&cluster, "redlock:/panics").await,
        "held before the panic"
    );
    probe.go.notify_one();

    let outcome = within(answered(Duration::ZERO), "client outcome", request)
        .await
        .unwrap();
    assert!(
        outcome.is_err(),
        "the connection must close without a response: {outcome:?}"
    );
    assert!(
        on_no_node(&cluster, "redlock:/panics").await,
        "the lock outlived the panic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_handler_drops_the_handler_and_releases_the_lock() {
    let cluster = Cluster::start(3);
    let probe = Arc::new(Probe::default());
    let app = Router::new()
        .route(
            "/slow",
            get(|State(p): State<Arc<Probe>>| async move {
                let _recorder = DropRecorder(p.dropped_at.clone());
                p.running.notify_one();
                tokio::time::sleep(Duration::from_secs(20)).await;
                "finished"
            }),
        )
        .with_state(probe.clone())
        .layer(RedlockLayer::by_path().ttl(TTL))
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let mut conn = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(b"GET /slow HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    within(
        answered(Duration::ZERO),
        "handler start",
        probe.running.notified(),
    )
    .await;
    assert!(
        on_every_node(&cluster, "redlock:/slow").await,
        "held while running"
    );
    let closed_at = Instant::now();
    drop(conn);

    assert!(
        eventually(answered(Duration::ZERO), || probe
            .dropped_at
            .lock()
            .unwrap()
            .is_some())
        .await,
        "hyper must drop the handler when the client goes away"
    );
    assert!(
        on_no_node(&cluster, "redlock:/slow").await,
        "the lock outlived the client"
    );
    // Before the TTL: only the release explains the key gone (safety).
    assert!(closed_at.elapsed() < TTL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_body_releases_the_lock() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route(
            "/endless",
            get(|| async {
                // One chunk every 50 ms, for up to 60 s.
                let chunks = futures_util::stream::unfold(0u32, |i| async move {
                    if i > 0 {
                        tokio::time::sleep(ms(50)).await;
                    }
                    (i < 1200).then(|| (Ok::<_, Infallible>(Bytes::from("tick\n")), i + 1))
                });
                Body::from_stream(chunks)
            }),
        )
        .layer(RedlockLayer::by_path().ttl(TTL))
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let mut conn = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(b"GET /endless HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let mut seen = String::new();
    while !seen.contains("tick") {
        let n = within(answered(Duration::ZERO), "body bytes", conn.read(&mut buf))
            .await
            .unwrap();
        assert!(n > 0, "server closed early: {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen:?}");
    assert!(
        on_every_node(&cluster, "redlock:/endless").await,
        "held while streaming"
    );
    drop(conn);

    assert!(
        on_no_node(&cluster, "redlock:/endless").await,
        "the lock outlived the client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_response_future_releases_the_lock() {
    let cluster = Cluster::start(3);
    let probe = Arc::new(Probe::default());
    let handler = {
        let probe = probe.clone();
        tower::service_fn(move |req: Request<Body>| {
            let probe = probe.clone();
            async move {
                let _recorder = DropRecorder(probe.dropped_at.clone());
                assert!(req.extensions().get::<LockHandle>().is_some());
                probe.running.notify_one();
                tokio::time::sleep(Duration::from_secs(20)).await;
                Ok::<_, Infallible>(http::Response::new(Body::from("finished")))
            }
        })
    };
    let mut service = RedlockLayer::by_path()
        .ttl(TTL)
        .with_redlock(cluster.patient_redlock())
        .layer(handler);

    let ready = service.ready().await.unwrap();
    let mut future = Box::pin(ready.call(Request::get("/dropped").body(Body::empty()).unwrap()));
    tokio::select! {
        _ = &mut future => panic!("the handler must still be running"),
        () = probe.running.notified() => {}
        () = tokio::time::sleep(answered(Duration::ZERO)) => panic!("the handler never ran"),
    }
    assert!(
        on_every_node(&cluster, "redlock:/dropped").await,
        "held by the future"
    );
    drop(future);

    assert!(
        probe.dropped_at.lock().unwrap().is_some(),
        "the handler goes with it"
    );
    assert!(
        on_no_node(&cluster, "redlock:/dropped").await,
        "the lock outlived its ResponseFuture"
    );

    // And the key is free for the next request at once.
    let next = service
        .ready()
        .await
        .unwrap()
        .call(Request::get("/dropped?quick").body(Body::empty()).unwrap());
    let mut next = Box::pin(next);
    tokio::select! {
        _ = &mut next => panic!("the handler must still be running"),
        () = probe.running.notified() => {}
        () = tokio::time::sleep(answered(Duration::ZERO)) => panic!("the next request was not admitted"),
    }
    drop(next);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_future_dropped_while_acquiring_leaves_no_key_behind() {
    let cluster = Cluster::start(3);
    // A long per-node timeout, so that the acquire waits on a paused node long
    // enough to be dropped in the middle of it.
    let node_timeout = Duration::from_secs(3);
    let redlock = redlock_core::Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    let handler = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Body::from("done")))
    });
    let mut service = RedlockLayer::by_path()
        .ttl(TTL)
        .with_redlock(redlock)
        .layer(handler);
    let call = |service: &mut _, path: &str| {
        let req = Request::get(path).body(Body::empty()).unwrap();
        Service::call(service, req)
    };
    // Warm up: every node's connection is open before one is paused.
    let warm = call(service.ready().await.unwrap(), "/warm-up")
        .await
        .unwrap();
    assert_eq!(warm.status(), http::StatusCode::OK);
    drop(warm);

    // Node 1 holds someone else's lock on the key, node 2 hangs: the attempt has
    // node 0's OK and must wait for node 2 to decide.
    let key = "redlock:/contended";
    cluster
        .node(1)
        .cmd(&["SET", key, "someone-else", "PX", "30000"]);
    cluster.node(2).pause();
    let mut acquiring = Box::pin(call(service.ready().await.unwrap(), "/contended"));
    let landed = tokio::select! {
        r = &mut acquiring => panic!("the acquire must hang on node 2: {:?}", r.map(|r| r.status())),
        ok = eventually(answered_with(node_timeout, Duration::ZERO), || cluster.node(0).get(key).is_some()) => ok,
    };
    assert!(landed, "the SET never reached node 0");
    drop(acquiring); // e.g. the client went away, or a timeout layer fired
    cluster.node(2).resume();
    cluster.node(1).cmd(&["DEL", key]);

    // The abandoned attempt's key is released in the background; only that
    // release, not the TTL, can clear it within this bound.
    let bound = timing::settle(node_timeout);
    assert!(bound < TTL, "the bound {bound:?} must stay below the TTL");
    let clean = eventually(bound, || cluster.count_with_key(key) == 0).await;
    let next = call(service.ready().await.unwrap(), "/contended")
        .await
        .unwrap();
    assert!(
        clean,
        "the dropped attempt left its key on {} node(s) for the whole TTL; the next request got {}",
        cluster.count_with_key(key),
        next.status()
    );
    assert_eq!(next.status(), http::StatusCode::OK);
}

/// An in-memory body ends at its first poll, so the layer releases before it hands
/// out the head: the server then writes head and body together (releasing after a
/// head flushed alone would let Nagle hold the body back for the client's delayed
/// ACK, ~40 ms). A streaming body, not done at its first poll, still holds the lock
/// after the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_body_is_released_before_the_head_and_a_stream_after_it() {
    use axum::body::HttpBody as _;
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    let cluster = Cluster::start(3);
    let handler = tower::service_fn(|req: Request<Body>| async move {
        let body = if req.uri().path() == "/stream" {
            let chunks = futures_util::stream::iter(["a", "b"]).then(|c| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(Bytes::from(c))
            });
            Body::from_stream(chunks)
        } else {
            Body::from("whole")
        };
        Ok::<_, Infallible>(http::Response::new(body))
    });
    let mut service = RedlockLayer::by_path()
        .ttl(TTL)
        .with_redlock(cluster.patient_redlock())
        .layer(handler);

    let whole = service
        .ready()
        .await
        .unwrap()
        .call(Request::get("/whole").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert!(!whole.body().holds_lock(), "released before the head");
    // Released at quorum before the head: at most a minority key is left,
    // and its delete is already on its way.
    assert!(
        cluster.count_with_key("redlock:/whole") <= 1,
        "a quorum of keys released"
    );
    assert!(on_no_node(&cluster, "redlock:/whole").await, "no key left");
    assert_eq!(
        whole.body().size_hint().exact(),
        Some(5),
        "the length still counts the frame taken out"
    );
    let bytes = whole.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, Bytes::from("whole"));

    let stream = service
        .ready()
        .await
        .unwrap()
        .call(Request::get("/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert!(
        stream.body().holds_lock(),
        "a stream holds the lock past the head"
    );
    assert!(on_every_node(&cluster, "redlock:/stream").await);
    let bytes = stream.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, Bytes::from("ab"));
    // Released at quorum before the end was reported: at most a minority key
    // is left, and its delete is already on its way.
    assert!(
        cluster.count_with_key("redlock:/stream") <= 1,
        "a quorum of keys released before the end was reported"
    );
    assert!(on_no_node(&cluster, "redlock:/stream").await, "no key left");
}
