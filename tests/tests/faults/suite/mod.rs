//! The fault-injection safety suite: mutual exclusion of `redlock-core` under node
//! crashes, pauses, slow and broken networks, clock jumps and client stalls, on
//! real `redis-server` processes behind fault proxies — and proof that its
//! checkers catch a real violation.
//!
//! One test, [`fault_suite`], runs the scenarios in turn and prints ONE summary
//! line (`fault-suite seed=… acquisitions=… faults[… holder_stall=… max_hold=…]
//! overlaps=… lost_updates=… negative_controls_caught=3/3 … stalled_after_check=…`):
//!
//! 1. **Negative controls** (must be caught): a node restarted at once, without
//!    persistence, under a holder's bare quorum; and a node that loses the key
//!    early (a forward clock jump) while another node was unreachable during the
//!    holder's acquire. Each yields a second holder, and the overlap checker must
//!    report it (the lost-update checker too). Third, **a holder stall without
//!    the deadline check**: holder A (`with_lock` on a current-thread runtime)
//!    blocks its own thread for 2×TTL before its `is_lost()` check while B
//!    acquires and writes; with `without_deadline_check_for_tests` (the old
//!    behaviour: only the starved renewal task could report the loss) A's check
//!    passes and its write lands inside B's hold, which the holder-view checker
//!    must report (a lost update too). The same pair with the deadline check
//!    (`holder-stall-pair`) must pass: A sees the loss and skips its write.
//! 2. **Ghost keys**: a `SET` that a paused node, or a proxy that held it, runs
//!    after the client gave up, and one whose reply came too late, all expire
//!    within the TTL.
//! 3. **In-process run**: 6 client tasks, 3 resources (TTL 250–400 ms), 5 nodes,
//!    and the seeded nemesis (`redlock_tests::nemesis`): kill/restart, pause,
//!    proxy faults, clock jumps, stalls. Alongside, on the same nodes:
//!    * 3 **holder-view clients**, each on its own OS thread with a
//!      current-thread runtime (resources `h0`, `h1`, TTL 250–300 ms): inside
//!      `with_lock` they read, work, check `is_lost()`, then write to a store
//!      that checks nothing. The nemesis's **holder_stall** blocks such a thread
//!      (`std::thread::sleep`, 1.2–2.5×TTL, so the renewal task cannot run)
//!      either before the check — the library's deadline check must then say
//!      "lost" — or between the check and the write, which no client-side check
//!      can catch (counted as `stalled_after_check`: the baseline that fencing
//!      must bring to zero);
//!    * 2 **max_hold clients** (resource `m0`, TTL 600 ms, `max_hold` 83–97% of
//!      the TTL) reaching the nodes through a second set of proxies with 20–40 ms
//!      of latency each way (node timeout 100 ms): their renewals near `max_hold`
//!      shorten the keys and answer late. Their writes are holder-view writes too.
//!
//!    Then heal, probe liveness, and sweep for keys that outlived their TTL.
//! 4. **Multi-process run**: 3 client processes (`fault_client`, 2 clients each),
//!    2 resources, 3 nodes; stalls are `SIGSTOP`s of a client process.
//!
//! The **holder-view checker** (`redlock_tests::history`) judges every write a
//! holder made after its own `is_lost()` check: if the check passed and the write
//! followed it without a stall, the write must fall inside no other holder's
//! interval (and inside its own), and must not lose an update; those count in
//! `overlaps` and `lost_updates` of the summary. Writes stalled between the
//! check and the write are counted as `stalled_after_check`, not failed.
//! `max_hold_shortened` counts the guards whose holder saw its validity lowered.
//!
//! Every history is written as JSON lines under `$REDLOCK_HISTORY_DIR` (default
//! `target/tmp/fault-histories/<seed>/`) and can be checked again with
//! `cargo run -p redlock-tests --bin fault_recheck -- <dir>`.
//!
//! Environment: `REDLOCK_SEED` replays a schedule; `REDLOCK_SOAK_SECS` runs the two
//! randomized scenarios for that long in all (60% in-process, 40% multi-process)
//! instead of the default lengths (12 s and 8 s; CI's Valkey step soaks longer).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::Rng;
use redlock_core::RetryPolicy;
use redlock_tests::history::{
    Event, Mode, Summary, Verdict, check, duration_ns, history_dir, instant_ns, now_ns, write_jsonl,
};
use redlock_tests::nemesis::{DRIFT_FACTOR, FIXED_DRIFT, Rig, redlock_for};
use redlock_tests::workload::{MemoryStore, Store};

mod controls;
mod ghosts;
mod randomized;
use controls::*;
use ghosts::*;
use randomized::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The acquire retry budget of the workload and of the liveness bound.
const BUDGET: Duration = Duration::from_secs(1);

fn retry() -> RetryPolicy {
    RetryPolicy::deadline(BUDGET)
        .with_delay(ms(10))
        .with_jitter(ms(20))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking call")
}

fn acquire_event(client: &str, lock: &redlock_core::Lock, t0: u64, t1: u64) -> Event {
    Event::Acquire {
        client: client.into(),
        res: lock.resource().into(),
        token: lock.token().into(),
        mode: Mode::Manual,
        t0,
        t1,
        started: Some(instant_ns(lock.started_at())),
        valid_until: instant_ns(lock.valid_until()),
        ttl_ns: duration_ns(lock.ttl()),
        loss_margin_ns: None,
    }
}

/// A holder's read-then-write with the store's exact validity check.
fn write_event(
    store: &MemoryStore,
    client: &str,
    lock: &redlock_core::Lock,
    read: (u64, u64),
) -> Event {
    match store.write_if_valid(lock.resource(), read.0 + 1, lock.valid_until()) {
        Ok(at) => Event::Write {
            client: client.into(),
            res: lock.resource().into(),
            token: lock.token().into(),
            read_at: read.1,
            at,
            read: read.0,
            wrote: read.0 + 1,
        },
        Err(at) => Event::Skip {
            client: client.into(),
            res: lock.resource().into(),
            token: lock.token().into(),
            at,
            reason: "validity ran out".into(),
        },
    }
}

fn release_event(client: &str, lock: &redlock_core::Lock) -> Event {
    Event::Release {
        client: client.into(),
        res: lock.resource().into(),
        token: lock.token().into(),
        at: now_ns(),
        extensions: lock.extensions(),
    }
}

/// Makes `rl` hold open connections to all `n` nodes, so its next acquire runs on
/// every node at once. On a fresh connection the first call may outlast the 30 ms
/// node timeout, and the key of such a failed attempt may then stay on a node
/// until its TTL (the library's late release runs on a fresh connection under the
/// same timeout), making the next attempts busy.
async fn warm_up(rl: &redlock_core::Redlock, n: usize) {
    for _ in 0..50 {
        if let Ok(lock) = rl.mutex("warm-up").try_acquire(ms(500)).await
            && lock
                .unlock()
                .await
                .is_ok_and(|r| r.report().ok_count() + r.report().pending_count() == n)
        {
            return;
        }
        tokio::time::sleep(ms(20)).await;
    }
    panic!("the client could not reach all {n} nodes");
}

/// A fresh client of the rig, warmed up.
async fn warmed_up_client(rig: &Rig) -> redlock_core::Redlock {
    let rl = redlock_for(&rig.urls());
    warm_up(&rl, rig.len()).await;
    rl
}

/// The validity checker on a real history: a manual acquisition whose deadline is
/// moved 1 µs past `first sighting + ttl − drift`, and an extension whose deadline
/// is moved 1 µs past `start + ttl − drift`, must both be reported.
fn stale_validity_mutations_caught(events: &[Event]) -> (usize, usize) {
    let allowed = |ttl_ns: u64| {
        let ttl = Duration::from_nanos(ttl_ns);
        duration_ns(ttl - ttl.mul_f64(DRIFT_FACTOR) - FIXED_DRIFT)
    };
    let first_seen = |token: &str| {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Sighting { token: t, at, .. } if t == token => Some(*at),
                _ => None,
            })
            .min()
    };
    let base = check(events).stale_validity.len();
    let (mut tried, mut caught) = (0, 0);
    let acquire = events.iter().position(|e| {
        matches!(e, Event::Acquire { mode: Mode::Manual, token, .. } if first_seen(token).is_some())
    });
    let extend = events
        .iter()
        .position(|e| matches!(e, Event::Extend { error: None, .. }));
    for i in [acquire, extend].into_iter().flatten() {
        let mut mutated = events.to_vec();
        match &mut mutated[i] {
            Event::Acquire {
                token,
                valid_until,
                ttl_ns,
                ..
            } => {
                let first = first_seen(token).expect("a sighting");
                *valid_until = first + allowed(*ttl_ns) + 1_000;
            }
            Event::Extend {
                started: Some(s),
                valid_until: Some(v),
                ttl_ns,
                ..
            } => *v = *s + allowed(*ttl_ns) + 1_000,
            _ => continue,
        }
        tried += 1;
        caught += usize::from(check(&mutated).stale_validity.len() > base);
    }
    (tried, caught)
}

fn save_and_check(dir: &Path, name: &str, events: &[Event]) -> Verdict {
    let path = dir.join(format!("{name}.jsonl"));
    write_jsonl(&path, events).expect("write a history");
    let v = check(events);
    println!(
        "  {name}: acquisitions={} extensions={} writes={} skipped={} overlaps={} lost_updates={} \
         stale_validity={} late_writes={} ghosts(violations/checked/seen)={}/{}/{} liveness={} \
         holder_view[writes={} judged={} overlaps={} lost_updates={} stalled_after_check={} \
         (inside another hold: {}) shortened_validities={}] history={}",
        v.acquisitions,
        v.extensions,
        v.writes,
        v.skips,
        v.overlaps.len(),
        v.lost_updates,
        v.stale_validity.len(),
        v.late_writes.len(),
        v.ghost_violations.len(),
        v.ghosts_checked,
        v.ghosts_seen,
        v.liveness_ok.map_or("n/a".to_owned(), |b| b.to_string()),
        v.holder_writes,
        v.holder_checked,
        v.holder_overlaps.len(),
        v.holder_lost_updates,
        v.stalled_after_check,
        v.stalled_overlapping,
        v.shortened,
        path.display()
    );
    if !v.passed() || v.expect_violation {
        print!("{}", v.describe(5));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_suite() {
    // The fenced workloads wait for their turn meanwhile (see `crate::HEAVY`).
    let _turn = crate::HEAVY.write().await;
    let started = Instant::now();
    let seed =
        env_u64("REDLOCK_SEED").unwrap_or_else(|| rand::rng().random_range(1..1_000_000_000));
    let soak = env_u64("REDLOCK_SOAK_SECS").map(Duration::from_secs);
    println!(
        "fault suite: seed {seed} (replay the schedule with REDLOCK_SEED={seed}){}",
        soak.map_or(String::new(), |s| format!(" soak={}s", s.as_secs()))
    );
    let (in_process, processes) = match soak {
        Some(s) => (s.mul_f64(0.6), s.mul_f64(0.4)),
        None => (Duration::from_secs(12), Duration::from_secs(8)),
    };
    let dir: PathBuf = history_dir(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("fault-histories"))
        .join(seed.to_string());
    std::fs::create_dir_all(&dir).expect("create the history dir");

    let mut summary = Summary {
        seed,
        processes: 3,
        ..Summary::default()
    };
    let mut verdicts = Vec::new();
    let h = negative_restart_without_delay(seed).await;
    verdicts.push(save_and_check(&dir, "nc-restart-without-delay", &h));
    let h = negative_early_expiry(seed).await;
    verdicts.push(save_and_check(
        &dir,
        "nc-early-expiry-while-unreachable",
        &h,
    ));
    let h = holder_stall_pair(seed, false).await;
    verdicts.push(save_and_check(
        &dir,
        "nc-holder-stall-without-deadline-check",
        &h,
    ));
    let h = holder_stall_pair(seed, true).await;
    verdicts.push(save_and_check(&dir, "holder-stall-pair", &h));
    let h = ghost_keys(seed).await;
    verdicts.push(save_and_check(&dir, "ghost-keys", &h));
    // The in-process soak runs until its coverage is there (the multi-key
    // clients took a set, and the clients took locks at least 50 times: the
    // evidence the checks below need), for at most four rounds of its
    // length: its 30 ms node timeout is tight on a loaded machine, where one
    // round took 5 locks and no set (two and three busy processes beside
    // it). Each round's history is checked like the first.
    let mut h = Vec::new();
    let mut in_process_acquisitions = 0;
    for round in 0..4u64 {
        let name = if round == 0 {
            "in-process".to_owned()
        } else {
            format!("in-process-{round}")
        };
        let this = randomized_in_process(seed.wrapping_add(round), in_process).await;
        let verdict = save_and_check(&dir, &name, &this);
        in_process_acquisitions += verdict.acquisitions;
        verdicts.push(verdict);
        // The multi-key clients' acquisitions: one `Acquire` per key of a set.
        summary.multi_key_acquisitions += this
            .iter()
            .filter(|e| matches!(e, Event::Acquire { client, .. } if client.starts_with('k')))
            .count() as u64
            / 2;
        if round == 0 {
            h = this;
        }
        if summary.multi_key_acquisitions >= 1 && in_process_acquisitions >= 50 {
            break;
        }
    }
    let (tried, caught) = stale_validity_mutations_caught(&h);
    println!("  stale-validity mutations of the in-process history caught: {caught}/{tried}");
    assert!(
        tried > 0 && caught == tried,
        "the validity checker missed an overstated validity"
    );
    let h = randomized_processes(seed, processes, &dir).await;
    verdicts.push(save_and_check(&dir, "multi-process", &h));

    for v in &verdicts {
        summary.add(v);
    }
    summary.secs = started.elapsed().as_secs_f64();
    // Straight to the process's stderr, past libtest's capture: the summary line
    // shows in CI logs even when the test passes.
    {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "{}", summary.line());
    }
    for v in verdicts.iter().filter(|v| v.expect_violation) {
        assert!(
            v.caught(),
            "negative control {} was NOT caught: the checker cannot fail",
            v.scenario
        );
        assert!(
            v.all_lost_updates() > 0,
            "negative control {}: the lost-update checker missed the lost write",
            v.scenario
        );
    }
    assert!(
        summary.passed(),
        "fault suite failed (seed {seed}, histories in {}):\n{}",
        dir.display(),
        verdicts
            .iter()
            .filter(|v| !v.passed())
            .map(|v| format!("{}:\n{}", v.scenario, v.describe(10)))
            .collect::<String>()
    );
    // Coverage, not a property: the multi-key clients must have taken their
    // sets at least once. Under the nemesis they lose most races to the
    // single-key clients, and in the 20 s Valkey soak they took 3–12 sets
    // (seed 154949092 gave 3 in one CI run, 9 and 12 when run again), so a
    // higher floor made the suite flaky.
    assert!(
        summary.multi_key_acquisitions >= 1,
        "the multi-key workload never took a set: {}",
        summary.line()
    );
    assert!(
        summary.acquisitions > 100,
        "the workload barely ran: {}",
        summary.line()
    );
}
