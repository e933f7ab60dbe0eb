//! Issue 48's probe of fair turns across processes, for the mutex and for
//! permits: several OS processes contend for one resource on 3 real
//! `redis-server` nodes, each re-acquiring as soon as it released, and the
//! probe prints how many holds each completed and how many of its waits ran
//! out.
//!
//! ```text
//! fairness [--kind mutex|permits] [--permits 2] [--procs 6] [--secs 25]
//!          [--stops]        # SIGSTOP one node 0.3-1.5 s every ~2 s
//! ```
//!
//! Each process: `acquire_with(ttl 1 s, deadline 10 s, delay 100 ms, jitter
//! 100 ms)`, then three 15 ms sections, then release, until the time is up.
//! The parent starts the nodes (the test harness's `Cluster`, killed on
//! exit), runs the processes (this binary again, `--worker`), and reports the
//! busiest and least busy process and their ratio.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_tests::Cluster;
use redlock_tests::probe::ProbeArgs;

const USAGE: &str =
    "fairness [--kind mutex|permits] [--permits N] [--procs N] [--secs S] [--stops]";

fn usage(msg: &str) -> ! {
    redlock_tests::probe::fail("fairness", USAGE, msg)
}

fn main() {
    let args = ProbeArgs::parse("fairness", USAGE);
    if args.has("worker") {
        worker(&args);
        return;
    }
    let kind = args.get("kind").unwrap_or("mutex").to_owned();
    if kind != "mutex" && kind != "permits" {
        usage("--kind is mutex or permits");
    }
    let permits = args.num("permits", 2);
    let procs = args.num("procs", 6);
    let secs = args.num("secs", 25);
    let stops = args.has("stops");
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let me = std::env::current_exe().unwrap_or_else(|e| usage(&format!("own path: {e}")));
    let children: Vec<_> = (0..procs)
        .map(|p| {
            Command::new(&me)
                .args([
                    "--worker",
                    &p.to_string(),
                    "--nodes",
                    &nodes,
                    "--kind",
                    &kind,
                ])
                .args([
                    "--permits",
                    &permits.to_string(),
                    "--secs",
                    &secs.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| usage(&format!("start a worker: {e}")))
        })
        .collect();
    // Node stops, bounded by the run's length.
    let until = Instant::now() + Duration::from_secs(secs);
    let mut stopped = 0;
    if stops {
        let mut n = 0usize;
        while Instant::now() + Duration::from_secs(2) < until {
            std::thread::sleep(Duration::from_millis(2000));
            let node = cluster.node(n % 3);
            let pause = Duration::from_millis(300 + (n as u64 * 373) % 1200);
            node.pause();
            std::thread::sleep(pause);
            node.resume();
            stopped += 1;
            n += 1;
        }
    }
    let mut rows = Vec::new();
    for (p, child) in children.into_iter().enumerate() {
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| usage(&format!("worker {p}: {e}")));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |name: &str| -> u64 {
            text.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        rows.push((p, field("holds"), field("ran_out"), field("errors")));
    }
    println!(
        "kind={kind}{} procs={procs} secs={secs} node_stops={stopped}",
        if kind == "permits" {
            format!(" permits={permits}")
        } else {
            String::new()
        }
    );
    for (p, holds, ran_out, errors) in &rows {
        println!("  process {p}: holds={holds} waits_ran_out={ran_out} other_errors={errors}");
    }
    let most = rows.iter().map(|r| r.1).max().unwrap_or(0);
    let least = rows.iter().map(|r| r.1).min().unwrap_or(0);
    let ran_out: u64 = rows.iter().map(|r| r.2).sum();
    println!(
        "  busiest/least busy = {most}/{least} = {}; waits that ran out: {ran_out}",
        if least == 0 {
            "inf".to_owned()
        } else {
            format!("{:.2}", most as f64 / least as f64)
        }
    );
}

/// One process: acquire, three 15 ms sections, release, until the time is
/// up; prints `holds=N ran_out=N errors=N`.
fn worker(args: &ProbeArgs) {
    let nodes = args.nodes();
    let permits = u32::try_from(args.num("permits", 2)).unwrap_or(2);
    let secs = args.num("secs", 25);
    let mutex = args.get("kind").is_none_or(|k| k == "mutex");
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| usage(&format!("runtime: {e}")));
    rt.block_on(async move {
        let rl = Redlock::builder()
            .urls(nodes)
            .build()
            .unwrap_or_else(|e| usage(&format!("handle: {e}")));
        let retry = redlock_tests::probe::wait_policy();
        let ttl = redlock_tests::probe::HOLD_TTL;
        let until = Instant::now() + Duration::from_secs(secs);
        let (mut holds, mut ran_out, mut errors) = (0u64, 0u64, 0u64);
        // Bounded: each wait ends by its 10 s deadline.
        while Instant::now() < until {
            let primitive = if mutex {
                rl.mutex("fairness")
            } else {
                match rl.semaphore("fairness", permits) {
                    Ok(p) => p,
                    Err(e) => usage(&format!("semaphore: {e}")),
                }
            };
            match primitive.acquire_with(ttl, &retry).await {
                Ok(lock) => {
                    for _ in 0..3 {
                        tokio::time::sleep(redlock_tests::probe::SECTION).await;
                    }
                    let _ = rl.unlock(lock).await;
                    holds += 1;
                }
                Err(redlock_core::Error::Busy { .. }) => ran_out += 1,
                Err(_) => errors += 1,
            }
        }
        println!("holds={holds} ran_out={ran_out} errors={errors}");
    });
}
