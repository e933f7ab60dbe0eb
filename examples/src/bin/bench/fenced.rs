//! Scenario `fenced`: lock+unlock with fencing tokens against without.

use std::time::Instant;

use redlock_core::Redlock;

use super::*;

/// 7. Fenced (one more round trip) against unfenced lock+unlock, alternating blocks.
pub(super) async fn fenced(setup: &Setup) -> Result<(), BoxError> {
    let plain = redlock(setup)?;
    let fenced = setup
        .pools
        .iter()
        .cloned()
        .fold(Redlock::builder(), |b, p| b.pool(p))
        .node_timeout(*NODE_TIMEOUT)
        .fencing(redlock_core::FencingMode::Hybrid)
        .build()?;
    let (blocks, per_block) = if setup.quick { (4, 250) } else { (10, 600) };
    for i in 0..300 {
        for (rl, name) in [(&plain, "plain"), (&fenced, "fenced")] {
            let l = rl
                .mutex(format!("bench:fwarm:{name}:{i}"))
                .try_acquire(TTL)
                .await?;
            rl.unlock(l).await?;
        }
    }
    let (mut fenced_lat, mut plain_lat) = (Vec::new(), Vec::new());
    let mut n = 0u64;
    for b in 0..blocks {
        for pass in 0..2 {
            let run_fenced = (pass == 0) == (b % 2 == 0);
            let (rl, lat) = if run_fenced {
                (&fenced, &mut fenced_lat)
            } else {
                (&plain, &mut plain_lat)
            };
            for _ in 0..per_block {
                n += 1;
                let key = format!("bench:fenced:{n}");
                let start = Instant::now();
                let l = rl.mutex(&key).try_acquire(TTL).await?;
                if run_fenced && l.fencing_token().is_none() {
                    return Err("a fenced lock came without a token".into());
                }
                rl.unlock(l).await?;
                lat.push(start.elapsed());
            }
        }
    }
    let (f, p) = (Stats::new(fenced_lat), Stats::new(plain_lat));
    println!(
        "\n### 7. fenced vs unfenced lock+unlock, distinct keys ({} pairs each)\n",
        f.sorted.len()
    );
    println!(
        "| {:<38} | {:>12} | {:>12} | {:<8} | {:>6} |",
        "metric", "fenced", "unfenced", "unit", "ratio"
    );
    println!(
        "|{:-<40}|{:->14}|{:->14}|{:-<10}|{:->8}|",
        "", "", "", "", ""
    );
    row("p50", us(f.pct(0.5)), us(p.pct(0.5)), "µs");
    row("p99", us(f.pct(0.99)), us(p.pct(0.99)), "µs");
    row("max", us(f.max()), us(p.max()), "µs");
    Ok(())
}
