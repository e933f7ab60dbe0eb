//! Scenario `paused`: one node paused, the acquire must not wait for it.

use std::time::{Duration, Instant};

use super::*;

/// Scenario 4, one node of five paused: lock+unlock pairs, against healthy
/// pairs in the same run.
pub(super) async fn paused(setup: &Setup) -> Result<(), BoxError> {
    let Some(cluster) = &setup._cluster else {
        println!("\n(paused: skipped, needs local nodes rather than REDLOCK_NODES)");
        return Ok(());
    };
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let rsl = peer(setup);
    // rslock sets no timeout on a node's call; bounded here so that a pair
    // stuck on the paused node ends (and is counted as failed). One pair per
    // block, since each may take the whole bound.
    let peer_bound = Duration::from_secs(1);
    let mut peer_failed = 0;
    // Alternating blocks of healthy and paused pairs, so the machine's load
    // drifts alike for both; the resumed node gets a moment to answer what was
    // queued while it was stopped.
    let (blocks, per_block) = if setup.quick { (2, 50) } else { (10, 100) };
    let (mut healthy, mut l, mut r, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut failed = 0;
    for b in 0..blocks {
        for i in 0..per_block {
            let key = format!("bench:healthy:{b}:{i}");
            let start = Instant::now();
            let lock = lib.mutex(&key).try_acquire(TTL).await?;
            lib.unlock(lock).await?;
            healthy.push(start.elapsed());
        }
        cluster.node(4).pause();
        for i in 0..per_block {
            let key = format!("bench:paused:{b}:{i}");
            let start = Instant::now();
            let ok = match lib.mutex(&key).try_acquire(TTL).await {
                Ok(lock) => lib.unlock(lock).await.is_ok(),
                Err(_) => false,
            };
            l.push(start.elapsed());
            failed += usize::from(!ok);
            if i % 10 == 0 {
                let tok = Raw::token();
                let rkey = format!("bench:rpaused:{b}:{i}");
                let start = Instant::now();
                raw.lock(&rkey, &tok).await;
                raw.unlock(&rkey, &tok).await;
                r.push(start.elapsed());
            }
            // rslock once per block: a pair waits for the paused node.
            if i == 0 {
                let pkey = format!("bench:ppaused:{b}:{i}");
                let start = Instant::now();
                let pair = async {
                    match rsl.lock(pkey.as_str(), TTL).await {
                        Ok(l) => {
                            rsl.unlock(&l).await;
                            true
                        }
                        Err(_) => false,
                    }
                };
                let ok = matches!(tokio::time::timeout(peer_bound, pair).await, Ok(true));
                p.push(start.elapsed());
                peer_failed += usize::from(!ok);
            }
        }
        cluster.node(4).resume();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let (h, l, r, p) = (
        Stats::new(healthy),
        Stats::new(l),
        Stats::new(r),
        Stats::new(p),
    );
    header3(&format!(
        "4. one node of five SIGSTOPped: lock+unlock pairs, node_timeout {:?}",
        *NODE_TIMEOUT
    ));
    row3(
        "pair p50",
        us(l.pct(0.5)),
        us(r.pct(0.5)),
        us(p.pct(0.5)),
        "µs",
    );
    row3(
        "pair p99",
        us(l.pct(0.99)),
        us(r.pct(0.99)),
        us(p.pct(0.99)),
        "µs",
    );
    row3("pair max", us(l.max()), us(r.max()), us(p.max()), "µs");
    println!(
        "library, paused vs healthy (same run): p50 {:.1} vs {:.1} µs = {:.3}x (target <= 1.2x); p99 {:.1} vs {:.1} µs; failed pairs {failed}",
        us(l.pct(0.5)),
        us(h.pct(0.5)),
        us(l.pct(0.5)) / us(h.pct(0.5)),
        us(l.pct(0.99)),
        us(h.pct(0.99)),
    );
    println!(
        "rslock: {} pairs, {peer_failed} failed or past {peer_bound:?}",
        p.sorted.len()
    );
    println!(
        "(raw waits for every node's answer or timeout; rslock for every node's answer; the library decides acquire and release at quorum)"
    );
    Ok(())
}
