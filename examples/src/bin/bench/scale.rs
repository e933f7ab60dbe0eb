//! Scenario 11: many auto-extended locks of one handle held at once, renewed
//! by its renewal schedule. Locks are taken 100 at a time, held, then released
//! 100 at a time; while they are held this reports the process's CPU and RSS,
//! the renewal calls each node ran (`INFO commandstats`: `EVALSHA` and `EVAL`;
//! nothing else runs scripts meanwhile, and the `GET`s and `PEXPIRE`s the
//! scripts run are counted apart by Redis), and the locks lost (must be 0).
//!
//! ```sh
//! cargo run --release -p redlock-examples --bin bench -- scale                 # 10k, then 100k locks, 30 s each
//! BENCH_SCALE_LOCKS=100000 cargo run --release -p redlock-examples --bin bench -- scale
//! ```

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use futures_util::future::join_all;
use redlock_core::LockOptions;

use crate::{BoxError, Setup, cost, cpu_time, redlock, rss_kib};

/// Runs the scenario at each size: 1,000 locks for 4 s with a 2 s TTL under
/// `--quick` (several renewals each, in a few seconds), else 10,000 and
/// 100,000 for 30 s with a 10 s TTL (or the one size `BENCH_SCALE_LOCKS` names).
pub(crate) async fn scale(setup: &Setup) -> Result<(), BoxError> {
    let sizes: Vec<usize> = match std::env::var("BENCH_SCALE_LOCKS") {
        Ok(v) => vec![v.trim().parse()?],
        Err(_) if setup.quick => vec![1_000],
        Err(_) => vec![10_000, 100_000],
    };
    let (hold, ttl) = if setup.quick {
        (Duration::from_secs(4), Duration::from_secs(2))
    } else {
        (Duration::from_secs(30), Duration::from_secs(10))
    };
    for count in sizes {
        one(setup, count, hold, ttl).await?;
    }
    Ok(())
}

/// Script calls (`EVALSHA`, `EVAL`) every node of `pools` ran so far, summed.
async fn script_calls(pools: &[deadpool_redis::Pool]) -> Result<u64, BoxError> {
    let mut calls = 0;
    for p in pools {
        let mut c = p.get().await?;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await?;
        calls += stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    Ok(calls)
}

async fn one(setup: &Setup, count: usize, hold: Duration, ttl: Duration) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let opts = LockOptions::new(ttl);
    let rss_before = rss_kib("VmRSS:");
    let mut guards = Vec::with_capacity(count);
    let mut acquire_failed = 0usize;
    let mut first_failure = None;
    let start = Instant::now();
    for chunk in 0..count.div_ceil(100) {
        let futs = (0..100.min(count - chunk * 100)).map(|i| {
            let (lib, opts) = (lib.clone(), opts.clone());
            let key = format!("bench:scale:{count}:{}", chunk * 100 + i);
            async move { lib.mutex(&key).guard(&opts).await }
        });
        for g in join_all(futs).await {
            match g {
                Ok(g) => guards.push(g),
                Err(e) => {
                    acquire_failed += 1;
                    first_failure.get_or_insert_with(|| (guards.len(), e.to_string()));
                }
            }
        }
    }
    let acquire_time = start.elapsed();
    let before = cost::snapshot(&setup.pools).await?;
    let calls0 = script_calls(&setup.pools).await?;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let ext0: u64 = guards
        .iter()
        .map(|g| u64::from(g.handle().extensions()))
        .sum();
    tokio::time::sleep(hold).await;
    let ext1: u64 = guards
        .iter()
        .map(|g| u64::from(g.handle().extensions()))
        .sum();
    let cpu = cpu_time().saturating_sub(cpu0);
    let wall = t0.elapsed();
    let after = cost::snapshot(&setup.pools).await?;
    let calls = script_calls(&setup.pools).await?.saturating_sub(calls0) as f64;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let rss_held = rss_kib("VmRSS:");
    let mut spent = cost::Cost::default();
    spent.add(before, after);
    let start = Instant::now();
    let mut release_failed = 0;
    let mut guards = guards.into_iter();
    loop {
        let chunk: Vec<_> = guards.by_ref().take(100).collect();
        if chunk.is_empty() {
            break;
        }
        let releases = join_all(chunk.into_iter().map(|g| g.release())).await;
        release_failed += releases.iter().filter(|r| r.is_err()).count();
    }
    let release_time = start.elapsed();
    let nodes = setup.pools.len().max(1) as f64;
    let secs = wall.as_secs_f64().max(1e-9);
    let renewals = ext1.saturating_sub(ext0);
    println!(
        "\n### 11. scale: {count} auto-extended locks held for {hold:?} (ttl {ttl:?}), {} nodes\n",
        setup.pools.len()
    );
    println!("| metric | value |");
    println!("|---|---|");
    println!(
        "| acquire all, 100 at a time | {:.2} s, {acquire_failed} failed{} |",
        acquire_time.as_secs_f64(),
        first_failure
            .map(|(at, e)| format!(" (first after {at} held: {e})"))
            .unwrap_or_default()
    );
    println!(
        "| client CPU while held | {:.2} s over {secs:.1} s = {:.1}% of one core |",
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / secs
    );
    println!(
        "| server CPU while held (all nodes) | {:.2} s = {:.1}% of one core |",
        spent.server_cpu.as_secs_f64(),
        100.0 * spent.server_cpu.as_secs_f64() / secs
    );
    println!(
        "| RSS before / while held | {:.1} / {:.1} MiB ({:.0} B per lock) |",
        rss_before as f64 / 1024.0,
        rss_held as f64 / 1024.0,
        (rss_held.saturating_sub(rss_before) as f64 * 1024.0) / count.max(1) as f64
    );
    println!(
        "| renewals (lock extensions) | {renewals} = {:.0}/s |",
        renewals as f64 / secs
    );
    println!(
        "| renewal calls per node | {:.1}/s ({:.1} locks per call) |",
        calls / nodes / secs,
        renewals as f64 / (calls / nodes).max(1.0)
    );
    println!("| locks lost while held | {lost} |");
    println!(
        "| release all, 100 at a time | {:.2} s, {release_failed} failed |",
        release_time.as_secs_f64()
    );
    Ok(())
}
