//! A fault-suite client process: runs a few workload clients (see
//! `redlock_tests::workload`) against the given lock nodes and a shared file
//! store, then writes its events as JSON lines for the parent to merge and check.
//!
//! The parent (`tests/tests/faults/suite.rs`) starts several of these, so the
//! clients live in separate OS processes, and stalls them with `SIGSTOP`.
//!
//! ```text
//! fault_client --name p0 --nodes redis://127.0.0.1:1,redis://127.0.0.1:2,... \
//!   --resources p0:300,p1:400 --store DIR --history FILE \
//!   [--secs 20] [--tasks 2] [--seed 1] [--guard-share 0.3] [--budget-ms 1000]
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::RetryPolicy;
use redlock_tests::history::{HistoryLog, write_jsonl};
use redlock_tests::nemesis::{clock_event, redlock_for};
use redlock_tests::workload::{ClientConfig, FileStore, Store, run_client};

fn usage(msg: &str) -> ! {
    eprintln!("fault_client: {msg}");
    eprintln!(
        "usage: fault_client --name NAME --nodes URL,URL,.. --resources RES:TTL_MS,.. \
         --store DIR --history FILE [--secs S] [--tasks N] [--seed S] \
         [--guard-share F] [--budget-ms MS]"
    );
    std::process::exit(2)
}

fn main() {
    let mut args: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let Some(name) = k.strip_prefix("--") else {
            usage(&format!("unexpected argument {k}"))
        };
        let Some(v) = it.next() else {
            usage(&format!("--{name} needs a value"))
        };
        args.insert(name.to_owned(), v);
    }
    let get = |k: &str| {
        args.get(k)
            .cloned()
            .unwrap_or_else(|| usage(&format!("--{k} is required")))
    };
    let num = |k: &str, default: f64| {
        args.get(k).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("--{k} {v} is not a number")))
        })
    };
    let name = get("name");
    let nodes: Vec<String> = get("nodes").split(',').map(str::to_owned).collect();
    let resources: Vec<(String, Duration)> = get("resources")
        .split(',')
        .map(|r| {
            let (res, ttl) = r
                .split_once(':')
                .unwrap_or_else(|| usage(&format!("resource {r} is not RES:TTL_MS")));
            let ttl: u64 = ttl
                .parse()
                .unwrap_or_else(|_| usage(&format!("bad TTL in {r}")));
            (res.to_owned(), Duration::from_millis(ttl))
        })
        .collect();
    let store = FileStore::new(get("store"));
    let history = std::path::PathBuf::from(get("history"));
    let secs = num("secs", 20.0);
    let tasks = num("tasks", 2.0) as usize;
    let seed = num("seed", 1.0) as u64;
    let guard_share = num("guard-share", 0.3);
    let budget = Duration::from_millis(num("budget-ms", 1000.0) as u64);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the runtime");
    let log = HistoryLog::new();
    log.push(clock_event(&name));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let store: Arc<dyn Store> = Arc::new(store);
    let stats = rt.block_on(async {
        let clients: Vec<_> = (0..tasks)
            .map(|t| {
                let cfg = ClientConfig {
                    name: format!("{name}.{t}"),
                    resources: resources.clone(),
                    retry: RetryPolicy::deadline(budget)
                        .with_delay(Duration::from_millis(10))
                        .with_jitter(Duration::from_millis(20)),
                    until,
                    seed: seed.wrapping_mul(1_000_003).wrapping_add(t as u64),
                    guard_share,
                    stalls: None,
                };
                tokio::spawn(run_client(
                    redlock_for(&nodes),
                    cfg,
                    Arc::clone(&store),
                    log.clone(),
                ))
            })
            .collect();
        let mut out = Vec::new();
        for c in clients {
            out.push(c.await.expect("client task"));
        }
        out
    });
    write_jsonl(&history, &log.snapshot()).expect("write the history");
    let acquired: u64 = stats.iter().map(|s| s.acquired).sum();
    let writes: u64 = stats.iter().map(|s| s.writes).sum();
    println!("fault_client {name}: acquired={acquired} writes={writes}");
}
