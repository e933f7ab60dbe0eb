//! The metrics and the holder agree on a renewal decided after the holder's
//! deadline, on real `redis-server` processes.
//!
//! Its own binary: it installs the process-wide recorder, and labels its
//! series by key, which `metrics.rs` checks no series of its own does.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use redlock_core::{LockOptions, Redlock};
use redlock_tests::Cluster;
use redlock_tests::timing::liveness;

/// A renewal whose answers arrive while its thread is blocked past the
/// holder's deadline, though before the keys' validity ends, is decided after
/// the holder was told "lost". It must not count as an extension, in the
/// metrics or on the handle: the two agree, and say none.
///
/// The renewal runs on a runtime of one thread, and a block starves it: the
/// nodes are paused while it is sent, then resumed, and the thread sleeps
/// past the holder's deadline while they answer. The connections were opened
/// on a second runtime, whose thread reads the answers meanwhile, so the
/// answers and the renewal's deadline both wait for the renewal when the
/// thread wakes.
#[test]
fn a_renewal_decided_after_the_holders_deadline_is_not_counted() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    let cluster = Cluster::start(3);
    // The subject: the renewal's node calls must still be pending when the
    // starved thread wakes (they outlast the block below).
    const NODE_TIMEOUT: Duration = Duration::from_secs(5);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(NODE_TIMEOUT)
        .metrics_key_label(|key| {
            if key.ends_with("m-starved") {
                "starved"
            } else {
                "other"
            }
        })
        .build()
        .unwrap();
    // The connections, and the tasks that read them, on their own runtime.
    let connections = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    connections.block_on(async {
        // The extend script loaded too: a `NOSCRIPT` would make the renewal
        // send again, which the block would hold up.
        let ttl = Duration::from_secs(10);
        let mut lock = rl.mutex("m-warm").try_acquire(ttl).await.unwrap();
        rl.extend(&mut lock, ttl).await.unwrap();
        rl.unlock(lock).await.unwrap();
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let holder_extensions = rt.block_on(async {
        // Validity about 10 s; the holder's deadline 5 s before its end.
        let options = LockOptions::new(Duration::from_secs(10)).loss_margin(Duration::from_secs(5));
        let guard = rl.mutex("m-starved").guard(&options).await.unwrap();
        let holder = guard.handle();
        for n in cluster.nodes() {
            n.pause();
        }
        // The renewal is due with 40-60% of the holder's 5 s left (a tenth
        // earlier to fill a batch): with 1.5 s left, it has been sent to the
        // paused nodes, and its node calls time out 5 s after that.
        let waited = Instant::now();
        while holder.remaining() > Duration::from_millis(1500) {
            assert!(
                waited.elapsed() < liveness(Duration::from_secs(10)),
                "never came near the deadline"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!holder.is_lost(), "lost before the block");
        for n in cluster.nodes() {
            n.resume();
        }
        // Past the holder's deadline by 1 s, still about 4 s before the
        // keys' end.
        std::thread::sleep(holder.remaining() + Duration::from_secs(1));
        // The scenario holds: the nodes applied the renewal meanwhile (its
        // keys would have about 4 s left without it, more than 6 s with it).
        let renewed = cluster
            .nodes()
            .iter()
            .filter(|n| n.pttl("m-starved") > 5_000)
            .count();
        assert!(
            renewed >= 2,
            "the nodes did not apply the renewal during the block"
        );
        tokio::time::timeout(liveness(NODE_TIMEOUT), guard.lost())
            .await
            .unwrap();
        let _ = guard.release().await;
        holder.extensions()
    });
    let text = handle.render();
    let count = |outcome: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("redlock_extensions_total{"))
            .filter(|l| l.contains("key=\"starved\"") && l.contains(outcome))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // Counted, as a renewal decided too late.
    assert_eq!(count("outcome=\"expired\""), 1.0, "{text}");
    assert_eq!(
        (count("outcome=\"extended\""), holder_extensions),
        (0.0, 0),
        "a renewal decided after the holder's deadline counted as an extension:\n{text}"
    );
}
