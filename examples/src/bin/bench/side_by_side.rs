//! `side-by-side`: the library's tasks and raw's at the same time, on
//! distinct keys (not in `all`). Scenario 2 runs each contender alone in
//! turn, and this machine's pace drifts between its blocks by more than the
//! differences it is asked to show; here both sides share every moment of
//! the run. Each task runs one pair after another, so a side's pairs count
//! how soon its pairs complete while the machine is shared: the library
//! returns at a quorum of answers (3 of 5) and leaves the last ones to its
//! background task, where raw waits for all five. It is not a measure of
//! CPU per pair (the process's CPU cannot be split between the sides), and
//! it does not replace scenario 2's targets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{BoxError, Raw, Setup, TTL, env_or, redlock};

/// Each side's task count and pairs per block, and the ratio of the sums.
pub(super) async fn side_by_side(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Arc::new(Raw::new(&setup.pools).await?);
    let per_side = env_or("BENCH_TASKS_PER_SIDE", 32.0) as usize;
    let secs = env_or("BENCH_BLOCK_SECS", if setup.quick { 1.0 } else { 1.5 });
    let rounds = env_or("BENCH_ROUNDS", if setup.quick { 2.0 } else { 16.0 }) as usize;
    let (mut lib_total, mut raw_total) = (0u64, 0u64);
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let mut handles = Vec::new();
        for t in 0..per_side * 2 {
            let (stop, counts, lib, raw) = (
                Arc::clone(&stop),
                Arc::clone(&counts),
                lib.clone(),
                Arc::clone(&raw),
            );
            // Library and raw tasks alternate, so neither starts first.
            let side = t % 2;
            handles.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("bench:side:{round}:{t}:{i}");
                    let ok = if side == 0 {
                        match lib.mutex(&key).try_acquire(TTL).await {
                            Ok(l) => lib.unlock(l).await.is_ok(),
                            Err(_) => false,
                        }
                    } else {
                        let tok = Raw::token();
                        let ok = raw.lock(&key, &tok).await;
                        if ok {
                            raw.unlock(&key, &tok).await;
                        }
                        ok
                    };
                    if ok {
                        counts[side].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.await?;
        }
        let (l, r) = (
            counts[0].load(Ordering::Relaxed),
            counts[1].load(Ordering::Relaxed),
        );
        lib_total += l;
        raw_total += r;
        if r > 0 {
            ratios.push(l as f64 / r as f64);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        ratios
            .get(((ratios.len().saturating_sub(1)) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!();
    println!(
        "### side by side: {per_side} library tasks and {per_side} raw tasks at once, distinct keys ({rounds} blocks of {secs} s)"
    );
    println!();
    println!("| metric | value |");
    println!("|---|---|");
    println!(
        "| library pairs / raw pairs, whole run | {:.3} ({lib_total} / {raw_total}) |",
        lib_total as f64 / raw_total.max(1) as f64
    );
    println!(
        "| per block: min, median, max | {:.3}, {:.3}, {:.3} |",
        pick(0.0),
        pick(0.5),
        pick(1.0)
    );
    Ok(())
}
