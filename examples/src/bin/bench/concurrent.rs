//! Scenario `concurrent`: many tasks on distinct keys, pairs per second against raw, with CPU, allocations and keys left.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// 2. 64 tasks on distinct keys for a fixed time.
///
/// The library, raw and rslock run in turn, in an order that rotates from
/// round to round.
pub(super) async fn concurrent(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Arc::new(Raw::new(&setup.pools).await?);
    let rsl = Arc::new(peer(setup));
    // Short blocks, many rounds: the machine's pace drifts by tens of percent
    // over minutes, and a contender's blocks should share its drift.
    let secs = env_or("BENCH_BLOCK_SECS", if setup.quick { 1.0 } else { 1.5 });
    let rounds = env_or("BENCH_ROUNDS", if setup.quick { 1.0 } else { 8.0 }) as usize;
    // Each round's library and rslock pairs/s over raw's.
    let mut per_round: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // Per contender (library, raw, rslock): pairs, seconds, client CPU, cost.
    let mut total = [0u64; 3];
    let mut time = [0.0f64; 3];
    let mut cpu = [Duration::ZERO; 3];
    let mut costs = [cost::Cost::default(); 3];
    // The library's coalesced node calls (issue 50): batches sent, the
    // operations they carried, and the largest.
    let (mut batches, mut batched, mut largest) = (0u64, 0u64, 0u64);
    // Each pair's time, lock to unlock, by contender: the 64-task p50 and
    // p99 (issue 50's "p99 at 64 tasks no worse than raw's").
    let latencies: Arc<[Samples; 3]> = Arc::new(Default::default());
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for round in 0..rounds {
        let mut rate = [0.0f64; 3];
        for pass in 0..3 {
            let who = (pass + round) % 3;
            if skipped(&only, who) {
                continue;
            }
            let before = cost::snapshot(&setup.pools).await?;
            let stats0 = redlock_core::coalesce_stats();
            let cpu0 = cpu_time();
            let start = Instant::now();
            let contenders = (lib.clone(), raw.clone(), rsl.clone());
            let latencies = Arc::clone(&latencies);
            let pairs = run_tasks(64, secs, move |t, i| {
                let (lib, raw, rsl) = contenders.clone();
                let latencies = Arc::clone(&latencies);
                let key = format!("bench:conc:{round}:{pass}:{t}:{i}");
                async move {
                    let started = Instant::now();
                    let ok = match who {
                        0 => match lib.mutex(&key).try_acquire(TTL).await {
                            Ok(l) => lib.unlock(l).await.is_ok(),
                            Err(_) => false,
                        },
                        1 => {
                            let tok = Raw::token();
                            let ok = raw.lock(&key, &tok).await;
                            if ok {
                                raw.unlock(&key, &tok).await;
                            }
                            ok
                        }
                        _ => match rsl.lock(key.as_str(), TTL).await {
                            Ok(l) => {
                                rsl.unlock(&l).await;
                                true
                            }
                            Err(_) => false,
                        },
                    };
                    if let Some(l) = latencies.get(who) {
                        l.record(started);
                    }
                    ok
                }
            })
            .await?;
            time[who] += start.elapsed().as_secs_f64();
            cpu[who] += cpu_time() - cpu0;
            if who == 0 {
                let stats = redlock_core::coalesce_stats();
                batches += stats.batches - stats0.batches;
                batched += stats.operations - stats0.operations;
                largest = largest.max(stats.largest);
            }
            let after = cost::snapshot(&setup.pools).await?;
            costs[who].add(before, after);
            total[who] += pairs;
            rate[who] = pairs as f64 / start.elapsed().as_secs_f64().max(1e-9);
        }
        if rate[1] > 0.0 {
            if std::env::var_os("BENCH_VERBOSE").is_some() {
                eprintln!(
                    "round {round}: library {:.0}, raw {:.0}, rslock {:.0} pairs/s",
                    rate[0], rate[1], rate[2]
                );
            }
            per_round[0].push(rate[0] / rate[1]);
            per_round[1].push(rate[2] / rate[1]);
        }
    }
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        // Exact pair counts, for instruction counts per pair (callgrind).
        eprintln!(
            "pairs: library {}, raw {}, rslock {}",
            total[0], total[1], total[2]
        );
    }
    header3("2. 64 tasks, distinct keys");
    let per_s = |w: usize| total[w] as f64 / time[w].max(1e-9);
    row3(
        "lock+unlock pairs/s",
        per_s(0),
        per_s(1),
        per_s(2),
        "pairs/s",
    );
    let spread =
        |v: &[f64], pick: fn(f64, f64) -> f64| v.iter().copied().reduce(pick).unwrap_or(f64::NAN);
    println!(
        "| {:<38} | {:>12.3} | {:>12.3} | {:<8} | {:>6} | {:>12.3} | {:>6} |",
        "  each round's pairs/s ×raw, min",
        spread(&per_round[0], f64::min),
        1.0,
        "ratio",
        "",
        spread(&per_round[1], f64::min),
        ""
    );
    println!(
        "| {:<38} | {:>12.3} | {:>12.3} | {:<8} | {:>6} | {:>12.3} | {:>6} |",
        "  each round's pairs/s ×raw, max",
        spread(&per_round[0], f64::max),
        1.0,
        "ratio",
        "",
        spread(&per_round[1], f64::max),
        ""
    );
    let stats: Vec<Stats> = latencies.iter().map(Samples::take).collect();
    for (name, p) in [("pair latency p50", 0.5), ("pair latency p99", 0.99)] {
        row3(
            name,
            us(stats[0].pct(p)),
            us(stats[1].pct(p)),
            us(stats[2].pct(p)),
            "µs",
        );
    }
    let per_pair = |w: usize, x: f64| x / total[w].max(1) as f64;
    row3(
        "client CPU per pair",
        per_pair(0, us(cpu[0])),
        per_pair(1, us(cpu[1])),
        per_pair(2, us(cpu[2])),
        "µs",
    );
    // Each contender's costs per pair, in the table's order: what is counted
    // for all nodes together is divided by the node count when `per_node`.
    let n = setup.pools.len().max(1) as f64;
    type Row = (&'static str, fn(&cost::Cost) -> f64, bool, &'static str);
    let rows: [Row; 8] = [
        (
            "allocations per pair (client)",
            |c| c.allocations as f64,
            false,
            "allocs",
        ),
        (
            "server CPU per pair (all nodes)",
            |c| us(c.server_cpu),
            false,
            "µs",
        ),
        (
            "  of it in commands (commandstats usec)",
            |c| us(c.command_time),
            false,
            "µs",
        ),
        (
            "commands per node per pair",
            |c| c.commands as f64,
            true,
            "cmds",
        ),
        (
            "node socket reads per node per pair",
            |c| c.server_reads as f64,
            true,
            "reads",
        ),
        (
            "node socket writes per node per pair",
            |c| c.server_writes as f64,
            true,
            "writes",
        ),
        (
            "client read+write syscalls per pair",
            |c| c.client_syscalls as f64,
            false,
            "calls",
        ),
        (
            "client context switches per pair",
            |c| c.client_switches as f64,
            false,
            "switches",
        ),
    ];
    for (name, value, per_node, unit) in rows {
        let at = |w: usize| per_pair(w, value(&costs[w])) / if per_node { n } else { 1.0 };
        row3(name, at(0), at(1), at(2), unit);
    }
    // Each pair is an acquire and a release on every node.
    let ops = (total[0] * 2 * setup.pools.len() as u64).max(1);
    println!(
        "| {:<38} | {:>12.1} | {:>12} | {:<8} | {:>6} | {:>12} | {:>6} |",
        "  coalesced batches: mean operations",
        batched as f64 / batches.max(1) as f64,
        "",
        "ops",
        "",
        "",
        ""
    );
    println!(
        "| {:<38} | {:>12} | {:>12} | {:<8} | {:>6} | {:>12} | {:>6} |",
        "  coalesced batches: largest", largest, "", "ops", "", "", ""
    );
    println!(
        "| {:<38} | {:>12.1} | {:>12} | {:<8} | {:>6} | {:>12} | {:>6} |",
        "  node operations sent in a batch",
        100.0 * batched as f64 / ops as f64,
        "",
        "%",
        "",
        "",
        ""
    );
    let left = keys_left(setup, rounds).await?;
    row3(
        "keys left on the nodes after 2 s",
        left[0] as f64,
        left[1] as f64,
        left[2] as f64,
        "keys",
    );
    Ok(())
}
