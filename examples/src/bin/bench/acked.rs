//! Scenario `acked` (not in `all`): replica acks with and without the
//! coalescer (issue 50). Its own 3 primaries (`BENCH_ACKED_NODES`), each with one replica
//! (`--replicaof`, no proxy between), and every node's writes acknowledged
//! by its replica (`NodeSpec::replica_acks(1, ..)`).
//!
//! ```sh
//! cargo run --release -p redlock-examples --bin bench -- acked
//! ```
//!
//! 64 tasks on distinct keys, lock+unlock pairs for a fixed time, three
//! contenders in turn (the order rotating per round):
//!
//! - the library with the coalescer (`coalesce(true)`): a batch that wrote
//!   waits for the replicas by one `WAIT` after its pipeline;
//! - the library without it: one `WAIT` after each write;
//! - raw: `SET NX PX` then `WAIT 1` on every primary, then the
//!   compare-and-delete script, on one multiplexed connection per node.
//!
//! It prints pairs/s (each against raw), each round's ratio, the `WAIT`s
//! the primaries ran per pair (`INFO commandstats`), and the p50 and p99 of
//! a pair.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::NodeSpec;
use redlock_tests::RedisNode;
use redlock_tests::replicas::replication_field;
use redlock_tests::util::eventually;

use super::*;

/// How long a `WAIT` may take, and the node timeout that leaves it room.
const ACK_TIMEOUT: Duration = Duration::from_millis(500);
const ACKED_NODE_TIMEOUT: Duration = Duration::from_secs(1);
const TASKS: usize = 64;

/// The primaries and their replicas, killed when dropped.
struct Groups {
    primaries: Vec<RedisNode>,
    replicas: Vec<RedisNode>,
}

async fn start_groups(n: usize) -> Result<Groups, BoxError> {
    let primaries: Vec<RedisNode> = (0..n).map(|_| RedisNode::start()).collect();
    let replicas: Vec<RedisNode> = primaries
        .iter()
        .map(|p| RedisNode::start_with(&["--replicaof", "127.0.0.1", &p.port().to_string()]))
        .collect();
    for (p, r) in primaries.iter().zip(&replicas) {
        let synced = eventually(Duration::from_secs(20), || {
            replication_field(r, "master_link_status").as_deref() == Some("up")
                && replication_field(p, "connected_slaves").as_deref() == Some("1")
        })
        .await;
        if !synced {
            return Err("a replica did not sync with its primary in 20 s".into());
        }
    }
    Ok(Groups {
        primaries,
        replicas,
    })
}

/// `WAIT` calls the primaries ran so far, summed.
fn waits_run(groups: &Groups) -> u64 {
    groups
        .primaries
        .iter()
        .map(|n| {
            let info: String = n.raw(&["INFO", "commandstats"]).unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_wait:"))
                .and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn handle(groups: &Groups, coalesce: bool) -> Result<Redlock, Error> {
    groups
        .primaries
        .iter()
        .fold(Redlock::builder(), |b, p| {
            b.node(NodeSpec::url(p.url()).replica_acks(1, ACK_TIMEOUT))
        })
        .node_timeout(ACKED_NODE_TIMEOUT)
        .retry(redlock_core::RetryPolicy::no_retry())
        .coalesce(coalesce)
        .build()
}

/// Raw with acks: `SET NX PX`, then `WAIT 1` on the same connection, on
/// every node at once; a quorum of acknowledged `SET`s holds.
async fn raw_acked_lock(raw: &Raw, key: &str, token: &str) -> bool {
    let ttl = TTL.as_millis() as u64;
    let wait_ms = ACK_TIMEOUT.as_millis() as u64;
    let oks = join_all(raw.conns.iter().map(|c| {
        let mut c = c.clone();
        async move {
            let call = async {
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl)
                    .query_async(&mut c)
                    .await
                    .ok()?;
                set?;
                let acked: i64 = redis::cmd("WAIT")
                    .arg(1)
                    .arg(wait_ms)
                    .query_async(&mut c)
                    .await
                    .ok()?;
                (acked >= 1).then_some(())
            };
            matches!(
                tokio::time::timeout(ACKED_NODE_TIMEOUT, call).await,
                Ok(Some(()))
            )
        }
    }))
    .await;
    oks.into_iter().filter(|b| *b).count() > raw.conns.len() / 2
}

/// One lock+unlock pair of contender `who` on `key`: the library with the
/// coalescer (0), without it (1), or raw (2). Whether it held.
async fn pair(libs: &[Redlock; 2], raw: &Raw, who: usize, key: &str) -> bool {
    match libs.get(who) {
        Some(lib) => match lib.mutex(key).try_acquire(TTL).await {
            Ok(l) => lib.unlock(l).await.is_ok(),
            Err(_) => false,
        },
        None => {
            let tok = Raw::token();
            let ok = raw_acked_lock(raw, key, &tok).await;
            raw.unlock(key, &tok).await;
            ok
        }
    }
}

/// Scenario `acked`.
pub(crate) async fn acked(setup: &Setup) -> Result<(), BoxError> {
    let n = env_or("BENCH_ACKED_NODES", 3.0) as usize;
    let groups = start_groups(n.max(1)).await?;
    let pools: Vec<deadpool_redis::Pool> = groups
        .primaries
        .iter()
        .map(|p| {
            deadpool_redis::Config::from_url(p.url())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        })
        .collect::<Result<_, _>>()?;
    // Every server, replicas too, for the CPU per pair.
    let every: Vec<deadpool_redis::Pool> = groups
        .primaries
        .iter()
        .chain(&groups.replicas)
        .map(|p| {
            deadpool_redis::Config::from_url(p.url())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        })
        .collect::<Result<_, _>>()?;
    let libs = [handle(&groups, true)?, handle(&groups, false)?];
    let raw = Arc::new(Raw::new(&pools).await?);
    // Warm-up: connections and scripts.
    for lib in &libs {
        let lock = lib.mutex("bench:acked:warm").try_acquire(TTL).await?;
        lib.unlock(lock).await?;
    }
    let secs = env_or("BENCH_BLOCK_SECS", if setup.quick { 0.5 } else { 1.5 });
    let rounds = env_or("BENCH_ROUNDS", if setup.quick { 1.0 } else { 6.0 }) as usize;
    // Per contender (coalesced, not, raw): pairs, seconds, WAITs.
    let mut total = [0u64; 3];
    let mut time = [0.0f64; 3];
    let mut waits = [0u64; 3];
    let mut costs = [cost::Cost::default(); 3];
    let mut per_round: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let latencies: Arc<[Samples; 3]> = Arc::new(Default::default());
    let (mut batches, mut batched) = (0u64, 0u64);
    for round in 0..rounds {
        let mut rate = [0.0f64; 3];
        for pass in 0..3 {
            let who = (pass + round) % 3;
            let waits0 = waits_run(&groups);
            let before = cost::snapshot(&every).await?;
            let stats0 = redlock_core::coalesce_stats();
            let start = Instant::now();
            let contenders = (libs.clone(), Arc::clone(&raw), Arc::clone(&latencies));
            let pairs = run_tasks(TASKS, secs, move |t, i| {
                let (libs, raw, latencies) = contenders.clone();
                let key = format!("bench:acked:{round}:{pass}:{t}:{i}");
                async move {
                    let started = Instant::now();
                    let ok = pair(&libs, &raw, who, &key).await;
                    if let Some(l) = latencies.get(who) {
                        l.record(started);
                    }
                    ok
                }
            })
            .await?;
            time[who] += start.elapsed().as_secs_f64();
            costs[who].add(before, cost::snapshot(&every).await?);
            total[who] += pairs;
            waits[who] += waits_run(&groups).saturating_sub(waits0);
            rate[who] = pairs as f64 / start.elapsed().as_secs_f64().max(1e-9);
            if who == 0 {
                let stats = redlock_core::coalesce_stats();
                batches += stats.batches - stats0.batches;
                batched += stats.operations - stats0.operations;
            }
        }
        if rate[2] > 0.0 {
            per_round[0].push(rate[0] / rate[2]);
            per_round[1].push(rate[1] / rate[2]);
        }
    }
    let names = ["library, coalesced", "library, alone", "raw"];
    println!(
        "\n### acked: replica acks (WAIT 1), {n} primaries with a replica each, {TASKS} tasks, distinct keys\n"
    );
    println!(
        "| contender | pairs/s | ×raw | each round ×raw (min–max) | WAITs per pair | server CPU µs/pair | client CPU µs/pair | p50 µs | p99 µs |"
    );
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|");
    let per_s = |w: usize| total[w] as f64 / time[w].max(1e-9);
    let spread = |v: &[f64]| {
        let min = v.iter().copied().reduce(f64::min).unwrap_or(f64::NAN);
        let max = v.iter().copied().reduce(f64::max).unwrap_or(f64::NAN);
        format!("{min:.2}–{max:.2}")
    };
    for (w, name) in names.iter().enumerate() {
        let stats = latencies[w].take();
        let ratio = per_s(w) / per_s(2).max(1e-9);
        let rounds = per_round
            .get(w)
            .map_or_else(|| "1".to_owned(), |v| spread(v));
        let per_pair = |d: Duration| us(d) / total[w].max(1) as f64;
        println!(
            "| {name} | {:.0} | {ratio:.2} | {rounds} | {:.3} | {:.1} | {:.1} | {:.0} | {:.0} |",
            per_s(w),
            waits[w] as f64 / total[w].max(1) as f64,
            per_pair(costs[w].server_cpu),
            per_pair(costs[w].client_cpu),
            us(stats.pct(0.50)),
            us(stats.pct(0.99)),
        );
    }
    println!(
        "\ncoalesced: {batches} batches of {batched} operations ({:.1} per batch)",
        batched as f64 / batches.max(1) as f64
    );
    // One task: a lone lock goes alone, at once, coalescer or not.
    let mut p50 = [Duration::ZERO; 3];
    for (who, p) in p50.iter_mut().enumerate() {
        let lat: Arc<Samples> = Arc::default();
        let contenders = (libs.clone(), Arc::clone(&raw), Arc::clone(&lat));
        run_tasks(1, secs, move |_, i| {
            let (libs, raw, lat) = contenders.clone();
            let key = format!("bench:acked:seq:{who}:{i}");
            async move {
                let started = Instant::now();
                let ok = pair(&libs, &raw, who, &key).await;
                lat.record(started);
                ok
            }
        })
        .await?;
        *p = lat.take().pct(0.50);
    }
    println!(
        "sequential (1 task) pair p50: coalesced {:.0} µs ({:.2}× raw), alone {:.0} µs, raw {:.0} µs",
        us(p50[0]),
        us(p50[0]) / us(p50[2]).max(1e-9),
        us(p50[1]),
        us(p50[2])
    );
    Ok(())
}
