//! The fault suite's workload (manual locks, guards and lock sets over a
//! shared store, judged by the history checker) on three cluster nodes,
//! while one cluster loses a master for longer than every TTL (killed, then
//! restarted empty from its `nodes.conf`) and another's master is paused:
//! 0 overlaps, 0 lost updates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::{Redlock, RetryPolicy};
use redlock_tests::RedisClusters;
use redlock_tests::history::{Event, FaultKind, HistoryLog, Meta, check, duration_ns, now_ns};
use redlock_tests::nemesis::{DRIFT_FACTOR, FIXED_DRIFT, clock_event};
use redlock_tests::workload::{ClientConfig, MemoryStore, Store, run_client, run_many_client};

const NODE_TIMEOUT: Duration = Duration::from_millis(200);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock_for(clusters: &RedisClusters) -> Redlock {
    clusters
        .clusters()
        .iter()
        .fold(Redlock::builder(), |b, c| b.cluster(c.seeds()))
        .node_timeout(NODE_TIMEOUT)
        .drift_factor(DRIFT_FACTOR)
        .fixed_drift(FIXED_DRIFT)
        .build()
        .unwrap()
}

fn fault(log: &HistoryLog, kind: FaultKind, node: usize, detail: &str) {
    log.push(Event::Fault {
        kind,
        node: Some(node),
        at: now_ns(),
        detail: detail.to_owned(),
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_on_cluster_nodes_under_faults_has_no_overlap_and_no_lost_update() {
    let clusters = Arc::new(RedisClusters::start(3, 3, 0));
    let log = HistoryLog::new();
    log.push(Event::Meta(Meta {
        scenario: "cluster-nodes".into(),
        seed: 1,
        nodes: 3,
        quorum: 2,
        drift_factor: DRIFT_FACTOR,
        fixed_drift_ns: duration_ns(FIXED_DRIFT),
        node_timeout_ns: duration_ns(NODE_TIMEOUT),
        expect_violation: false,
    }));
    log.push(clock_event("parent"));
    let resources: Vec<(String, Duration)> = vec![
        ("r0".into(), ms(600)),
        ("r1".into(), ms(700)),
        ("r{2}".into(), ms(800)),
    ];
    let store = Arc::new(MemoryStore::new());
    let until = Instant::now() + Duration::from_secs(8);
    let retry = RetryPolicy::deadline(ms(1500))
        .with_delay(ms(10))
        .with_jitter(ms(20));
    let config = |name: String, seed: u64, guard_share: f64| ClientConfig {
        name,
        resources: resources.clone(),
        retry: retry.clone(),
        until,
        seed,
        guard_share,
        stalls: None,
    };
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let store: Arc<dyn Store> = store.clone();
        let cfg = config(format!("c{i}"), 100 + i, 0.4);
        tasks.push(tokio::spawn(run_client(
            redlock_for(&clusters),
            cfg,
            store,
            log.clone(),
        )));
    }
    for i in 0..2u64 {
        let store: Arc<dyn Store> = store.clone();
        let cfg = config(format!("k{i}"), 200 + i, 0.0);
        tasks.push(tokio::spawn(run_many_client(
            redlock_for(&clusters),
            cfg,
            store,
            log.clone(),
        )));
    }
    let nemesis = std::thread::spawn({
        let (clusters, log) = (Arc::clone(&clusters), log.clone());
        move || {
            std::thread::sleep(ms(1500));
            // A master of cluster 1 dies; it comes back empty after more
            // than every TTL, and its cluster serves again.
            let victim = &clusters.cluster(1).masters()[0];
            fault(&log, FaultKind::Kill, 1, "cluster 1, master 0");
            victim.kill();
            std::thread::sleep(ms(1500));
            victim.restart();
            std::thread::sleep(ms(500));
            // A master of cluster 2 stops answering for a while.
            let paused = &clusters.cluster(2).masters()[1];
            fault(&log, FaultKind::Pause, 2, "cluster 2, master 1, 800 ms");
            paused.pause();
            std::thread::sleep(ms(800));
            paused.resume();
        }
    });
    for t in tasks {
        t.await.unwrap();
    }
    tokio::task::spawn_blocking(move || nemesis.join().unwrap())
        .await
        .unwrap();
    let events = log.snapshot();
    let verdict = check(&events);
    let mut summary = redlock_tests::history::Summary::default();
    summary.add(&verdict);
    // The set clients' acquisitions: one `Acquire` per key of a pair.
    summary.multi_key_acquisitions = events
        .iter()
        .filter(|e| matches!(e, Event::Acquire { client, .. } if client.starts_with('k')))
        .count() as u64
        / 2;
    eprintln!("{}", summary.line());
    assert!(verdict.passed(), "{}", verdict.describe(10));
    assert_eq!(verdict.all_lost_updates(), 0);
    assert!(verdict.acquisitions >= 10, "{}", summary.line());
    assert!(summary.multi_key_acquisitions >= 1, "{}", summary.line());
}
