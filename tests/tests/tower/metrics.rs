//! `redlock_requests_total` counts every request the layer sees, with the
//! outcome redlock-actix gives the same request: one that runs unlocked for
//! want of a key (pass-through) is `unlocked`. The recorder is local to the
//! test's thread, which runs the server, the client and the layer (a
//! current-thread runtime), so the other tests of this binary do not count.

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;
use redlock_tests::Cluster;
use redlock_tower::RedlockLayer;

use crate::common::*;

/// The value of the series `name{labels}` in a Prometheus scrape (0 if absent).
pub(crate) fn value(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_request_without_a_key_is_counted_unlocked() {
    let cluster = Cluster::start(3);
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let header = http::HeaderName::from_static("x-tenant");
                let app = Router::new()
                    .route("/pass", get(|| async { "ok" }))
                    .layer(RedlockLayer::by_header(header).with_redlock(cluster.patient_redlock()));
                let server = Server::start(app).await;
                let client = client();
                for _ in 0..2 {
                    assert_eq!(http_get(&client, &server.url("/pass")).await.status, 200);
                }
                let url = server.url("/pass");
                let locked = http_get_with(&client, &url, &[("x-tenant", "a")]).await;
                assert_eq!(locked.status, 200);
            })
    });
    let text = scrape.render();
    assert_eq!(
        value(&text, "redlock_requests_total{outcome=\"unlocked\"}"),
        2.0,
        "{text}"
    );
    assert_eq!(
        value(&text, "redlock_requests_total{outcome=\"locked\"}"),
        1.0,
        "{text}"
    );
}
