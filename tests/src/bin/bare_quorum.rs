//! Issue 48's probe of wake-ups at a bare quorum (item 7): 3 real
//! `redis-server` nodes, one killed at the start and not restarted, so the
//! two left are a quorum of two and any split vote fails an attempt. Several
//! OS processes contend for one mutex, each re-acquiring as soon as it
//! released, in rounds that alternate wake-ups on and off on the same nodes;
//! the probe prints, per mode, the holds per second (of the holds that
//! started within the round's seconds: a process still waiting at the end
//! finishes its wait, later when it polls than when it is woken, and those
//! holds are counted apart), the split votes (failed
//! attempts that some node granted), the waits that ran out, and the longest
//! time no process held the lock.
//!
//! ```text
//! bare_quorum [--procs 6] [--secs 10] [--rounds 2]
//! ```
//!
//! Each process: `acquire_with(ttl 1 s, deadline 10 s, delay 100 ms, jitter
//! 100 ms)`, then three 15 ms sections, then release, until its round is up.
//! The parent starts the nodes (the test harness's `Cluster`, killed on
//! exit), runs the processes (this binary again, `--worker`), and merges
//! their holds' wall-clock intervals for the gaps. Holds per second and gaps
//! are comparable only between the modes of one run.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlock_core::Redlock;
use redlock_tests::Cluster;
use redlock_tests::probe::ProbeArgs;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

const USAGE: &str = "bare_quorum [--procs N] [--secs S] [--rounds N]";

fn usage(msg: &str) -> ! {
    redlock_tests::probe::fail("bare_quorum", USAGE, msg)
}

/// What one mode's processes did in one round, summed.
#[derive(Default)]
struct Tally {
    holds: u64,
    /// The holds that started within the round's `secs`: after them, the
    /// processes stop one by one, and those still waiting finish their
    /// waits with fewer rivals (a polling waiter's later than a woken one's).
    in_window: u64,
    split: u64,
    /// Each process's holds (the busiest against the least busy: whether
    /// the releaser took the lock straight back).
    per_proc: Vec<u64>,
    ran_out: u64,
    errors: u64,
    secs: u64,
    /// Every hold's wall-clock interval, microseconds since the epoch.
    intervals: Vec<(u64, u64)>,
    /// The round's wall-clock span, microseconds since the epoch.
    span: (u64, u64),
    /// The longest time no process held, in microseconds.
    longest_gap: u64,
    /// Every time from one hold's end to the next one's start
    /// (microseconds).
    handovers: Vec<u64>,
}

fn main() {
    let args = ProbeArgs::parse("bare_quorum", USAGE);
    if args.has("worker") {
        worker(&args);
        return;
    }
    let procs = args.num("procs", 6);
    let secs = args.num("secs", 10);
    let rounds = args.num("rounds", 2);
    let cluster = Cluster::start(3);
    cluster.node(2).kill();
    let nodes = cluster.urls().join(",");
    let me = std::env::current_exe().unwrap_or_else(|e| usage(&format!("own path: {e}")));
    let mut on = Tally::default();
    let mut off = Tally::default();
    for round in 0..rounds * 2 {
        // Alternate, so that a drift of the machine's load hits both modes.
        let wake = round % 2 == 0;
        let tally = run_round(&me, &nodes, procs, secs, wake);
        let into = if wake { &mut on } else { &mut off };
        into.holds += tally.holds;
        into.in_window += tally.in_window;
        into.split += tally.split;
        into.ran_out += tally.ran_out;
        into.errors += tally.errors;
        into.secs += tally.secs;
        let gap = longest_gap(&tally.intervals, tally.span);
        into.longest_gap = into.longest_gap.max(gap);
        let handover = handovers(&tally.intervals);
        into.handovers.extend(&handover);
        let held: Vec<u64> = tally
            .intervals
            .iter()
            .map(|(from, to)| to.saturating_sub(*from))
            .collect();
        println!(
            "round {round} wake_on_release={wake}: holds={} split_votes={} waits_ran_out={} \
             other_errors={} longest_gap_ms={} handover_ms={} held_ms={} first_hold_ms={} \
             last_release_s={:.2} overlaps={} holds_per_process={:?}",
            tally.holds,
            tally.split,
            tally.ran_out,
            tally.errors,
            gap / 1000,
            spread_ms(handover),
            spread_ms(held),
            tally
                .intervals
                .iter()
                .map(|(from, _)| from.saturating_sub(tally.span.0))
                .min()
                .unwrap_or(0)
                / 1000,
            tally
                .intervals
                .iter()
                .map(|(_, to)| to.saturating_sub(tally.span.0))
                .max()
                .unwrap_or(0) as f64
                / 1e6,
            overlaps(&tally.intervals),
            tally.per_proc
        );
    }
    println!("procs={procs} secs_per_round={secs} rounds_per_mode={rounds} (node 2 of 3 down)");
    for (name, t) in [("wake-ups on ", &on), ("wake-ups off", &off)] {
        println!(
            "  {name}: holds/s={:.1} (all holds: {}) split_votes={} waits_ran_out={} \
             other_errors={} longest_gap_ms={} handover_ms={}",
            t.in_window as f64 / t.secs.max(1) as f64,
            t.holds,
            t.split,
            t.ran_out,
            t.errors,
            t.longest_gap / 1000,
            spread_ms(t.handovers.clone())
        );
    }
}

/// Runs `procs` workers for `secs` with wake-ups on or off; their tally.
fn run_round(me: &std::path::Path, nodes: &str, procs: u64, secs: u64, wake: bool) -> Tally {
    let begin = now_us();
    let children: Vec<_> = (0..procs)
        .map(|p| {
            Command::new(me)
                .args(["--worker", &p.to_string(), "--nodes", nodes])
                .args(["--secs", &secs.to_string()])
                .args(["--wake", if wake { "on" } else { "off" }])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| usage(&format!("start a worker: {e}")))
        })
        .collect();
    let mut tally = Tally {
        secs,
        ..Tally::default()
    };
    for (p, child) in children.into_iter().enumerate() {
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| usage(&format!("worker {p}: {e}")));
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let field = |name: &str| -> u64 {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("hold ") {
                tally.intervals.push((field("from"), field("to")));
            } else if line.starts_with("done ") {
                tally.holds += field("holds");
                tally.per_proc.push(field("holds"));
                tally.split += field("split");
                tally.ran_out += field("ran_out");
                tally.errors += field("errors");
            }
        }
    }
    tally.span = (begin, now_us());
    let end = begin.saturating_add(secs.saturating_mul(1_000_000));
    tally.in_window = tally
        .intervals
        .iter()
        .filter(|(from, _)| *from < end)
        .count() as u64;
    tally
}

/// From each hold's end to the next hold's start (holds in order of their
/// start), in microseconds.
fn handovers(intervals: &[(u64, u64)]) -> Vec<u64> {
    let mut sorted = intervals.to_vec();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .collect()
}

/// Microsecond times as `mean/p50/p90/p99` milliseconds.
fn spread_ms(mut us: Vec<u64>) -> String {
    us.sort_unstable();
    let ms = |v: u64| v as f64 / 1000.0;
    let at = |q: usize| {
        us.get((us.len().saturating_sub(1)) * q / 100)
            .copied()
            .unwrap_or(0)
    };
    let mean = us.iter().sum::<u64>() as f64 / us.len().max(1) as f64;
    format!(
        "{:.1}/{:.1}/{:.1}/{:.1}",
        mean / 1000.0,
        ms(at(50)),
        ms(at(90)),
        ms(at(99))
    )
}

/// How many holds started before an earlier-started hold had ended: two
/// holders at once (the probe's safety check; always 0 when the lock holds).
fn overlaps(intervals: &[(u64, u64)]) -> usize {
    let mut sorted = intervals.to_vec();
    sorted.sort_unstable();
    let mut covered_to = 0;
    let mut n = 0;
    for (from, to) in sorted {
        if from < covered_to {
            n += 1;
        }
        covered_to = covered_to.max(to);
    }
    n
}

/// The longest time within `span` that no interval covers, in microseconds.
fn longest_gap(intervals: &[(u64, u64)], span: (u64, u64)) -> u64 {
    let mut sorted = intervals.to_vec();
    sorted.sort_unstable();
    let (mut covered_to, mut longest) = (span.0, 0);
    for (from, to) in sorted {
        longest = longest.max(from.saturating_sub(covered_to));
        covered_to = covered_to.max(to);
    }
    longest.max(span.1.saturating_sub(covered_to))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Counts the library's failed attempts that some node granted: a split
/// vote (its report names a node `ok`).
struct SplitVotes(Arc<AtomicU64>);

impl<S: tracing::Subscriber> Layer<S> for SplitVotes {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Seen {
            failed: bool,
            granted: bool,
        }
        impl Visit for Seen {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                match field.name() {
                    "message" => self.failed |= format!("{value:?}") == "attempt failed",
                    "error" => self.granted |= format!("{value:?}").contains(": ok ("),
                    _ => {}
                }
            }
        }
        let mut seen = Seen {
            failed: false,
            granted: false,
        };
        event.record(&mut seen);
        if seen.failed && seen.granted {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One process: acquire, three 15 ms sections, release, until the time is
/// up; prints a `hold from=.. to=..` line per hold (wall-clock µs) and
/// `done holds=N split=N ran_out=N errors=N`.
fn worker(args: &ProbeArgs) {
    let nodes = args.nodes();
    let secs = args.num("secs", 10);
    let wake = args.get("wake") != Some("off");
    let split = Arc::new(AtomicU64::new(0));
    // Only the failed attempts' events: a debug event that is enabled has
    // its fields built (a waiter's channels, formatted) and visited, at
    // every wake-up of every waiting process, which the mode with wake-ups
    // on paid for at each handover and the other did not.
    let filter = tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_event()
            && meta.target() == "redlock_core::wait"
            && meta.fields().field("error").is_some()
    });
    // `REDLOCK_PROBE_LOG=1`: every process also prints the library's debug
    // events, with wall-clock microseconds, to stderr (for reading a run).
    let log = std::env::var_os("REDLOCK_PROBE_LOG").map(|_| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("redlock_core", tracing::Level::DEBUG)
                    .with_target("bare_quorum", tracing::Level::DEBUG),
            )
    });
    let subscriber = Registry::default()
        .with(SplitVotes(Arc::clone(&split)).with_filter(filter))
        .with(log);
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        usage("a tracing subscriber was already set");
    }
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| usage(&format!("runtime: {e}")));
    let me = args.num("worker", 0);
    rt.block_on(tracing::Instrument::instrument(
        async move {
            let rl = Redlock::builder()
                .urls(nodes)
                // The down node refuses connections at once; a short timeout
                // keeps a stalled connect from counting against the others.
                .node_timeout(Duration::from_millis(200))
                .wake_on_release(wake)
                .build()
                .unwrap_or_else(|e| usage(&format!("handle: {e}")));
            let retry = redlock_tests::probe::wait_policy();
            let ttl = redlock_tests::probe::HOLD_TTL;
            let until = Instant::now() + Duration::from_secs(secs);
            let (mut holds, mut ran_out, mut errors) = (0u64, 0u64, 0u64);
            // Bounded: each wait ends by its 10 s deadline.
            while Instant::now() < until {
                match rl.mutex("bare-quorum").acquire_with(ttl, &retry).await {
                    Ok(lock) => {
                        let from = now_us();
                        for _ in 0..3 {
                            tokio::time::sleep(redlock_tests::probe::SECTION).await;
                        }
                        let to = now_us();
                        let _ = rl.unlock(lock).await;
                        println!("hold from={from} to={to}");
                        holds += 1;
                    }
                    Err(redlock_core::Error::Busy { .. }) => ran_out += 1,
                    Err(_) => errors += 1,
                }
            }
            println!(
                "done holds={holds} split={} ran_out={ran_out} errors={errors}",
                split.load(Ordering::Relaxed)
            );
        },
        tracing::debug_span!("worker", me),
    ));
}
