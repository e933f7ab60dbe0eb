//! Lock metrics on real `redis-server` processes, scraped from `/metrics` as
//! Prometheus would: after a known sequence of lock operations and requests,
//! the counters, gauges and histogram counts are what happened (permits and
//! shares too), no series carries a resource key unless the application maps
//! keys to labels, and the guide's operating chapter lists every metric.
//!
//! Its own binary: it installs the process-wide recorder.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redlock_core::{Access, LockOptions, Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::http_timing::Gate;
use redlock_tests::timing::{PATIENT_NODE_TIMEOUT, liveness};
use redlock_tower::RedlockLayer;

fn recorder() -> PrometheusHandle {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    redlock_core::metrics::describe();
    handle
}

/// The value of the series `name{labels}` (labels in the exporter's order).
fn value(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn scrape(client: &redlock_tests::http::HttpClient, url: &str) -> String {
    let reply = redlock_tests::http::get(client, url).await;
    assert_eq!(reply.status, http::StatusCode::OK);
    String::from_utf8(reply.body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_known_operations_counts_them() {
    let handle = recorder();
    let cluster = Cluster::start(3);
    // Patient: the counts below are exact, so every call must get its answers
    // (the paused nodes of steps 3 and 3b time out all the same).
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap();

    // 1. Three locks taken and released, one busy try.
    for i in 0..3 {
        let lock = rl
            .mutex(format!("m-{i}"))
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap();
        if i == 0 {
            let busy = rl.mutex("m-0").try_acquire(Duration::from_secs(5)).await;
            assert!(busy.is_err());
        }
        rl.unlock(lock).await.unwrap();
    }
    // 2. One extend.
    let mut lock = rl
        .mutex("m-ext")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    rl.extend(&mut lock, Duration::from_secs(5)).await.unwrap();
    rl.unlock(lock).await.unwrap();
    // 3. A guarded lock lost: every node paused until the holder is told.
    //    (The shortest TTL the patient handle renews: two node timeouts.)
    let guard_ttl = PATIENT_NODE_TIMEOUT * 2;
    let guard = rl
        .mutex("m-lost")
        .guard(&LockOptions::new(guard_ttl))
        .await
        .unwrap();
    for n in cluster.nodes() {
        n.pause();
    }
    tokio::time::timeout(liveness(guard_ttl), guard.lost())
        .await
        .unwrap();
    for n in cluster.nodes() {
        n.resume();
    }
    // A loaded machine may let the guard renew once before the pause. Read
    // once the release has waited for the renewal in flight: a renewal is
    // counted in the metrics when decided, and on the handle when the
    // renewal task takes its outcome. (This assertion once failed with
    // extended 2, handle 0: a renewal whose answers came as the holder's
    // deadline passed was counted as extended, while the holder was told
    // lost. Fixed; `metrics_starved.rs` reproduces it.)
    let lost_handle = guard.handle();
    let _ = guard.release().await;
    let guard_extensions = f64::from(lost_handle.extensions());
    // 3b. Two nodes of three paused: no quorum, two node timeouts.
    cluster.node(1).pause();
    cluster.node(2).pause();
    let none = rl.mutex("m-down").try_acquire(Duration::from_secs(5)).await;
    cluster.node(1).resume();
    cluster.node(2).resume();
    assert!(none.is_err());

    // 4. Two requests through the layer, one of them busy, served beside
    //    /metrics. The first stays inside until the second was answered.
    let metrics = handle.clone();
    let (inside, gate) = (Arc::new(AtomicBool::new(false)), Arc::new(Gate::default()));
    let (handler_inside, handler_gate) = (inside.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/work/{id}",
            get(move || {
                let (inside, gate) = (handler_inside.clone(), handler_gate.clone());
                async move {
                    inside.store(true, Ordering::SeqCst);
                    gate.passed().await;
                    "done"
                }
            }),
        )
        .layer(RedlockLayer::by_path().with_redlock(rl.clone()))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = redlock_tests::http::client();
    let url = format!("http://{addr}/work/1");
    let (a, b) = tokio::join!(redlock_tests::http::get(&client, &url), async {
        let bound = redlock_tests::http_timing::answered(Duration::ZERO);
        assert!(
            redlock_tests::util::eventually(bound, || inside.load(Ordering::SeqCst)).await,
            "the first request never reached its handler"
        );
        let b = redlock_tests::http::get(&client, &url).await;
        gate.open();
        b
    });
    assert_eq!(a.status, http::StatusCode::OK);
    assert_eq!(b.status, http::StatusCode::CONFLICT);

    let text = scrape(&client, &format!("http://{addr}/metrics")).await;
    server.abort();
    eprintln!("{text}");

    // Acquires: 3 + 1 (m-ext) + 1 (m-lost) + 1 (request) acquired; 1 + 1 busy.
    assert_eq!(
        value(
            &text,
            "redlock_acquire_duration_seconds_count{outcome=\"acquired\"}"
        ),
        6.0
    );
    assert_eq!(
        value(
            &text,
            "redlock_acquire_duration_seconds_count{outcome=\"busy\"}"
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            "redlock_acquire_duration_seconds_count{outcome=\"no_quorum\"}"
        ),
        1.0
    );
    assert_eq!(
        value(&text, "redlock_extensions_total{outcome=\"extended\"}"),
        1.0 + guard_extensions,
        "m-ext's extend, and the lost guard's renewals before the pause"
    );
    // Usually renewal_failed (the renewal hung until the deadline); expired if
    // the renewal task was starved past it on a loaded machine.
    let losses = value(&text, "redlock_losses_total{cause=\"renewal_failed\"}")
        + value(&text, "redlock_losses_total{cause=\"expired\"}");
    assert_eq!(losses, 1.0, "{text}");
    // 3 + m-ext + the request's, confirmed; the lost guard's release ran
    // while its nodes were paused or just after: either outcome.
    let confirmed = value(&text, "redlock_releases_total{outcome=\"confirmed\"}");
    let unconfirmed = value(&text, "redlock_releases_total{outcome=\"unconfirmed\"}");
    assert!(confirmed >= 5.0, "{text}");
    assert_eq!(confirmed + unconfirmed, 6.0, "{text}");
    assert_eq!(value(&text, "redlock_hold_duration_seconds_count"), 6.0);
    assert_eq!(value(&text, "redlock_held_locks"), 0.0);
    assert_eq!(
        value(&text, "redlock_requests_total{outcome=\"locked\"}"),
        1.0
    );
    assert_eq!(
        value(&text, "redlock_requests_total{outcome=\"busy\"}"),
        1.0
    );
    // The paused nodes timed out: errors by node and kind, never a resource
    // key as a label.
    let timeouts: f64 = text
        .lines()
        .filter(|l| l.starts_with("redlock_node_errors_total{") && l.contains("kind=\"timeout\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(timeouts >= 2.0, "{text}");
    for line in text.lines().filter(|l| l.starts_with("redlock_")) {
        assert!(!line.contains("key="), "a series labelled by key: {line}");
        assert!(!line.contains("m-"), "a resource in a series: {line}");
    }
    assert!(
        text.contains("# TYPE redlock_acquire_duration_seconds summary")
            || text.contains("# TYPE redlock_acquire_duration_seconds histogram"),
        "{text}"
    );

    permits_and_shares(&handle, &rl).await;
    let labelled = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .metrics_key_label(|_| "tenant")
        .build()
        .unwrap();
    let permit = labelled
        .semaphore("m-sem-labelled", 2)
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let text = handle.render();
    assert_eq!(
        value(&text, "redlock_permits_held{key=\"tenant\"}"),
        1.0,
        "{text}"
    );
    labelled.unlock(permit).await.unwrap();
    let text = handle.render();
    assert_eq!(value(&text, "redlock_permits_held{key=\"tenant\"}"), 0.0);
}

/// 5. Two permits and a read share held, a permit waiter and a writer
///    waiting; then the first permit and the share released, so that both
///    waiters hold; then everything released.
async fn permits_and_shares(handle: &PrometheusHandle, rl: &Redlock) {
    let ttl = Duration::from_secs(5);
    let p1 = rl
        .semaphore("m-sem", 2)
        .unwrap()
        .try_acquire(ttl)
        .await
        .unwrap();
    let p2 = rl
        .semaphore("m-sem", 2)
        .unwrap()
        .try_acquire(ttl)
        .await
        .unwrap();
    let r1 = rl
        .rw_lock("m-rw", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    // A liveness bound: the waiters are let in by the releases below.
    let retry = RetryPolicy::deadline(liveness(ttl));
    let waiter = tokio::spawn({
        let (rl, retry) = (rl.clone(), retry.clone());
        async move { rl.semaphore("m-sem", 2)?.acquire_with(ttl, &retry).await }
    });
    let writer = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.rw_lock("m-rw", Access::Exclusive)
                .acquire_with(ttl, &retry)
                .await
        }
    });
    let waiting = |t: &str| {
        value(t, "redlock_permit_waiters") == 1.0
            && value(t, "redlock_share_waiters{access=\"exclusive\"}") == 1.0
    };
    let began = std::time::Instant::now();
    while !waiting(&handle.render()) {
        assert!(
            began.elapsed() < redlock_tests::http_timing::answered(Duration::ZERO),
            "{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let text = handle.render();
    assert_eq!(value(&text, "redlock_permits_held"), 2.0, "{text}");
    assert_eq!(value(&text, "redlock_shares_held{access=\"shared\"}"), 1.0);
    assert_eq!(
        value(&text, "redlock_shares_held{access=\"exclusive\"}"),
        0.0
    );
    assert_eq!(value(&text, "redlock_held_locks"), 3.0);
    assert_eq!(value(&text, "redlock_waiters"), 2.0);

    rl.unlock(p1).await.unwrap();
    rl.unlock(r1).await.unwrap();
    let p3 = waiter.await.unwrap().unwrap();
    let w = writer.await.unwrap().unwrap();
    let text = handle.render();
    assert_eq!(value(&text, "redlock_permits_held"), 2.0, "{text}");
    assert_eq!(value(&text, "redlock_shares_held{access=\"shared\"}"), 0.0);
    assert_eq!(
        value(&text, "redlock_shares_held{access=\"exclusive\"}"),
        1.0
    );
    assert_eq!(value(&text, "redlock_permit_waiters"), 0.0);
    assert_eq!(
        value(&text, "redlock_share_waiters{access=\"exclusive\"}"),
        0.0
    );
    assert_eq!(value(&text, "redlock_waiters"), 0.0);

    rl.unlock(p2).await.unwrap();
    rl.unlock(p3).await.unwrap();
    // A dropped lock ends its count too.
    drop(w);
    let text = handle.render();
    assert_eq!(value(&text, "redlock_permits_held"), 0.0, "{text}");
    assert_eq!(
        value(&text, "redlock_shares_held{access=\"exclusive\"}"),
        0.0
    );
    assert_eq!(value(&text, "redlock_held_locks"), 0.0);
    for line in text.lines().filter(|l| l.starts_with("redlock_")) {
        assert!(!line.contains("key="), "a series labelled by key: {line}");
        assert!(!line.contains("m-"), "a resource in a series: {line}");
    }
}

/// Every metric of `redlock_core::metrics::METRICS` is in the table of the
/// guide's operating chapter (`redlock_core::guide::operating`), and the
/// table names no other.
#[test]
fn the_operating_chapter_s_table_lists_every_metric() {
    let chapter = include_str!("../../redlock-core/docs/guide/operating.md");
    let in_table: Vec<&str> = chapter
        .lines()
        .filter_map(|l| l.strip_prefix("| `redlock_"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let names: Vec<String> = redlock_core::metrics::METRICS
        .iter()
        .map(|m| m.name.trim_start_matches("redlock_").to_owned())
        .collect();
    for n in &names {
        assert!(
            in_table.contains(&n.as_str()),
            "redlock_{n} is not in the operating chapter's table"
        );
    }
    for t in &in_table {
        assert!(
            names.iter().any(|n| n == t),
            "the operating chapter lists redlock_{t}, which does not exist"
        );
    }
}
