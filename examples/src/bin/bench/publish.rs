//! `publish`: what the library's release script costs when nobody waits.
//!
//! The raw 64-task loop of scenario 2 three times, in blocks whose order
//! rotates: with the raw compare-and-delete, with the library's release
//! script, which also deletes the key's waiters flag and announces the
//! release on `redlock:released:<db>:<key>` when the flag was there, and with
//! the script's previous form ([`FLAG_AS_KEY`]), which took the flag as its
//! second key instead of naming it. Nobody waits, so the differences are the
//! flag's part of the script alone: the servers' CPU (`INFO cpu`), the
//! client's, and commands per pair, and pairs/s.

use std::sync::Arc;
use std::time::Instant;

use crate::{BoxError, Raw, Setup, cost, us};

/// The library's release script until 2026-11-27: the same, with the
/// waiters flag passed as `KEYS[2]`.
const FLAG_AS_KEY: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) > 1 then
    redis.pcall('PUBLISH', 'redlock:released:0:' .. KEYS[1], '1')
  end
  return 1
end
return 0
"#;

pub(crate) async fn publish(setup: &Setup) -> Result<(), BoxError> {
    // In the columns' order: the library's script, raw, the previous form.
    let scripts = [
        Arc::new(Raw::with_release(&setup.pools, redlock_core::__RELEASE_LUA).await?),
        Arc::new(Raw::new(&setup.pools).await?),
        Arc::new(Raw::with_release(&setup.pools, FLAG_AS_KEY).await?),
    ];
    let secs = if setup.quick { 1.0 } else { 5.0 };
    let rounds = if setup.quick { 1 } else { 3 };
    let mut pairs = [0u64; 3];
    let mut time = [0.0f64; 3];
    let mut costs = [cost::Cost::default(); 3];
    for round in 0..rounds {
        for pass in 0..3 {
            let who = (pass + round) % 3;
            let before = cost::snapshot(&setup.pools).await?;
            let start = Instant::now();
            let prefix = format!("bench:pub:{round}:{who}");
            pairs[who] += run_block(&scripts[who], secs, &prefix).await?;
            time[who] += start.elapsed().as_secs_f64();
            costs[who].add(before, cost::snapshot(&setup.pools).await?);
        }
    }
    crate::header3_named(
        "publish: raw loop with the library's release script (nobody waits), raw's, and the flag as KEYS[2]",
        ["library's", "raw", "KEYS[2]"],
    );
    let per_pair = |w: usize, x: f64| x / pairs[w].max(1) as f64;
    let at = |f: &dyn Fn(usize) -> f64| [f(0), f(1), f(2)];
    let n = setup.pools.len().max(1) as f64;
    let rows: [(&str, [f64; 3], &str); 4] = [
        (
            "pairs/s",
            at(&|w| pairs[w] as f64 / time[w].max(1e-9)),
            "pairs/s",
        ),
        (
            "server CPU per pair (all nodes)",
            at(&|w| per_pair(w, us(costs[w].server_cpu))),
            "µs",
        ),
        (
            "client CPU per pair",
            at(&|w| per_pair(w, us(costs[w].client_cpu))),
            "µs",
        ),
        (
            "commands per node per pair",
            at(&|w| per_pair(w, costs[w].commands as f64) / n),
            "cmds",
        ),
    ];
    for (name, [lib, raw, before], unit) in rows {
        crate::row3(name, lib, raw, before, unit);
    }
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
