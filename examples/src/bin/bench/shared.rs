//! Scenario `shared`: the semaphore and the read/write lock (issue 41)
//! against the mutex, in the same run.
//!
//! 1. Permit acquire+release p50 (4 permits, one resource per pair, so the
//!    first slot tried is free) against the mutex's lock+unlock, distinct keys.
//! 2. 16 tasks on one resource with 4 permits, acquisitions/s, against 16
//!    tasks on 4 independent mutex keys (4 tasks each), both with the same
//!    retry policy: the price of slots over separate locks.
//! 3. Shared-lock (`Access::Shared`) acquire p50 against the mutex's acquire,
//!    distinct keys (the release is not timed).
//!
//! Library and mutex runs alternate in blocks.

use std::time::{Duration, Instant};

use redlock_core::{Access, RetryPolicy};

use super::*;

const PERMITS: u32 = 4;

fn table(title: &str, names: [&str; 2]) {
    println!("\n### {title}\n");
    println!(
        "| {:<38} | {:>12} | {:>12} | {:<8} | {:>6} |",
        "metric", names[0], names[1], "unit", "ratio"
    );
    println!(
        "|{:-<40}|{:->14}|{:->14}|{:-<10}|{:->8}|",
        "", "", "", "", ""
    );
}

fn contended_retry() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(2))
        .with_delay(Duration::from_millis(1))
        .with_jitter(Duration::from_millis(2))
}

/// The three measurements (see the module's text).
pub(super) async fn shared(setup: &Setup) -> Result<(), BoxError> {
    let rl = redlock(setup)?;
    let (blocks, per_block) = if setup.quick { (2, 100) } else { (10, 400) };
    for i in 0..200 {
        let l = rl
            .mutex(format!("bench:swarm:{i}"))
            .try_acquire(TTL)
            .await?;
        rl.unlock(l).await?;
        let p = rl
            .semaphore(format!("bench:swarm:p:{i}"), PERMITS)?
            .try_acquire(TTL)
            .await?;
        rl.unlock(p).await?;
    }

    // 1 and 3: [permit pair, mutex pair, shared acquire, mutex acquire].
    let mut lat: [Vec<Duration>; 4] = Default::default();
    let mut n = 0u64;
    for b in 0..blocks {
        for pass in 0..4 {
            let which = (pass + b) % 4;
            for _ in 0..per_block {
                n += 1;
                let key = format!("bench:shared:{which}:{n}");
                let start = Instant::now();
                let elapsed = match which {
                    0 => {
                        let l = rl.semaphore(&key, PERMITS)?.try_acquire(TTL).await?;
                        rl.unlock(l).await?;
                        start.elapsed()
                    }
                    1 | 3 => {
                        let l = rl.mutex(&key).try_acquire(TTL).await?;
                        let took = start.elapsed();
                        rl.unlock(l).await?;
                        if which == 1 { start.elapsed() } else { took }
                    }
                    _ => {
                        let l = rl.rw_lock(&key, Access::Shared).try_acquire(TTL).await?;
                        let took = start.elapsed();
                        rl.unlock(l).await?;
                        took
                    }
                };
                lat[which].push(elapsed);
            }
        }
    }
    let [permit, mutex, shared, mutex_acq] = lat.map(Stats::new);
    table(
        &format!(
            "permit ({PERMITS} permits) vs mutex acquire+release, distinct keys ({} pairs each)",
            permit.sorted.len()
        ),
        ["permit", "mutex"],
    );
    row("p50", us(permit.pct(0.5)), us(mutex.pct(0.5)), "µs");
    row("p99", us(permit.pct(0.99)), us(mutex.pct(0.99)), "µs");

    // 2: 16 tasks, one resource of 4 permits against 4 mutex keys.
    let secs = env_or("BENCH_BLOCK_SECS", if setup.quick { 1.0 } else { 2.0 });
    let rounds = if setup.quick { 1 } else { 4 };
    let (mut taken, mut time) = ([0u64; 2], [0.0f64; 2]);
    for round in 0..rounds {
        for pass in 0..2 {
            let which = (pass + round) % 2;
            let rl = rl.clone();
            let start = Instant::now();
            let pairs = run_tasks(16, secs, move |t, _| {
                let rl = rl.clone();
                async move {
                    let retry = contended_retry();
                    let lock = if which == 0 {
                        match rl.semaphore(format!("bench:sem16:{round}"), PERMITS) {
                            Ok(sem) => sem.acquire_with(TTL, &retry).await,
                            Err(e) => Err(e),
                        }
                    } else {
                        let key = format!("bench:mx16:{round}:{}", t % PERMITS as usize);
                        rl.mutex(&key).acquire_with(TTL, &retry).await
                    };
                    match lock {
                        Ok(l) => rl.unlock(l).await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
            .await?;
            time[which] += start.elapsed().as_secs_f64();
            taken[which] += pairs;
        }
    }
    let rate = |w: usize| taken[w] as f64 / time[w].max(1e-9);
    table(
        &format!("16 tasks: one resource, {PERMITS} permits vs {PERMITS} independent mutex keys"),
        ["permits", "4 mutexes"],
    );
    row("acquisitions/s", rate(0), rate(1), "1/s");

    table(
        &format!(
            "shared (read) lock vs mutex acquire, distinct keys ({} each)",
            shared.sorted.len()
        ),
        ["shared", "mutex"],
    );
    row("p50", us(shared.pct(0.5)), us(mutex_acq.pct(0.5)), "µs");
    row("p99", us(shared.pct(0.99)), us(mutex_acq.pct(0.99)), "µs");
    Ok(())
}
