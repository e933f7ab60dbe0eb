//! Scenario `sequential`: one lock+unlock pair at a time, library against raw commands and rslock; and the task runner the concurrent scenarios share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self};

use super::*;

/// 1. Sequential lock+unlock on distinct keys.
pub(super) async fn sequential(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let (blocks, per_block) = if setup.quick { (4, 250) } else { (10, 600) };
    // Warm-up both paths (connections, script caches).
    for i in 0..300 {
        let l = lib
            .mutex(format!("bench:warm:{i}"))
            .try_acquire(TTL)
            .await?;
        lib.unlock(l).await?;
        let t = Raw::token();
        raw.lock(&format!("bench:rwarm:{i}"), &t).await;
        raw.unlock(&format!("bench:rwarm:{i}"), &t).await;
    }
    let rsl = peer(setup);
    for i in 0..300 {
        let l = rsl.lock(format!("bench:pwarm:{i}").as_str(), TTL).await?;
        rsl.unlock(&l).await;
    }
    let (mut lib_lat, mut raw_lat, mut peer_lat) = (Vec::new(), Vec::new(), Vec::new());
    let mut n = 0u64;
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for b in 0..blocks {
        for pass in 0..3 {
            // Which of library (0), raw (1) and rslock (2) runs, in an order
            // that rotates from block to block.
            let who = (pass + b) % 3;
            let run_lib = who == 0;
            if skipped(&only, who) {
                continue;
            }
            for _ in 0..per_block {
                n += 1;
                let key = format!("bench:seq:{n}");
                let start = Instant::now();
                if who == 2 {
                    let l = rsl.lock(key.as_str(), TTL).await?;
                    rsl.unlock(&l).await;
                    peer_lat.push(start.elapsed());
                } else if run_lib {
                    let l = lib.mutex(&key).try_acquire(TTL).await?;
                    lib.unlock(l).await?;
                    lib_lat.push(start.elapsed());
                } else {
                    let t = Raw::token();
                    if !raw.lock(&key, &t).await {
                        return Err("raw lock failed".into());
                    }
                    raw.unlock(&key, &t).await;
                    raw_lat.push(start.elapsed());
                }
            }
        }
    }
    let (l, r, p) = (
        Stats::new(lib_lat),
        Stats::new(raw_lat),
        Stats::new(peer_lat),
    );
    header3(&format!(
        "1. sequential lock+unlock, distinct keys ({} pairs each)",
        l.sorted.len()
    ));
    row3("p50", us(l.pct(0.5)), us(r.pct(0.5)), us(p.pct(0.5)), "µs");
    row3(
        "p99",
        us(l.pct(0.99)),
        us(r.pct(0.99)),
        us(p.pct(0.99)),
        "µs",
    );
    row3("max", us(l.max()), us(r.max()), us(p.max()), "µs");
    Ok(())
}

/// `tasks` tasks, each running `pair(task, i)` for i = 1, 2, .. until `secs`
/// are up: how many pairs said `true`.
pub(super) async fn run_tasks<F, Fut>(tasks: usize, secs: f64, pair: F) -> Result<u64, BoxError>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (stop, count, pair) = (stop.clone(), count.clone(), pair.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if pair(t, i).await {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await?;
    }
    Ok(count.load(Ordering::Relaxed))
}

/// How many of the 64-task scenario's keys are still on the nodes (all
/// nodes together) 2 s after its last round, by contender (library, raw,
/// rslock): every pair was released, and whatever a release left to the
/// background has ended by then, so each one is a key left to expire with
/// its TTL (10 s).
pub(super) async fn keys_left(setup: &Setup, rounds: usize) -> Result<[u64; 3], BoxError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut left = [0u64; 3];
    for pool in &setup.pools {
        let mut conn = pool.get().await?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("bench:conc:*")
            .query_async(&mut conn)
            .await?;
        for key in keys {
            // bench:conc:{round}:{pass}:{task}:{pair}
            let mut parts = key.split(':').skip(2).map(str::parse::<usize>);
            if let (Some(Ok(round)), Some(Ok(pass))) = (parts.next(), parts.next())
                && round < rounds
            {
                left[(pass + round) % 3] += 1;
            }
        }
    }
    Ok(left)
}
