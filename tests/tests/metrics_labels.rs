//! One primitive, one `key` label (issue 47, item 12): with
//! `metrics_key_label`, a permit's and a read share's every metric (holders'
//! gauge, hold time, releases, extends) is labelled by the resource's lock
//! key, never by a permit slot's or a reader's own key, on real
//! `redis-server` processes.
//!
//! Its own binary: it installs the process-wide recorder.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use redlock_core::{Access, Redlock};
use redlock_tests::{Cluster, timing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_shares_are_labelled_by_their_resources_key() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    let cluster = Cluster::start(3);
    // The application's mapping: the Redis key as it comes, leaked (a test
    // with a handful of keys).
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .metrics_key_label(|key| Box::leak(key.to_owned().into_boxed_str()))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    let mut permit = rl
        .semaphore("exports", 2)
        .unwrap()
        .try_acquire(ttl)
        .await
        .unwrap();
    rl.extend(&mut permit, ttl).await.unwrap();
    rl.unlock(permit).await.unwrap();
    let mut share = rl
        .rw_lock("doc", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    rl.extend(&mut share, ttl).await.unwrap();
    rl.unlock(share).await.unwrap();

    let scrape = handle.render();
    let labels: Vec<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("key=\"").nth(1)?.split('"').next())
        .collect();
    assert!(!labels.is_empty(), "no keyed series: {scrape}");
    let (exports, doc) = (rl.key_for("exports"), rl.key_for("doc"));
    for label in &labels {
        assert!(
            *label == exports || *label == doc,
            "a series labelled by another key than its resource's: {label}\n{scrape}"
        );
    }
    // Both resources' releases and extends are among them.
    for series in ["redlock_releases_total", "redlock_extensions_total"] {
        for key in [&exports, &doc] {
            assert!(
                scrape
                    .lines()
                    .any(|l| l.starts_with(series) && l.contains(&format!("key=\"{key}\""))),
                "no {series} for {key}:\n{scrape}"
            );
        }
    }
}
