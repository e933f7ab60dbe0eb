//! `publish`: what the library's release script costs when nobody waits.
//!
//! The raw 64-task loop of scenario 2 twice, in alternating blocks: with the
//! raw compare-and-delete, and with the library's release script, which also
//! deletes the key's waiters flag and announces the release on
//! `redlock:released:<db>:<key>` when the flag was there. Nobody waits, so
//! the difference is the flag's part of the script alone (before waiters set
//! flags, it was an unconditional `PUBLISH`): the servers' CPU (`INFO cpu`)
//! and commands per pair, and pairs/s.

use std::sync::Arc;
use std::time::Instant;

use crate::{BoxError, Raw, Setup, cost, header, row, us};

pub(crate) async fn publish(setup: &Setup) -> Result<(), BoxError> {
    let plain = Arc::new(Raw::new(&setup.pools).await?);
    let announcing = Arc::new(Raw::with_release(&setup.pools, redlock_core::__RELEASE_LUA).await?);
    let secs = if setup.quick { 1.0 } else { 5.0 };
    let rounds = if setup.quick { 1 } else { 3 };
    let mut pairs = [0u64; 2];
    let mut time = [0.0f64; 2];
    let mut costs = [cost::Cost::default(); 2];
    for round in 0..rounds {
        for pass in 0..2 {
            let who = (pass + round) % 2;
            let raw = if who == 0 { &announcing } else { &plain };
            let before = cost::snapshot(&setup.pools).await?;
            let start = Instant::now();
            pairs[who] += run_block(raw, secs, &format!("bench:pub:{round}:{who}")).await?;
            time[who] += start.elapsed().as_secs_f64();
            costs[who].add(before, cost::snapshot(&setup.pools).await?);
        }
    }
    // Left column: the library's release script; right: the raw one.
    header("publish: raw loop, the library's release script (nobody waits) vs raw");
    let per_pair = |w: usize, x: f64| x / pairs[w].max(1) as f64;
    row(
        "pairs/s",
        pairs[0] as f64 / time[0].max(1e-9),
        pairs[1] as f64 / time[1].max(1e-9),
        "pairs/s",
    );
    row(
        "server CPU per pair (all nodes)",
        per_pair(0, us(costs[0].server_cpu)),
        per_pair(1, us(costs[1].server_cpu)),
        "µs",
    );
    row(
        "client CPU per pair",
        per_pair(0, us(costs[0].client_cpu)),
        per_pair(1, us(costs[1].client_cpu)),
        "µs",
    );
    let n = setup.pools.len().max(1) as f64;
    row(
        "commands per node per pair",
        per_pair(0, costs[0].commands as f64) / n,
        per_pair(1, costs[1].commands as f64) / n,
        "cmds",
    );
    Ok(())
}

/// 64 tasks of raw lock+unlock pairs on distinct keys for `secs`: the pairs.
async fn run_block(raw: &Arc<Raw>, secs: f64, prefix: &str) -> Result<u64, BoxError> {
    let (raw, prefix) = (raw.clone(), prefix.to_owned());
    crate::run_tasks(64, secs, move |t, i| {
        let (raw, key) = (raw.clone(), format!("{prefix}:{t}:{i}"));
        async move {
            let tok = Raw::token();
            let ok = raw.lock(&key, &tok).await;
            if ok {
                raw.unlock(&key, &tok).await;
            }
            ok
        }
    })
    .await
}
