//! `RedlockMiddleware` in real actix-web apps over real Redis nodes: one request
//! per key at a time (fail-fast and wait modes, across two workers), keys run in
//! parallel, the busy / missing-key / unavailable answers, fail-open, every key
//! source, and where the `Redlock` handle comes from.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::{App, web};
use futures_util::future::join;
use redlock_actix::RedlockMiddleware;
use redlock_tests::Cluster;

mod answers;
mod handle;
mod permits;
use answers::*;

/// The state of the critical-section handler: a counter updated without
/// atomicity (read, sleep, write), and a gauge of the requests inside. With
/// `hold_first`, the first request admitted stays inside until a client saw a
/// 409 (`rejected`), so that a burst collides however the scheduler ran it.
#[derive(Default)]
struct Critical {
    counter: AtomicUsize,
    inside: Gauge,
    hold_first: AtomicBool,
    rejected: Gate,
}

/// Read the counter, sleep 5..=20 ms, write it + 1: two overlapping requests
/// lose an update, and the gauge sees them both inside.
async fn critical(state: web::Data<Critical>) -> &'static str {
    let _inside = state.inside.enter();
    let seen = state.counter.load(Ordering::SeqCst);
    if state.hold_first.swap(false, Ordering::SeqCst) {
        state.rejected.passed().await;
    }
    actix_web::rt::time::sleep(ms(5 + (seen as u64 * 7) % 16)).await;
    state.counter.store(seen + 1, Ordering::SeqCst);
    "done"
}

fn critical_server(
    cluster: &Cluster,
    middleware: RedlockMiddleware,
) -> (Server, web::Data<Critical>) {
    let state = web::Data::new(Critical::default());
    // The patient node timeout: these tests are about admission and waking,
    // not about slow nodes.
    let redlock = cluster.patient_redlock();
    let shared = state.clone();
    let server = serve!(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(redlock.clone())
            .wrap(middleware.clone())
            .route("/accounts/7/settle", web::get().to(critical))
    });
    (server, state)
}

#[actix_web::test]
async fn fail_fast_admits_one_request_per_path_and_rejects_the_rest_with_409() {
    let cluster = Cluster::start(3);
    let (server, state) = critical_server(&cluster, RedlockMiddleware::by_path());
    state.hold_first.store(true, Ordering::SeqCst);
    // Connections first: on a cold handle, 50 first attempts that all wait for
    // the same three connects are sent in a different order on each node, and
    // fail-fast requests can then split the nodes so that none wins (a cold
    // start split vote; wait mode retries through it).
    let warm = get(&client(), &server.url("/warm-up")).await;
    assert_eq!(warm.status, 404);

    // The first admitted request stays inside until a client saw a 409.
    let client = client();
    let url = server.url("/accounts/7/settle");
    let statuses: Vec<http::StatusCode> = futures_util::future::join_all((0..50).map(|_| async {
        let status = get(&client, &url).await.status;
        if status == 409 {
            state.rejected.open();
        }
        status
    }))
    .await;
    let (ok, busy) = (count(&statuses, 200), count(&statuses, 409));
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

/// What 40 serialized requests take on a quiet machine, with room to spare.
const WAIT_ALL: Duration = Duration::from_secs(20);

#[actix_web::test]
async fn wait_mode_serializes_every_request_on_one_path() {
    let cluster = Cluster::start(3);
    // The wait is a liveness bound: 40 requests one after the other, each an
    // acquire and a release around 20 ms of work.
    let middleware = RedlockMiddleware::by_path().wait(liveness(WAIT_ALL));
    let (server, state) = critical_server(&cluster, middleware);

    let started = Instant::now();
    let statuses = burst(&client(), &server.url("/accounts/7/settle"), 40).await;
    assert_eq!(
        count(&statuses, 200),
        40,
        "every waiter must get the lock within {:?}: {statuses:?}",
        liveness(WAIT_ALL)
    );
    assert_eq!(state.counter.load(Ordering::SeqCst), 40, "lost update");
    assert_eq!(state.inside.max(), 1, "two requests were inside at once");
    eprintln!("40 serialized requests took {:?}", started.elapsed());
}

/// Wait mode is woken by the holder's release: with a fallback poll longer
/// than the liveness bound of a request that waits out a 300 ms holder, the
/// waiting request still runs within that bound.
#[actix_web::test]
async fn wait_mode_is_woken_by_the_release_before_its_fallback_poll() {
    let cluster = Cluster::start(3);
    let poll = answered(ms(300)) * 2;
    let middleware = RedlockMiddleware::by_path()
        .wait(poll * 2)
        .retry_delay(poll, Duration::ZERO);
    let (server, state) = critical_server(&cluster, middleware);
    let holder = cluster.patient_redlock();
    let lock = holder
        .mutex("redlock:/accounts/7/settle")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let release = async {
        actix_web::rt::time::sleep(ms(300)).await;
        holder.unlock(lock).await.unwrap();
    };
    let started = Instant::now();
    let (reply, ()) = join(get(&client(), &server.url("/accounts/7/settle")), release).await;
    let took = started.elapsed();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(state.counter.load(Ordering::SeqCst), 1);
    assert!(
        took >= ms(250) && took < answered(ms(300)),
        "woken by the release at 300 ms, not by the {poll:?} poll: {took:?}"
    );
}

#[actix_web::test]
async fn different_paths_run_in_parallel() {
    let cluster = Cluster::start(3);
    let gauge = web::Data::new(Gauge::default());
    let redlock = cluster.patient_redlock();
    let shared = gauge.clone();
    let server = serve!(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(redlock.clone())
            .wrap(RedlockMiddleware::by_path())
            .route(
                "/jobs/{id}",
                web::get().to(|g: web::Data<Gauge>| async move {
                    let _inside = g.enter();
                    // Stay until another path's request is inside too
                    // (bounded: if distinct paths were excluded, none ever
                    // comes, and the gauge below says so).
                    eventually(answered(Duration::ZERO), || g.now() >= 2).await;
                    "done"
                }),
            )
    });
    let client = client();

    let started = Instant::now();
    let requests = (0..8).map(|i| {
        let (client, url) = (client.clone(), server.url(&format!("/jobs/{i}")));
        async move { get(&client, &url).await.status }
    });
    let statuses = futures_util::future::join_all(requests).await;
    assert_eq!(
        count(&statuses, 200),
        8,
        "distinct paths never contend: {statuses:?}"
    );
    assert!(
        gauge.max() > 1,
        "requests to 8 different paths never overlapped (max inside {})",
        gauge.max()
    );
    eprintln!(
        "8 paths: max {} inside at once, {:?} in all",
        gauge.max(),
        started.elapsed()
    );
}
