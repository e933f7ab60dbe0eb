//! The kinds through `redlock-tower`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::{get, post};
use http::{Method, StatusCode};
use redlock_core::idempotency::IdempotencyPolicy;
use redlock_tests::Cluster;
use redlock_tests::http::{client, send};
use redlock_tower::idempotency::IdempotencyLayer;
use redlock_tower::{ByPathParams, RedlockLayer};

use crate::{all_keys, redlock, without_expiry};

/// A handler that counts its runs.
fn counted(runs: Arc<AtomicUsize>) -> impl Fn() -> std::future::Ready<&'static str> + Clone {
    move || {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready("ran")
    }
}

pub(super) async fn serve(app: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

/// `with_key(ByPathParams::new(["from", "to"]))` finds two keys. With shared
/// reads or permits, the request was taken as the plain mutex: a transfer
/// ran beside a read of one of its accounts, and `permits(1)` admitted two.
/// Refused now, for every method, with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_with_shared_reads_or_permits_are_refused_before_the_handler() {
    let cluster = Cluster::start(3);
    for (kind, layer) in [
        (
            "shared_for_safe_methods",
            RedlockLayer::with_key(ByPathParams::new(["from", "to"]).named("account"))
                .shared_for_safe_methods(),
        ),
        (
            "permits(1)",
            RedlockLayer::with_key(ByPathParams::new(["from", "to"]).named("account")).permits(1),
        ),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route(
                "/transfers/{from}/{to}",
                post(counted(runs.clone())).get(counted(runs.clone())),
            )
            .layer(layer.with_redlock(redlock(&cluster)));
        let (base, server) = serve(app).await;
        for method in [Method::POST, Method::GET] {
            let reply = send(
                &client(),
                method.clone(),
                &format!("{base}/transfers/7/9"),
                &[],
                "",
            )
            .await
            .unwrap();
            assert_eq!(
                reply.status,
                StatusCode::INTERNAL_SERVER_ERROR,
                "{kind}, {method}: {}",
                reply.text()
            );
            assert!(reply.text().contains("misconfigured"), "{}", reply.text());
        }
        server.abort();
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{kind}: the handler ran");
        assert_eq!(all_keys(&cluster), Vec::<String>::new(), "{kind}");
    }
}

/// The same extractor with the mutex still locks both accounts together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_with_the_mutex_still_run() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/transfers/{from}/{to}", post(counted(runs.clone())))
        .layer(
            RedlockLayer::with_key(ByPathParams::new(["from", "to"]).named("account"))
                .with_redlock(redlock(&cluster)),
        );
    let (base, server) = serve(app).await;
    let reply = send(
        &client(),
        Method::POST,
        &format!("{base}/transfers/7/9"),
        &[],
        "",
    )
    .await
    .unwrap();
    server.abort();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `IdempotencyPolicy::default().lock(|p| p.permits(2))` let two copies of
/// one Idempotency-Key run the handler (a double charge). The idempotency
/// layer's lock is always exclusive: another kind is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_layer_refuses_a_lock_that_is_not_the_mutex() {
    let cluster = Cluster::start(3);
    for (kind, policy) in [
        (
            "permits(2)",
            IdempotencyPolicy::default().lock(|p| p.permits(2)),
        ),
        (
            "shared_for_safe_methods",
            IdempotencyPolicy::default().lock(|p| p.shared_for_safe_methods()),
        ),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/pay", post(counted(runs.clone())))
            .route("/read", get(counted(runs.clone())))
            .layer(IdempotencyLayer::new(redlock(&cluster)).policy(policy));
        let (base, server) = serve(app).await;
        let client = client();
        let url = format!("{base}/pay");
        let copies = (0..2).map(|_| {
            send(
                &client,
                Method::POST,
                &url,
                &[("idempotency-key", "pay-1")],
                "{}",
            )
        });
        for reply in futures_util::future::join_all(copies).await {
            let reply = reply.unwrap();
            assert_eq!(
                reply.status,
                StatusCode::INTERNAL_SERVER_ERROR,
                "{kind}: {}",
                reply.text()
            );
        }
        server.abort();
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{kind}: the handler ran");
        assert_eq!(all_keys(&cluster), Vec::<String>::new(), "{kind}");
    }
}

/// With Durable fencing, a request's lock keeps a fence counter per
/// resource. The mutex gave a client-named resource's counter the policy's
/// retention; permits and the write side of shared reads took another path
/// and left a counter with no expiry per distinct path, on every node
/// (issue 47, item 4). Every key the library wrote now has an expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_counters_of_permits_and_writes_expire() {
    let cluster = Cluster::start(3);
    let durable = redlock_core::Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT)
        .fencing(redlock_core::FencingMode::Durable)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/permits/{n}", post(counted(runs.clone())))
        .layer(
            RedlockLayer::by_path()
                .permits(2)
                .with_redlock(durable.clone()),
        )
        .merge(
            Router::new()
                .route("/shared/{n}", post(counted(runs.clone())))
                .layer(
                    RedlockLayer::by_path()
                        .shared_for_safe_methods()
                        .with_redlock(durable),
                ),
        );
    let (base, server) = serve(app).await;
    let client = client();
    for n in 0..5 {
        for route in ["permits", "shared"] {
            let reply = send(
                &client,
                Method::POST,
                &format!("{base}/{route}/{n}"),
                &[],
                "",
            )
            .await
            .unwrap();
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{route}/{n}: {}",
                reply.text()
            );
        }
    }
    server.abort();
    assert_eq!(runs.load(Ordering::SeqCst), 10);
    // Judged once every node answered (a release returns at quorum): no key
    // is left without an expiry, and the counters are there (fenced).
    let mut left = without_expiry(&cluster);
    redlock_tests::util::eventually(redlock_tests::timing::settled(), || {
        left = without_expiry(&cluster);
        left.is_empty()
    })
    .await;
    assert_eq!(left, Vec::<String>::new(), "keys with no expiry");
    assert!(
        all_keys(&cluster).iter().any(|k| k.contains("fence")),
        "no fence counter was written: {:?}",
        all_keys(&cluster)
    );
}
