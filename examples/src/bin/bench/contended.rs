//! Scenario `contended`: tasks fighting for a few keys, in rotating blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock_core::RetryPolicy;

use super::*;

/// Scenario 3, 16 tasks on one key, in turn: the library waiting
/// (`lock_with`), the library trying in a loop (`try_lock`, then the raw
/// loop's sleep), the raw loop, and rslock (one attempt, then the same sleep).
/// Four rounds of 1 s blocks, one per contender, in an order that rotates
/// (`BENCH_CONTENDED_ROUNDS`, `BENCH_CONTENDED_BLOCK_SECS`).
pub(super) async fn contended(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Arc::new(Raw::new(&setup.pools).await?);
    let rsl = Arc::new(peer(setup));
    // Short blocks whose order rotates from round to round, as in scenario
    // 2: the machine's pace drifts, and a contender's blocks should share its
    // drift instead of one contender taking the fast minute.
    let rounds = env_or(
        "BENCH_CONTENDED_ROUNDS",
        if setup.quick { 1.0 } else { 4.0 },
    ) as usize;
    let secs = env_or("BENCH_CONTENDED_BLOCK_SECS", 1.0);
    let delay = Duration::from_millis(5);
    let jitter = Duration::from_millis(10);
    // 0: library wait, 1: raw, 2: rslock, 3: library try_lock loop; each
    // one's acquisitions, seconds, handoffs and costs over its blocks.
    let order = [0u8, 3, 1, 2];
    let mut acquired = [0u64; 4];
    let mut time = [0.0f64; 4];
    let mut handed: [Vec<Duration>; 4] = Default::default();
    let mut costs = [cost::Cost::default(); 4];
    for (round, pass) in (0..rounds).flat_map(|r| (0..4).map(move |p| (r, p))) {
        let slot = (pass + round) % 4;
        let who = order[slot];
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        // Instant (as ns since `t0`) of the last release; the next acquire measures from it.
        let t0 = Instant::now();
        let last_release = Arc::new(AtomicU64::new(0));
        let handoffs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let key: &'static str = match who {
            0 => "bench:contended:lib",
            3 => "bench:contended:try",
            1 => "bench:contended:raw",
            _ => "bench:contended:rslock",
        };
        let before = cost::snapshot(&setup.pools).await?;
        let start = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (stop, count, lib, raw, rsl) = (
                    stop.clone(),
                    count.clone(),
                    lib.clone(),
                    raw.clone(),
                    rsl.clone(),
                );
                let (last_release, handoffs) = (last_release.clone(), handoffs.clone());
                tokio::spawn(async move {
                    let policy = RetryPolicy::deadline(Duration::from_secs(30))
                        .with_delay(delay)
                        .with_jitter(jitter);
                    let pause = || async {
                        let extra = rand_below(jitter.as_micros() as u64);
                        tokio::time::sleep(delay + Duration::from_micros(extra)).await;
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let tok = Raw::token();
                        let mut lib_lock = None;
                        let mut peer_lock = None;
                        let mut ok = false;
                        match who {
                            0 => {
                                lib_lock = lib.mutex(key).acquire_with(TTL, &policy).await.ok();
                                ok = lib_lock.is_some();
                            }
                            3 => {
                                while !stop.load(Ordering::Relaxed) {
                                    if let Ok(l) = lib.mutex(key).try_acquire(TTL).await {
                                        lib_lock = Some(l);
                                        ok = true;
                                        break;
                                    }
                                    pause().await;
                                }
                            }
                            1 => {
                                while !stop.load(Ordering::Relaxed) {
                                    if raw.lock(key, &tok).await {
                                        ok = true;
                                        break;
                                    }
                                    raw.unlock(key, &tok).await;
                                    pause().await;
                                }
                            }
                            _ => {
                                while !stop.load(Ordering::Relaxed) {
                                    if let Ok(l) = rsl.lock(key, TTL).await {
                                        peer_lock = Some(l);
                                        ok = true;
                                        break;
                                    }
                                    pause().await;
                                }
                            }
                        }
                        if !ok {
                            break;
                        }
                        let acquired_at = t0.elapsed().as_nanos() as u64;
                        let released_at = last_release.load(Ordering::SeqCst);
                        if released_at > 0
                            && let Ok(mut h) = handoffs.lock()
                        {
                            h.push(Duration::from_nanos(
                                acquired_at.saturating_sub(released_at),
                            ));
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                        last_release.store(t0.elapsed().as_nanos() as u64, Ordering::SeqCst);
                        if let Some(l) = lib_lock {
                            let _ = lib.unlock(l).await;
                        } else if let Some(l) = peer_lock {
                            rsl.unlock(&l).await;
                        } else {
                            raw.unlock(key, &tok).await;
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        acquired[slot] += count.load(Ordering::Relaxed);
        time[slot] += start.elapsed().as_secs_f64();
        costs[slot].add(before, cost::snapshot(&setup.pools).await?);
        handed[slot].extend(handoffs.lock().map(|v| v.clone()).unwrap_or_default());
    }
    let results: Vec<(f64, Stats, cost::Cost, u64)> = (0..4)
        .map(|i| {
            let rate = acquired[i] as f64 / time[i].max(1e-9);
            let h = Stats::new(std::mem::take(&mut handed[i]));
            (rate, h, costs[i], acquired[i].max(1))
        })
        .collect();
    // Printed in the columns' order: library (try_lock loop), raw, rslock;
    // the waiting library on rows of its own.
    let (wait, try_, raw_, peer_) = (&results[0], &results[1], &results[2], &results[3]);
    header3("3. 16 tasks, one key, try_lock + sleep 5 ms + 0..10 ms jitter (library: try_lock)");
    row3("acquisitions/s", try_.0, raw_.0, peer_.0, "acq/s");
    row3(
        "handoff p50 (release→next acquire)",
        us(try_.1.pct(0.5)),
        us(raw_.1.pct(0.5)),
        us(peer_.1.pct(0.5)),
        "µs",
    );
    row3(
        "handoff p99",
        us(try_.1.pct(0.99)),
        us(raw_.1.pct(0.99)),
        us(peer_.1.pct(0.99)),
        "µs",
    );
    let per_acq = |r: &(f64, Stats, cost::Cost, u64), x: f64| x / r.3 as f64;
    row3(
        "server CPU per acquisition",
        per_acq(try_, us(try_.2.server_cpu)),
        per_acq(raw_, us(raw_.2.server_cpu)),
        per_acq(peer_, us(peer_.2.server_cpu)),
        "µs",
    );
    row3(
        "commands per node per acquisition",
        per_acq(try_, try_.2.commands as f64) / setup.pools.len().max(1) as f64,
        per_acq(raw_, raw_.2.commands as f64) / setup.pools.len().max(1) as f64,
        per_acq(peer_, peer_.2.commands as f64) / setup.pools.len().max(1) as f64,
        "cmds",
    );
    row3(
        "library lock_with (wait): acquisitions/s",
        wait.0,
        raw_.0,
        peer_.0,
        "acq/s",
    );
    row3(
        "library lock_with (wait): handoff p50",
        us(wait.1.pct(0.5)),
        us(raw_.1.pct(0.5)),
        us(peer_.1.pct(0.5)),
        "µs",
    );
    Ok(())
}

pub(super) fn rand_below(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let mut b = [0u8; 8];
    let _ = getrandom_fill(&mut b);
    u64::from_le_bytes(b) % n
}
