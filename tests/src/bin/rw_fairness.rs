//! Issue 48's probe of the read/write lock's turns across processes: writer
//! and reader processes contend for one resource on 3 real `redis-server`
//! nodes, each re-acquiring as soon as it released, and the probe prints
//! each process's holds per 3 s window and its longest time without a hold.
//!
//! ```text
//! rw_fairness [--secs 25] [--writers 2] [--readers 4]
//!             [--stops]        # SIGSTOP one node 0.3-1.5 s every ~2 s
//! ```
//!
//! Each process: `acquire_with(ttl 1 s, deadline 10 s, delay 100 ms, jitter
//! 100 ms)` of its side (`Access::Exclusive` or `Access::Shared`), then
//! three 15 ms sections, then release, until the time is up. The parent
//! starts the nodes (the test harness's `Cluster`, killed on exit), runs the
//! processes (this binary again, `--worker`), and prints the table.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlock_core::{Access, Redlock};
use redlock_tests::Cluster;
use redlock_tests::probe::ProbeArgs;

/// The windows the issue judges holds in.
const WINDOW: Duration = Duration::from_secs(3);

const USAGE: &str = "rw_fairness [--secs S] [--writers N] [--readers N] [--stops]";

fn usage(msg: &str) -> ! {
    redlock_tests::probe::fail("rw_fairness", USAGE, msg)
}

/// Milliseconds since the Unix epoch: the processes' common clock.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a worker reported.
struct Row {
    name: String,
    /// When each hold ended, in ms from the start.
    holds: Vec<u64>,
    ran_out: u64,
    errors: u64,
}

fn main() {
    let args = ProbeArgs::parse("rw_fairness", USAGE);
    if args.has("worker") {
        worker(&args);
        return;
    }
    let secs = args.num("secs", 25);
    let writers = args.num("writers", 2);
    let readers = args.num("readers", 4);
    let stops = args.has("stops");
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let me = std::env::current_exe().unwrap_or_else(|e| usage(&format!("own path: {e}")));
    let start_ms = now_ms();
    let children: Vec<_> = (0..writers + readers)
        .map(|p| {
            let (side, name) = if p < writers {
                ("write", format!("W{p}"))
            } else {
                ("read", format!("R{}", p - writers))
            };
            let child = Command::new(&me)
                .args(["--worker", side, "--nodes", &nodes])
                .args([
                    "--secs",
                    &secs.to_string(),
                    "--start",
                    &start_ms.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| usage(&format!("start a worker: {e}")));
            (name, child)
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
    let rows: Vec<Row> = children
        .into_iter()
        .map(|(name, child)| {
            let out = child
                .wait_with_output()
                .unwrap_or_else(|e| usage(&format!("worker {name}: {e}")));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let field = |f: &str| -> Option<&str> {
                text.split_whitespace()
                    .find_map(|w| w.strip_prefix(f)?.strip_prefix('='))
            };
            let count = |f: &str| field(f).and_then(|v| v.parse().ok()).unwrap_or(0);
            Row {
                holds: field("holds_ms")
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|v| v.parse().ok())
                    .collect(),
                ran_out: count("ran_out"),
                errors: count("errors"),
                name,
            }
        })
        .collect();
    report(&rows, secs, stopped);
}

/// The table: holds per 3 s window, then the process's totals and its
/// longest time without a hold (from the start, between holds, to the end).
fn report(rows: &[Row], secs: u64, stopped: usize) {
    let end_ms = secs * 1000;
    let window_ms = u64::try_from(WINDOW.as_millis()).unwrap_or(3000);
    let windows = end_ms.div_ceil(window_ms);
    println!("rw_fairness: secs={secs} node_stops={stopped}; holds per {WINDOW:?} window:");
    let head: Vec<String> = (0..windows)
        .map(|w| format!("{:>4}", format!("{}s", w * window_ms / 1000)))
        .collect();
    println!(
        "        {}   total  longest_gap  waits_ran_out  errors",
        head.join("")
    );
    let mut empty_windows = Vec::new();
    for row in rows {
        let mut per = vec![0u64; usize::try_from(windows).unwrap_or(0)];
        for &t in &row.holds {
            if let Some(n) = per.get_mut(usize::try_from(t / window_ms).unwrap_or(usize::MAX)) {
                *n += 1;
            }
        }
        let mut last = 0;
        let mut gap = 0;
        for &t in row.holds.iter().chain(std::iter::once(&end_ms)) {
            gap = gap.max(t.saturating_sub(last));
            last = t;
        }
        let cells: Vec<String> = per.iter().map(|n| format!("{n:>4}")).collect();
        println!(
            "  {:<4}  {}   {:>5}  {:>9.1} s  {:>13}  {:>6}",
            row.name,
            cells.join(""),
            row.holds.len(),
            gap as f64 / 1000.0,
            row.ran_out,
            row.errors
        );
        let empty = per.iter().filter(|&&n| n == 0).count();
        if empty > 0 {
            empty_windows.push(format!("{} ({empty})", row.name));
        }
    }
    if empty_windows.is_empty() {
        println!("  every process held in every window");
    } else {
        println!("  windows without a hold: {}", empty_windows.join(", "));
    }
}

/// One process: acquire its side, three 15 ms sections, release, until the
/// time is up; prints `holds_ms=T,T,.. ran_out=N errors=N`, each T when a
/// hold ended, in ms from `--start`.
fn worker(args: &ProbeArgs) {
    let nodes = args.nodes();
    let access = match args.get("worker") {
        Some("write") => Access::Exclusive,
        Some("read") => Access::Shared,
        _ => usage("--worker is write or read"),
    };
    let secs = args.num("secs", 25);
    let start_ms = args.num("start", now_ms());
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| usage(&format!("runtime: {e}")));
    rt.block_on(async move {
        let rl = Redlock::builder()
            .urls(nodes)
            .build()
            .unwrap_or_else(|e| usage(&format!("handle: {e}")));
        let retry = redlock_tests::probe::wait_policy();
        let ttl = redlock_tests::probe::HOLD_TTL;
        let until = start_ms + secs * 1000;
        let (mut holds, mut ran_out, mut errors) = (Vec::new(), 0u64, 0u64);
        // Bounded: each wait ends by its 10 s deadline.
        while now_ms() < until {
            match rl
                .rw_lock("rw-fairness", access)
                .acquire_with(ttl, &retry)
                .await
            {
                Ok(lock) => {
                    for _ in 0..3 {
                        tokio::time::sleep(redlock_tests::probe::SECTION).await;
                    }
                    let _ = rl.unlock(lock).await;
                    if now_ms() <= until {
                        holds.push(now_ms().saturating_sub(start_ms).to_string());
                    }
                }
                Err(redlock_core::Error::Busy { .. }) => ran_out += 1,
                Err(_) => errors += 1,
            }
        }
        println!(
            "holds_ms={} ran_out={ran_out} errors={errors}",
            holds.join(",")
        );
    });
}
