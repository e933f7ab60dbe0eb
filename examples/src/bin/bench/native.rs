//! Scenario `native`: release and extend by the nodes' own commands
//! (`DELIFEQ` / `DELEX … IFEQ`, `SET … IFEQ … PX`) against the Lua scripts, in
//! alternating blocks of one run over the same nodes: the server CPU per
//! operation (`INFO cpu`, all nodes), the commands each node ran, and the
//! client's throughput. Meant for nodes that have them:
//!
//! ```sh
//! REDIS_SERVER=/path/to/valkey-server cargo run --release -p redlock-examples --bin bench -- native
//! ```
//!
//! Two workloads, 16 tasks on distinct keys each:
//! - lock+unlock: scripts ([`NativeCommands::Off`]) against native release
//!   ([`NativeCommands::ReleaseAndExtend`]);
//! - lock+extend+unlock: scripts against native extend
//!   ([`NativeCommands::Extend`]; release by the script in both).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{NativeCommands, Redlock};

use crate::{BoxError, NODE_TIMEOUT, Setup, TTL, cost, cpu_time, us};

const TASKS: usize = 16;

fn handle(setup: &Setup, native: NativeCommands) -> Result<Redlock, BoxError> {
    Ok(setup
        .pools
        .iter()
        .cloned()
        .fold(Redlock::builder(), |b, p| b.pool(p))
        .node_timeout(*NODE_TIMEOUT)
        .native_commands(native)
        .build()?)
}

/// One block's totals for one handle.
#[derive(Default, Clone, Copy)]
struct Block {
    /// Completed operations.
    ops: u64,
    /// Operations that failed (a node timeout on a loaded machine); their
    /// server work is counted, so they are reported.
    failed: u64,
    secs: f64,
    client_cpu: Duration,
    cost: cost::Cost,
}

impl Block {
    fn add(&mut self, b: &Block) {
        self.ops += b.ops;
        self.failed += b.failed;
        self.secs += b.secs;
        self.client_cpu += b.client_cpu;
        self.cost.client_cpu += b.cost.client_cpu;
        self.cost.allocations += b.cost.allocations;
        self.cost.server_cpu += b.cost.server_cpu;
        self.cost.commands += b.cost.commands;
    }
    fn per_s(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
    fn server_us(&self) -> f64 {
        us(self.cost.server_cpu) / self.ops.max(1) as f64
    }
    fn client_us(&self) -> f64 {
        us(self.client_cpu) / self.ops.max(1) as f64
    }
}

/// Runs `TASKS` tasks of lock(+extend)+unlock on `lib` for `secs`.
async fn block(
    setup: &Setup,
    lib: &Redlock,
    extend: bool,
    tag: &str,
    secs: f64,
) -> Result<Block, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let before = cost::snapshot(&setup.pools).await?;
    let cpu0 = cpu_time();
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (stop, count, failed, lib) =
                (stop.clone(), count.clone(), failed.clone(), lib.clone());
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("bench:native:{tag}:{t}:{i}");
                    let Ok(mut l) = lib.mutex(&key).try_acquire(TTL).await else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    if extend && lib.extend(&mut l, TTL).await.is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    match lib.unlock(l).await {
                        Ok(_) => {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let secs = start.elapsed().as_secs_f64();
    let client_cpu = cpu_time().saturating_sub(cpu0);
    let after = cost::snapshot(&setup.pools).await?;
    let mut c = cost::Cost::default();
    c.add(before, after);
    Ok(Block {
        failed: failed.load(Ordering::Relaxed),
        ops: count.load(Ordering::Relaxed),
        secs,
        client_cpu,
        cost: c,
    })
}

/// One workload: `a` against `b`, alternating blocks; prints per-block and
/// total rows.
async fn compare(
    setup: &Setup,
    title: &str,
    extend: bool,
    (a_name, a): (&str, &Redlock),
    (b_name, b): (&str, &Redlock),
) -> Result<(), BoxError> {
    let (rounds, secs) = if setup.quick { (2, 1.0) } else { (4, 2.5) };
    // Warm-up: connections (and native detection), script caches.
    for lib in [a, b] {
        block(setup, lib, extend, "warm", 0.3).await?;
    }
    let mut totals = [Block::default(); 2];
    println!("\n### native: {title}, {TASKS} tasks, distinct keys\n");
    println!(
        "| block | {a_name} ops/s | {b_name} ops/s | {a_name} server µs/op | {b_name} server µs/op | server ratio | {a_name} client µs/op | {b_name} client µs/op |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for round in 0..rounds {
        let mut this = [Block::default(); 2];
        for pass in 0..2 {
            let who = (pass + round) % 2;
            let lib = if who == 0 { a } else { b };
            this[who] = block(setup, lib, extend, &format!("{round}:{who}"), secs).await?;
        }
        println!(
            "| {round} | {:.0} | {:.0} | {:.1} | {:.1} | {:.3} | {:.1} | {:.1} |",
            this[0].per_s(),
            this[1].per_s(),
            this[0].server_us(),
            this[1].server_us(),
            this[1].server_us() / this[0].server_us().max(1e-9),
            this[0].client_us(),
            this[1].client_us(),
        );
        totals[0].add(&this[0]);
        totals[1].add(&this[1]);
    }
    let n = setup.pools.len().max(1) as f64;
    let cmds = |b: &Block| b.cost.commands as f64 / b.ops.max(1) as f64 / n;
    println!(
        "| all | {:.0} | {:.0} | {:.1} | {:.1} | {:.3} | {:.1} | {:.1} |",
        totals[0].per_s(),
        totals[1].per_s(),
        totals[0].server_us(),
        totals[1].server_us(),
        totals[1].server_us() / totals[0].server_us().max(1e-9),
        totals[0].client_us(),
        totals[1].client_us(),
    );
    println!(
        "\ncommands per node per op: {a_name} {:.2}, {b_name} {:.2}; failed ops: {a_name} {}, {b_name} {}",
        cmds(&totals[0]),
        cmds(&totals[1]),
        totals[0].failed,
        totals[1].failed
    );
    Ok(())
}

/// Scenario `native`.
pub(crate) async fn native(setup: &Setup) -> Result<(), BoxError> {
    let scripts = handle(setup, NativeCommands::Off)?;
    let release = handle(setup, NativeCommands::ReleaseAndExtend)?;
    let extend = handle(setup, NativeCommands::Extend)?;
    let found = release.check_nodes().await?;
    let native: Vec<String> = found
        .iter()
        .map(|i| format!("{}: {:?}", i.node, i.native))
        .collect();
    println!("\nnative commands found: {}", native.join("; "));
    compare(
        setup,
        "lock+unlock, release by script vs DELIFEQ/DELEX + PUBLISH",
        false,
        ("script", &scripts),
        ("native", &release),
    )
    .await?;
    compare(
        setup,
        "lock+extend+unlock, extend by script vs SET IFEQ PX",
        true,
        ("script", &scripts),
        ("native", &extend),
    )
    .await?;
    Ok(())
}
