//! Figures, run by hand (`cargo test -p redlock-tests --test cluster --
//! --ignored --nocapture`): idempotency records past one shard's memory
//! through cluster nodes, where single servers with the same `maxmemory`
//! refuse them (fail closed, 503); and lock+unlock latency and server CPU per
//! pair on cluster nodes against single servers.

use std::time::{Duration, Instant};

use bytes::Bytes;
use redlock_core::Redlock;
use redlock_core::idempotency::{Begin, Idempotency, IdempotencyKey, RequestParts};
use redlock_tests::{Cluster, RedisClusters, RedisNode};

use crate::handle;

/// Every shard's (and single server's) `maxmemory`.
const MAXMEMORY: u64 = 12 << 20;
/// One recorded response body.
// 31 KiB: with the record's few header bytes, one 32 KiB allocation.
const BODY: usize = 31 << 10;
/// Requests recorded: 23.25 MiB of bodies, about twice one shard's `maxmemory`.
const REQUESTS: usize = 768;

fn limit(node: &RedisNode) {
    node.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    node.cmd(&["CONFIG", "SET", "maxmemory", &MAXMEMORY.to_string()]);
}

fn used_memory(node: &RedisNode) -> u64 {
    let info: String = node.raw(&["INFO", "memory"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn cpu_seconds(node: &RedisNode) -> f64 {
    let info: String = node.raw(&["INFO", "cpu"]).unwrap();
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|f| info.lines().find_map(|l| l.strip_prefix(f)))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// One request through the idempotency flow: its status, and whether it
/// was a replay of the recorded body.
async fn request(idem: &Idempotency, key: &str, body: &str) -> (u16, bool) {
    let headers = http::HeaderMap::new();
    let parts = RequestParts {
        method: "POST",
        path: "/pay",
        query: None,
        headers: &headers,
        body: body.as_bytes(),
    };
    match idem
        .begin(Some(IdempotencyKey::parse(key.as_bytes())), None, &parts)
        .await
    {
        Ok(Begin::Replay(r)) => (r.status, r.body.len() == BODY),
        Ok(Begin::Run(running)) => {
            let out = Bytes::from(vec![b'x'; BODY]);
            match running.finish(201, std::iter::empty(), Some(out)).await {
                Ok(_) => (201, false),
                Err(e) => (e.status().as_u16(), false),
            }
        }
        Ok(Begin::PassThrough) => (0, false),
        Err(e) => (e.status().as_u16(), false),
    }
}

/// Records `REQUESTS` responses, then replays them: (recorded, replayed,
/// statuses of the failures).
async fn record_and_replay(redlock: &Redlock) -> (usize, usize, Vec<u16>) {
    let idem = Idempotency::new(redlock.clone());
    let (mut recorded, mut replayed, mut failed) = (0, 0, Vec::new());
    for i in 0..REQUESTS {
        match request(&idem, &format!("scale-{i}"), "pay").await {
            (201, false) => recorded += 1,
            (status, _) => failed.push(status),
        }
    }
    for i in 0..REQUESTS {
        if request(&idem, &format!("scale-{i}"), "pay").await == (201, true) {
            replayed += 1;
        }
    }
    (recorded, replayed, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure for the report: run with --ignored --nocapture"]
async fn records_past_one_shards_memory_fit_cluster_nodes_not_single_servers() {
    let clusters = RedisClusters::start(3, 3, 0);
    for c in clusters.clusters() {
        c.masters().iter().for_each(|m| limit(m));
    }
    let (recorded, replayed, failed) = record_and_replay(&handle(&clusters)).await;
    let per_shard: Vec<Vec<u64>> = clusters
        .clusters()
        .iter()
        .map(|c| c.masters().iter().map(|m| used_memory(m) >> 10).collect())
        .collect();
    eprintln!(
        "cluster nodes: {recorded}/{REQUESTS} recorded, {replayed} replayed, failures {failed:?}; \
         used_memory per shard (KiB) {per_shard:?}, maxmemory {} KiB, bodies {} KiB",
        MAXMEMORY >> 10,
        (REQUESTS * BODY) >> 10
    );
    assert_eq!((recorded, replayed), (REQUESTS, REQUESTS));

    let singles = Cluster::start(3);
    singles.nodes().iter().for_each(|n| limit(n));
    let rl = Redlock::builder()
        .urls(singles.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let (recorded, replayed, failed) = record_and_replay(&rl).await;
    let used: Vec<u64> = singles
        .nodes()
        .iter()
        .map(|n| used_memory(n) >> 10)
        .collect();
    let mut statuses = failed.clone();
    statuses.dedup();
    eprintln!(
        "single servers: {recorded}/{REQUESTS} recorded, {replayed} replayed, {} failed with \
         statuses {statuses:?}; used_memory (KiB) {used:?}",
        failed.len()
    );
    assert!(recorded < REQUESTS);
    assert!(failed.iter().all(|&s| s == 503), "{statuses:?}");
}

/// p50 of lock+unlock pairs, and the servers' CPU per pair.
async fn pairs(redlock: &Redlock, servers: &[std::sync::Arc<RedisNode>]) -> (Duration, f64) {
    for i in 0..200 {
        let lock = redlock
            .try_lock(&format!("warm{i}"), Duration::from_secs(5))
            .await
            .unwrap();
        redlock.unlock(lock).await.unwrap();
    }
    let cpu0: f64 = servers.iter().map(|n| cpu_seconds(n)).sum();
    let n = 3000;
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        let lock = redlock
            .try_lock(&format!("pair{i}"), Duration::from_secs(5))
            .await
            .unwrap();
        redlock.unlock(lock).await.unwrap();
        took.push(start.elapsed());
    }
    let cpu = servers.iter().map(|n| cpu_seconds(n)).sum::<f64>() - cpu0;
    took.sort();
    (took[n / 2], cpu / n as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure for the report: run with --ignored --nocapture"]
async fn lock_unlock_p50_and_server_cpu_cluster_against_single_servers() {
    let clusters = RedisClusters::start(3, 3, 0);
    let on_clusters: Vec<_> = clusters.clusters().iter().flat_map(|c| c.nodes()).collect();
    let (p50_c, cpu_c) = pairs(&handle(&clusters), &on_clusters).await;
    let singles = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(singles.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let (p50_s, cpu_s) = pairs(&rl, singles.nodes()).await;
    eprintln!(
        "lock+unlock p50: 3 cluster nodes {p50_c:?}, 3 single servers {p50_s:?}; server CPU per \
         pair: cluster nodes {:.1} us, single servers {:.1} us",
        cpu_c * 1e6,
        cpu_s * 1e6
    );
}
