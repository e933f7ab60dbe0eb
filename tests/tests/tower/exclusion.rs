//! Mutual exclusion through `RedlockLayer` over real HTTP and real Redis nodes:
//! one request per key at a time (fail-fast and wait modes), keys run
//! independently, and the axum key extractors (`by_path_param`,
//! `by_matched_path`) group requests as documented. `by_path` inside a nested
//! router should key on the full request path (currently ignored: a known bug,
//! see the test).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::extract::State;
use axum::http::Uri;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::future::join_all;
use http::StatusCode;
use redlock_core::LockHandle;
use redlock_tests::Cluster;
use redlock_tests::http_timing::Gate;
use redlock_tower::RedlockLayer;

/// The state of the critical-section handler: a counter updated without
/// atomicity (read, sleep, write), and a gauge of the requests inside. With
/// `hold_first`, the first request admitted stays inside until a client saw a
/// 409 (`rejected`), so that a burst collides however the scheduler ran it.
#[derive(Default)]
struct Critical {
    counter: AtomicUsize,
    inside: Gauge,
    hold_first: std::sync::atomic::AtomicBool,
    rejected: Gate,
}

/// Read the counter, sleep 5..=20 ms, write it + 1: two overlapping requests
/// lose an update, and the gauge sees them both inside.
async fn critical(State(s): State<Arc<Critical>>) -> &'static str {
    let _inside = s.inside.enter();
    let seen = s.counter.load(Ordering::SeqCst);
    if s.hold_first.swap(false, Ordering::SeqCst) {
        s.rejected.passed().await;
    }
    tokio::time::sleep(ms(5 + (seen as u64 * 7) % 16)).await;
    s.counter.store(seen + 1, Ordering::SeqCst);
    "done"
}

/// For the 50-request bursts: the patient node timeout, so that a machine
/// overloaded by the burst (and by other builds) still gets answers in time,
/// and the only outcomes are 200 and 409.
fn burst_redlock(cluster: &Cluster) -> redlock_core::Redlock {
    cluster.patient_redlock()
}

async fn burst(server: &Server, path: &str, n: usize, state: &Arc<Critical>) -> Vec<StatusCode> {
    let client = client();
    let url = server.url(path);
    let requests = (0..n).map(|_| {
        let (client, url, state) = (client.clone(), url.clone(), state.clone());
        tokio::spawn(async move {
            let status = http_get(&client, &url).await.status;
            if status == StatusCode::CONFLICT {
                state.rejected.open();
            }
            status
        })
    });
    join_all(requests)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_admits_one_request_per_path_and_rejects_the_rest_with_409() {
    let cluster = Cluster::start(3);
    let state = Arc::new(Critical::default());
    state.hold_first.store(true, Ordering::SeqCst);
    let redlock = burst_redlock(&cluster);
    // Connections first: on a cold handle, 50 first attempts that all wait for
    // the same three connects are sent in a different order on each node, and
    // fail-fast requests can then split the nodes so that none wins (a cold
    // start split vote; wait mode retries through it).
    let warm = redlock
        .mutex("warm-up")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    redlock.unlock(warm).await.unwrap();
    let app = Router::new()
        .route("/accounts/7/settle", get(critical))
        .with_state(state.clone())
        .layer(RedlockLayer::by_path())
        .layer(Extension(redlock));
    let server = Server::start(app).await;

    let statuses = burst(&server, "/accounts/7/settle", 50, &state).await;
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let busy = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!(ok + busy, 50, "only 200 and 409 expected: {statuses:?}");
    assert!(ok >= 1, "someone must get the lock: {statuses:?}");
    assert!(
        busy >= 1,
        "50 concurrent requests must collide: {statuses:?}"
    );
    assert_eq!(
        state.counter.load(Ordering::SeqCst),
        ok,
        "every admitted request's update must survive"
    );
    assert_eq!(state.inside.max(), 1, "two requests were inside at once");
}

/// What 50 serialized requests take on a quiet machine, with room to spare.
const WAIT_ALL: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_serializes_all_requests_on_one_path() {
    let cluster = Cluster::start(3);
    let state = Arc::new(Critical::default());
    let app = Router::new()
        .route("/accounts/7/settle", get(critical))
        .with_state(state.clone())
        // The wait is a liveness bound: 50 requests one after the other, each
        // an acquire and a release around 20 ms of work.
        .layer(RedlockLayer::by_path().wait(liveness(WAIT_ALL)))
        .layer(Extension(burst_redlock(&cluster)));
    let server = Server::start(app).await;

    let started = Instant::now();
    let statuses = burst(&server, "/accounts/7/settle", 50, &state).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "every waiter must get the lock within {:?}: {statuses:?}",
        liveness(WAIT_ALL)
    );
    assert_eq!(state.counter.load(Ordering::SeqCst), 50, "lost update");
    assert_eq!(state.inside.max(), 1, "two requests were inside at once");
    eprintln!("50 serialized requests took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_paths_run_concurrently() {
    let cluster = Cluster::start(3);
    let gauge = Arc::new(Gauge::default());
    let app = Router::new()
        .route(
            "/jobs/{id}",
            get(|State(g): State<Arc<Gauge>>| async move {
                let _inside = g.enter();
                // Stay until another path's request is inside too (bounded: if
                // distinct paths were excluded, none ever comes, and the gauge
                // below says so).
                eventually(answered(Duration::ZERO), || g.now() >= 2).await;
                "done"
            }),
        )
        .with_state(gauge.clone())
        .layer(RedlockLayer::by_path())
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;
    let client = client();

    let requests = (0..8).map(|i| {
        let (client, url) = (client.clone(), server.url(&format!("/jobs/{i}")));
        tokio::spawn(async move { http_get(&client, &url).await.status })
    });
    let statuses: Vec<StatusCode> = join_all(requests)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "distinct paths never contend: {statuses:?}"
    );
    assert!(
        gauge.max() > 1,
        "requests to 8 different paths never overlapped (max inside {})",
        gauge.max()
    );
}

/// A handler that holds its lock for `?hold=<ms>`, or with `?gate` until the
/// test opens its [`Gate`], and answers with the lock's key.
async fn hold(uri: Uri, gate: Extension<Arc<Gate>>, lock: Extension<LockHandle>) -> String {
    if uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "gate"))
    {
        gate.passed().await;
    } else {
        tokio::time::sleep(hold_of(&uri)).await;
    }
    lock.key().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_path_param_excludes_jobs_of_one_tenant_but_not_other_tenants() {
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    let app = Router::new()
        .route("/tenants/{tenant}/jobs/{job}", get(hold))
        .layer(RedlockLayer::by_path_param("tenant"))
        .layer(Extension(cluster.patient_redlock()))
        .layer(Extension(gate.clone()));
    let server = Server::start(app).await;
    let client = client();

    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/tenants/acme/jobs/1?gate"));
        async move { http_get(&client, &url).await }
    });
    assert!(
        on_every_node(&cluster, "redlock:tenant=acme").await,
        "the first job never took the tenant lock"
    );
    let same_tenant = http_get(&client, &server.url("/tenants/acme/jobs/2")).await;
    assert_eq!(same_tenant.status, StatusCode::CONFLICT);
    let other_tenant = http_get(&client, &server.url("/tenants/globex/jobs/1")).await;
    assert_eq!(other_tenant.status, StatusCode::OK);
    assert_eq!(other_tenant.text(), "redlock:tenant=globex");
    assert!(
        !first.is_finished(),
        "the other tenant must have run while acme's job held its lock"
    );
    gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.text(), "redlock:tenant=acme");
}

/// `by_path_params(["from", "to"])`: a transfer holds both accounts as one
/// lock, so the same pair in the other order, and any transfer touching either
/// account, waits its turn (409 here: fail fast), while a transfer between two
/// other accounts runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_path_params_locks_both_accounts_of_a_transfer_together() {
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    let app = Router::new()
        .route("/transfers/{from}/{to}", get(hold))
        .layer(RedlockLayer::by_path_params(["from", "to"]))
        .layer(Extension(cluster.patient_redlock()))
        .layer(Extension(gate.clone()));
    let server = Server::start(app).await;
    let client = client();

    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/transfers/7/9?gate"));
        async move { http_get(&client, &url).await }
    });
    assert!(
        on_every_node(&cluster, "redlock:from,to=7").await
            && on_every_node(&cluster, "redlock:from,to=9").await,
        "the first transfer never took both accounts"
    );
    for path in ["/transfers/9/7", "/transfers/9/5", "/transfers/3/7"] {
        let r = http_get(&client, &server.url(path)).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{path}");
    }
    let other = http_get(&client, &server.url("/transfers/1/2")).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.text(), "redlock:from,to=1");
    assert!(
        !first.is_finished(),
        "the other pair must have run meanwhile"
    );
    gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    // The lock's first key (in key order).
    assert_eq!(first.text(), "redlock:from,to=7");
    assert!(
        on_no_node(&cluster, "redlock:from,to=7").await
            && on_no_node(&cluster, "redlock:from,to=9").await,
        "both accounts released at the end of the response"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_matched_path_excludes_every_request_of_one_route() {
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    let app = Router::new()
        .route("/tenants/{tenant}/jobs/{job}", get(hold))
        .route("/health", get(hold))
        .layer(RedlockLayer::by_matched_path())
        .layer(Extension(cluster.patient_redlock()))
        .layer(Extension(gate.clone()));
    let server = Server::start(app).await;
    let client = client();
    // The resource holds braces: its Redis key is one escaped hash tag
    // (`slots.rs`), so every key of it stays in one Redis Cluster slot.
    let key = "{redlock:/tenants/%7Btenant%7D/jobs/%7Bjob%7D}";

    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/tenants/acme/jobs/1?gate"));
        async move { http_get(&client, &url).await }
    });
    assert!(
        on_every_node(&cluster, key).await,
        "the first request never took the route lock"
    );
    let other = http_get(&client, &server.url("/tenants/globex/jobs/9")).await;
    assert_eq!(
        other.status,
        StatusCode::CONFLICT,
        "same route, other params"
    );
    let other_route = http_get(&client, &server.url("/health")).await;
    assert_eq!(other_route.status, StatusCode::OK, "another route is free");
    assert_eq!(other_route.text(), "redlock:/health");
    gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.text(), key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_path_inside_a_nested_router_keys_on_the_full_request_path() {
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    let inner = || {
        Router::new()
            .route("/jobs/{job}", get(hold))
            .layer(RedlockLayer::by_path())
    };
    let app = Router::new()
        .nest("/tenants/acme", inner())
        .nest("/tenants/globex", inner())
        .layer(Extension(cluster.patient_redlock()))
        .layer(Extension(gate.clone()));
    let server = Server::start(app).await;
    let client = client();

    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/tenants/acme/jobs/1?gate"));
        async move { http_get(&client, &url).await }
    });
    // Once the first request holds its lock (whatever its key: some key on
    // a quorum, the first request being the only one sent), probe its own
    // path until it is busy, then ask for another tenant's path. Bounded by
    // a liveness bound.
    assert!(
        eventually(answered(Duration::ZERO), || cluster
            .nodes()
            .iter()
            .filter(|n| !n.keys().is_empty())
            .count()
            >= 2)
        .await,
        "the first request never took a lock"
    );
    let mut other = None;
    let end = Instant::now() + answered(Duration::ZERO);
    while Instant::now() < end {
        assert!(!first.is_finished(), "the first request ended early");
        let reply = http_get(&client, &server.url("/tenants/acme/jobs/1")).await;
        if reply.status == StatusCode::CONFLICT {
            other = Some(http_get(&client, &server.url("/tenants/globex/jobs/1")).await);
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    let other = other.expect("the first request never held its lock");
    gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        other.status,
        StatusCode::OK,
        "/tenants/globex/jobs/1 is another path than /tenants/acme/jobs/1 (first took key {})",
        first.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_requests_never_find_the_previous_request_still_holding_the_lock() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/jobs/{id}", get(hold))
        .layer(RedlockLayer::by_path())
        .layer(Extension(cluster.patient_redlock()))
        .layer(Extension(Arc::new(Gate::default())));
    let server = Server::start(app).await;
    let client = client();
    let url = server.url("/jobs/1");

    // One client, one request after the other: each starts only once the
    // previous response has been read in full.
    let mut busy = Vec::new();
    for i in 0..300 {
        let reply = http_get(&client, &url).await;
        match reply.status {
            StatusCode::OK => {}
            StatusCode::CONFLICT => busy.push((i, reply.retry_after())),
            other => panic!("request {i}: {other} {}", reply.text()),
        }
    }
    assert!(
        busy.is_empty(),
        "{} of 300 sequential requests found the previous one's lock \
         (request index, Retry-After s): {busy:?}",
        busy.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_param_route_and_a_named_header_route_share_the_tenant_lock() {
    // The tenant example's two routes, with no hand-made key prefix:
    // `by_path_param("tenant")` and `by_header_as(.., "tenant")` both key
    // `tenant=<id>` under the default namespace.
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    let by_path = Router::new()
        .route("/tenants/{tenant}/jobs", get(hold))
        .route_layer(RedlockLayer::by_path_param("tenant"));
    let by_header =
        Router::new()
            .route("/jobs", get(hold))
            .route_layer(RedlockLayer::by_header_as(
                http::HeaderName::from_static("x-tenant-id"),
                "tenant",
            ));
    let app = Router::new()
        .merge(by_path)
        .merge(by_header)
        .layer(Extension(cluster.patient_redlock()))
        .layer(Extension(gate.clone()));
    let server = Server::start(app).await;
    let client = client();

    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/tenants/acme/jobs?gate"));
        async move { http_get(&client, &url).await }
    });
    assert!(
        on_every_node(&cluster, "redlock:tenant=acme").await,
        "the path route never took the tenant lock"
    );
    let same = http_get_with(&client, &server.url("/jobs"), &[("x-tenant-id", "acme")]).await;
    assert_eq!(
        same.status,
        StatusCode::CONFLICT,
        "one lock for both routes"
    );
    let other = http_get_with(&client, &server.url("/jobs"), &[("x-tenant-id", "globex")]).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.text(), "redlock:tenant=globex");
    gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.text(), "redlock:tenant=acme");
}
