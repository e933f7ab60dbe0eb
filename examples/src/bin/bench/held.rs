//! Scenario `held`: many guards held at once, renewed in batches.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redlock_core::LockOptions;

use super::*;

/// 6. Many auto-extended locks held at once.
pub(super) async fn held(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let (count, hold, ttl) = if setup.quick {
        (1_000, Duration::from_secs(3), Duration::from_secs(2))
    } else {
        (10_000, Duration::from_secs(30), Duration::from_secs(10))
    };
    let rss_before = rss_kib("VmRSS:");
    let opts = LockOptions::new(ttl);
    let mut guards = Vec::with_capacity(count);
    let start = Instant::now();
    for chunk in 0..(count / 100) {
        let futs = (0..100).map(|i| {
            let (lib, opts) = (lib.clone(), opts.clone());
            let key = format!("bench:held:{}", chunk * 100 + i);
            async move { lib.mutex(&key).guard(&opts).await }
        });
        for g in join_all(futs).await {
            guards.push(g?);
        }
    }
    let acquire_time = start.elapsed();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(hold).await;
    let cpu = cpu_time() - cpu0;
    let wall = t0.elapsed();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let extensions: u64 = guards
        .iter()
        .map(|g| u64::from(g.handle().extensions()))
        .sum();
    let rss_peak = rss_kib("VmHWM:");
    let rss_now = rss_kib("VmRSS:");
    // Released 100 at a time, as they were taken: 10,000 releases at once are
    // 50,000 node calls in one burst, which keeps two cores busy past the 50 ms
    // node timeout (those keys then expire by TTL).
    let start = Instant::now();
    let mut failed = 0;
    let mut guards = guards.into_iter();
    loop {
        let chunk: Vec<_> = guards.by_ref().take(100).collect();
        if chunk.is_empty() {
            break;
        }
        let releases = join_all(chunk.into_iter().map(|g| g.release())).await;
        failed += releases.iter().filter(|r| r.is_err()).count();
    }
    let release_time = start.elapsed();
    println!("\n### 6. {count} auto-extended locks held for {hold:?} (ttl {ttl:?})\n");
    println!("| metric | value |");
    println!("|---|---|");
    println!("| acquire all | {:.2} s |", acquire_time.as_secs_f64());
    println!(
        "| process CPU while held | {:.2} s over {:.1} s = {:.1}% of one core |",
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    println!("| extensions done | {extensions} |");
    println!("| locks lost | {lost} |");
    println!(
        "| RSS before / while held / peak | {:.1} / {:.1} / {:.1} MiB |",
        rss_before as f64 / 1024.0,
        rss_now as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "| release all, 100 at a time | {:.2} s, {failed} failed |",
        release_time.as_secs_f64()
    );
    Ok(())
}
