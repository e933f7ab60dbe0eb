//! The randomized runs under the seeded nemesis: in one process, and across client processes.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_tests::history::{Event, HistoryLog, read_jsonl};
use redlock_tests::nemesis::{
    DRIFT_FACTOR, FIXED_DRIFT, Nemesis, NemesisConfig, Rig, StallTarget, clock_event, meta,
    redlock_for,
};
use redlock_tests::workload::{
    ClientConfig, FileStore, HolderConfig, HolderStalls, MaxHoldConfig, MemoryStore, Store,
    run_client, run_many_client, run_max_hold_client, spawn_holder_thread,
};

use super::*;

/// The node timeout of the `max_hold` clients: above the slow path's round trip
/// (40–80 ms), below their TTL.
pub(super) const SLOW_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// A Redlock for the slow path (the library's default drift, like the others).
pub(super) fn slow_redlock(urls: &[String]) -> Redlock {
    Redlock::builder()
        .urls(urls.iter().cloned())
        .node_timeout(SLOW_NODE_TIMEOUT)
        .drift_factor(DRIFT_FACTOR)
        .fixed_drift(FIXED_DRIFT)
        .build()
        .expect("build the slow path's Redlock")
}

/// The randomized run with clients as tasks of this process, plus holder-view
/// clients on their own threads (current-thread runtimes, resources `h0`, `h1`)
/// and `max_hold` clients through slow proxies (resource `m0`).
pub(super) async fn randomized_in_process(seed: u64, run_for: Duration) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("in-process", seed, 5, false));
    log.push(clock_event("parent"));
    let mut rig = Rig::start(5, &log).await;
    let resources: Vec<(String, Duration)> = vec![
        ("r0".into(), ms(250)),
        ("r1".into(), ms(300)),
        ("r2".into(), ms(400)),
    ];
    let holder_resources: Vec<(String, Duration)> =
        vec![("h0".into(), ms(300)), ("h1".into(), ms(250))];
    let max_hold_resources: Vec<(String, Duration)> = vec![("m0".into(), ms(600))];
    let all_resources: Vec<(String, Duration)> = resources
        .iter()
        .chain(&holder_resources)
        .chain(&max_hold_resources)
        .cloned()
        .collect();
    let ttl_max = ms(400);
    let slow_urls = rig.start_slow_path(seed, &log).await;
    let holder_stalls = Arc::new(HolderStalls::new());
    let stalls = Arc::new(AtomicU32::new(0));
    let store = Arc::new(MemoryStore::new());
    let until = Instant::now() + run_for;
    let clients: Vec<_> = (0..6u64)
        .map(|i| {
            let cfg = ClientConfig {
                name: format!("c{i}"),
                resources: resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(31).wrapping_add(i),
                guard_share: 0.3,
                stalls: Some(Arc::clone(&stalls)),
            };
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(run_client(
                redlock_for(&rig.urls()),
                cfg,
                store,
                log.clone(),
            ))
        })
        .collect();
    // Two clients lock pairs of the same resources (`lock_many`): every key of
    // a pair is checked against every other holder of that key.
    let many_clients: Vec<_> = (0..2u64)
        .map(|i| {
            let cfg = ClientConfig {
                name: format!("k{i}"),
                resources: resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(43).wrapping_add(i),
                guard_share: 0.0,
                stalls: None,
            };
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(run_many_client(
                redlock_for(&rig.urls()),
                cfg,
                store,
                log.clone(),
            ))
        })
        .collect();
    let holders: Vec<_> = (0..3u64)
        .map(|i| {
            let cfg = HolderConfig {
                name: format!("h{i}"),
                resources: holder_resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(37).wrapping_add(i),
                stalls: Some(Arc::clone(&holder_stalls)),
                deadline_check: true,
            };
            let store: Arc<dyn Store> = store.clone();
            spawn_holder_thread(redlock_for(&rig.urls()), cfg, store, log.clone())
        })
        .collect();
    let max_holders: Vec<_> = (0..2u64)
        .map(|i| {
            let cfg = MaxHoldConfig {
                name: format!("m{i}"),
                resources: max_hold_resources.clone(),
                retry: retry(),
                until,
                seed: seed.wrapping_mul(41).wrapping_add(i),
                max_hold: (0.83, 0.97),
                path: format!(
                    "through the slow proxies, node timeout {} ms",
                    SLOW_NODE_TIMEOUT.as_millis()
                ),
            };
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(run_max_hold_client(
                slow_redlock(&slow_urls),
                cfg,
                store,
                log.clone(),
            ))
        })
        .collect();
    let mut nemesis = Nemesis::new(
        &rig,
        NemesisConfig {
            seed,
            ttl_max,
            keys: all_resources.iter().map(|(r, _)| r.clone()).collect(),
            gap: (ms(100), ms(400)),
            stall: StallTarget::InProcess(Arc::clone(&stalls)),
            ttl_longest: ms(600),
            holder_stalls: Some(Arc::clone(&holder_stalls)),
        },
        log.clone(),
    );
    nemesis.run_until(until).await;
    for c in clients.into_iter().chain(max_holders) {
        c.await.expect("client task");
    }
    for c in many_clients {
        let stats = c.await.expect("multi-key client task");
        println!(
            "  multi-key client: sections={} acquired={} writes={}",
            stats.sections, stats.acquired, stats.writes
        );
    }
    for h in holders {
        blocking(move || h.join().expect("holder thread")).await;
    }
    finish(&rig, &mut nemesis, &*store, &all_resources, ttl_max, &log).await;
    log.snapshot()
}

/// Client processes: killed (and continued, so a stopped one dies) on drop.
pub(super) struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The randomized run with clients in separate OS processes.
pub(super) async fn randomized_processes(seed: u64, run_for: Duration, dir: &Path) -> Vec<Event> {
    let log = HistoryLog::new();
    log.push(meta("multi-process", seed, 3, false));
    log.push(clock_event("parent"));
    let rig = Rig::start(3, &log).await;
    let resources: Vec<(String, Duration)> = vec![("p0".into(), ms(300)), ("p1".into(), ms(400))];
    let ttl_max = ms(400);
    let work = tempfile::Builder::new()
        .prefix("redlock-fault-")
        .tempdir()
        .expect("temp dir");
    let store = FileStore::new(work.path().join("store"));
    let urls = rig.urls().join(",");
    let res_arg: Vec<String> = resources
        .iter()
        .map(|(r, t)| format!("{r}:{}", t.as_millis()))
        .collect();
    let mut children = Children(Vec::new());
    let mut files = Vec::new();
    for p in 0..3u64 {
        let history = dir.join(format!("multi-process-client-p{p}.jsonl"));
        let _ = std::fs::remove_file(&history);
        let child = Command::new(env!("CARGO_BIN_EXE_fault_client"))
            .args(["--name", &format!("p{p}")])
            .args(["--nodes", &urls])
            .args(["--resources", &res_arg.join(",")])
            .args(["--store", &work.path().join("store").to_string_lossy()])
            .args(["--history", &history.to_string_lossy()])
            .args(["--secs", &format!("{:.3}", run_for.as_secs_f64())])
            .args(["--tasks", "2"])
            .args(["--seed", &seed.wrapping_mul(7).wrapping_add(p).to_string()])
            .args(["--guard-share", "0.3"])
            .args(["--budget-ms", &BUDGET.as_millis().to_string()])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn fault_client");
        children.0.push(child);
        files.push(history);
    }
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    let until = Instant::now() + run_for;
    let mut nemesis = Nemesis::new(
        &rig,
        NemesisConfig {
            seed,
            ttl_max,
            keys: resources.iter().map(|(r, _)| r.clone()).collect(),
            gap: (ms(100), ms(400)),
            stall: StallTarget::Processes(pids),
            ttl_longest: ttl_max,
            holder_stalls: None,
        },
        log.clone(),
    );
    nemesis.run_until(until).await;
    // Stalled clients are continued before waiting for them.
    nemesis.heal_all().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for c in &mut children.0 {
        loop {
            match c.try_wait().expect("wait for a client") {
                Some(status) => {
                    assert!(status.success(), "fault_client failed: {status}");
                    break;
                }
                None if Instant::now() > deadline => panic!("a fault_client did not finish"),
                None => tokio::time::sleep(ms(50)).await,
            }
        }
    }
    for f in &files {
        log.extend(read_jsonl(f).expect("read a client's history"));
        let _ = std::fs::remove_file(f);
    }
    finish(&rig, &mut nemesis, &store, &resources, ttl_max, &log).await;
    log.snapshot()
}
