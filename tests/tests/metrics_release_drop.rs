//! The held-locks gauge and the hold histogram count each lock out once,
//! also when its release is dropped mid-flight (issue 38, item 6), on real
//! `redis-server` processes.
//!
//! Its own binary: it installs the process-wide recorder, and `metrics.rs`
//! checks absolute counts of its own.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use redlock_core::Redlock;
use redlock_tests::Cluster;
use redlock_tests::timing::{liveness, settle};

/// The value of the series `name` (no labels), 0 when absent.
fn value(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `timeout(…, unlock(lock))` that fires while the release waits for its
/// quorum (two of three nodes paused): the release future is dropped, and the
/// `Lock` it owns with it, whose `Drop` sends the release again. The lock
/// must leave the gauge once, not twice, and be timed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_mid_flight_counts_the_lock_out_once() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    let cluster = Cluster::start(3);
    // The release is dropped after DROP_AFTER; the paused nodes must still be
    // pending then, however late the timer fires: a node timeout of the
    // liveness bound of that wait.
    const DROP_AFTER: Duration = Duration::from_millis(300);
    let node_timeout = liveness(DROP_AFTER);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(60);
    let lock = rl.mutex("m-dropped").try_acquire(ttl).await.unwrap();
    assert_eq!(value(&handle.render(), "redlock_held_locks"), 1.0);
    cluster.node(1).pause();
    cluster.node(2).pause();
    let dropped = tokio::time::timeout(DROP_AFTER, rl.unlock(lock)).await;
    assert!(
        dropped.is_err(),
        "the release finished without a quorum: {dropped:?}"
    );
    cluster.node(1).resume();
    cluster.node(2).resume();
    // The release sent again by `Drop` deletes the key everywhere (before
    // the TTL: only the release can explain it).
    let bound = settle(node_timeout);
    assert!(bound < ttl, "{bound:?} must stay below the TTL");
    assert!(
        cluster.wait_until(bound, |c| c.count_with_key("m-dropped") == 0),
        "the dropped release's key stayed"
    );
    let text = handle.render();
    assert_eq!(
        (
            value(&text, "redlock_held_locks"),
            value(&text, "redlock_hold_duration_seconds_count")
        ),
        (0.0, 1.0),
        "a lock whose release was dropped mid-flight, counted out twice:\n{text}"
    );
}
