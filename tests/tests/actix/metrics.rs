//! `redlock_requests_total` counts every request the middleware sees, with the
//! outcome redlock-tower gives the same request: one that runs unlocked for
//! want of a key (pass-through) is `unlocked`. The recorder is local to the
//! test's thread, which runs the app in process (`actix_web::test`) on a
//! single-threaded actix system, so the other tests of this binary do not
//! count.

use actix_web::http::header::HeaderName;

use actix_web::{App, web};
use metrics_exporter_prometheus::PrometheusBuilder;
use redlock_actix::RedlockMiddleware;
use redlock_tests::Cluster;

/// The value of the series `name{labels}` in a Prometheus scrape (0 if absent).
fn value(scrape: &str, series: &str) -> f64 {
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
        actix_web::rt::System::new().block_on(async {
            let app = actix_web::test::init_service(
                App::new()
                    // A 503 here would be the machine, not the case under test.
                    .app_data(cluster.patient_redlock())
                    .wrap(RedlockMiddleware::by_header(HeaderName::from_static(
                        "x-tenant",
                    )))
                    .route("/pass", web::get().to(|| async { "ok" })),
            )
            .await;
            for _ in 0..2 {
                assert_eq!(call!(&app, "/pass").await.status, 200);
            }
            let locked = call!(&app, "/pass", ("x-tenant", "a")).await;
            assert_eq!(locked.status, 200, "{locked:?}");
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
