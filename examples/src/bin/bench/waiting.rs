//! Scenario 8: waiting woken by releases against waiting by polling, in the
//! same run.
//!
//! - **one process:** 16 tasks on one key, each holds it 2 ms, then asks again,
//!   with `lock_with(.., RetryPolicy::deadline(10 s))` (the default 100 ms
//!   delay + up to 100 ms jitter): acquisitions/s, the time each `lock_with`
//!   waited, and how evenly the tasks were served;
//! - **three processes × 8 tasks:** the same loop in three child processes of
//!   this binary, each with its own handle (its own queue and subscriptions):
//!   the handoff from a release to the next holder's acquire, in round trips of
//!   the raw baseline's acquire measured in the same run, and the spread
//!   between the processes.
//!
//! Both handles are built from URLs: a node given as a pool has no address to
//! subscribe to, so its waiters fall back to polling.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;
use redlock_core::{Redlock, RetryPolicy};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{BoxError, NODE_TIMEOUT, Raw, Setup, Stats, us};

const HOLD: Duration = Duration::from_millis(2);
const TTL: Duration = Duration::from_secs(10);

fn policy() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(10))
}

fn handle(urls: &[String], wake: bool) -> Result<Redlock, BoxError> {
    Ok(Redlock::builder()
        .urls(urls.iter().cloned())
        .node_timeout(*NODE_TIMEOUT)
        .wake_on_release(wake)
        .build()?)
}

/// Wall-clock nanoseconds: the one clock three processes can compare.
/// Benchmark bookkeeping only; the library never reads it.
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One hold: when `lock_with` was called, when it returned, when the holder
/// started its release (wall-clock ns), and which task held it.
#[derive(Clone, Copy)]
struct Hold {
    asked: u64,
    got: u64,
    released: u64,
    task: usize,
}

/// `tasks` tasks take turns on `key` for `secs`; every hold is recorded.
async fn run_tasks(
    rl: &Redlock,
    key: &str,
    tasks: usize,
    secs: f64,
) -> Result<Vec<Hold>, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (rl, key, stop) = (rl.clone(), key.to_owned(), stop.clone());
            tokio::spawn(async move {
                let mut holds = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let asked = wall_ns();
                    let Ok(lock) = rl.mutex(&key).acquire_with(TTL, &policy()).await else {
                        continue;
                    };
                    let got = wall_ns();
                    tokio::time::sleep(HOLD).await;
                    let released = wall_ns();
                    let _ = rl.unlock(lock).await;
                    holds.push(Hold {
                        asked,
                        got,
                        released,
                        task,
                    });
                }
                holds
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await?);
    }
    Ok(all)
}

/// What one variant of the one-process run measured.
struct Local {
    rate: f64,
    wait: Stats,
    /// From one holder's release to the next holder's acquire.
    handoff: Stats,
    /// How long the 2 ms holds really took (timer granularity).
    hold: Stats,
    min_per_task: usize,
    max_per_task: usize,
    /// `SET` calls per acquisition, summed over the nodes: the attempts the
    /// waiters sent, won or lost, times the nodes.
    sets: f64,
}

async fn one_process(urls: &[String], wake: bool, secs: f64) -> Result<Local, BoxError> {
    let rl = handle(urls, wake)?;
    let key = format!("bench:wait:local:{wake}");
    // Connections and scripts first, as a running service has them.
    let warm = rl.mutex(format!("{key}:warm")).try_acquire(TTL).await?;
    rl.unlock(warm).await?;
    let sets_before = set_calls(urls).await?;
    let start = Instant::now();
    let holds = run_tasks(&rl, &key, 16, secs).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let sets = set_calls(urls).await?.saturating_sub(sets_before);
    let mut sorted = holds.clone();
    sorted.sort_by_key(|h| h.got);
    let handoff = sorted
        .windows(2)
        .filter_map(|w| w[1].got.checked_sub(w[0].released))
        .map(Duration::from_nanos)
        .collect();
    let hold = holds
        .iter()
        .map(|h| Duration::from_nanos(h.released.saturating_sub(h.got)))
        .collect();
    let mut per_task = [0usize; 16];
    for h in &holds {
        per_task[h.task] += 1;
    }
    Ok(Local {
        rate: holds.len() as f64 / elapsed,
        wait: Stats::new(
            holds
                .iter()
                .map(|h| Duration::from_nanos(h.got.saturating_sub(h.asked)))
                .collect(),
        ),
        handoff: Stats::new(handoff),
        hold: Stats::new(hold),
        min_per_task: per_task.iter().copied().min().unwrap_or(0),
        max_per_task: per_task.iter().copied().max().unwrap_or(0),
        sets: sets as f64 / holds.len().max(1) as f64,
    })
}

/// The child process: `bench waiting-child <wake> <secs> <key> <url>...`.
/// Prints one line per hold: `asked got released task`.
pub(super) async fn child(args: &[String]) -> Result<(), BoxError> {
    let [wake, secs, key, urls @ ..] = args else {
        return Err("usage: waiting-child <wake> <secs> <key> <url>...".into());
    };
    // `BENCH_CHILD_LOG=<dir>`: the library's debug events go to
    // `<dir>/child-<pid>.log` (for reading a run, not for timing it).
    if let Some(dir) = std::env::var_os("BENCH_CHILD_LOG") {
        let path = std::path::Path::new(&dir).join(format!("child-{}.log", std::process::id()));
        let file = std::fs::File::create(path)?;
        let _ = tracing_subscriber::fmt()
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .with_env_filter("redlock_core=debug")
            .try_init();
    }
    let rl = handle(urls, wake == "true")?;
    let warm = rl
        .mutex(format!("{key}:warm:{}", std::process::id()))
        .try_acquire(TTL)
        .await?;
    rl.unlock(warm).await?;
    // Start together: the parent says go on stdin.
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await?;
    for h in run_tasks(&rl, key, 8, secs.parse()?).await? {
        println!("{} {} {} {}", h.asked, h.got, h.released, h.task);
    }
    Ok(())
}

/// What one variant of the three-process run measured.
struct Spread {
    handoff: Stats,
    /// Handoffs to a holder of the same process as the one before, and to
    /// one of another process.
    within: Stats,
    across: Stats,
    per_process: Vec<usize>,
    wait_p99_per_process: Vec<Duration>,
    /// `SET` calls per acquisition, summed over the nodes.
    sets: f64,
}

async fn three_processes(urls: &[String], wake: bool, secs: f64) -> Result<Spread, BoxError> {
    let exe = std::env::current_exe()?;
    let key = format!("bench:wait:procs:{wake}");
    let mut children = Vec::new();
    for _ in 0..3 {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("waiting-child")
            .arg(wake.to_string())
            .arg(secs.to_string())
            .arg(&key)
            .args(urls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        children.push(cmd.spawn()?);
    }
    // Give them time to connect and warm up, then start them together.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sets_before = set_calls(urls).await?;
    for c in &mut children {
        if let Some(mut stdin) = c.stdin.take() {
            tokio::io::AsyncWriteExt::write_all(&mut stdin, b"go\n").await?;
        }
    }
    let mut holds: Vec<(usize, Hold)> = Vec::new();
    for (p, c) in children.into_iter().enumerate() {
        let out = tokio::time::timeout(Duration::from_secs_f64(secs + 30.0), c.wait_with_output())
            .await??;
        if !out.status.success() {
            return Err(format!("waiting-child exited with {}", out.status).into());
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let n: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [asked, got, released, task] = n[..] {
                holds.push((
                    p,
                    Hold {
                        asked,
                        got,
                        released,
                        task: task as usize,
                    },
                ));
            }
        }
    }
    let sets = set_calls(urls).await?.saturating_sub(sets_before);
    holds.sort_by_key(|(_, h)| h.got);
    let gap = |w: &[(usize, Hold)]| {
        w[1].1
            .got
            .checked_sub(w[0].1.released)
            .map(Duration::from_nanos)
    };
    let handoff = holds.windows(2).filter_map(gap).collect();
    let (mut within, mut across) = (Vec::new(), Vec::new());
    for w in holds.windows(2) {
        if let Some(d) = gap(w) {
            if w[0].0 == w[1].0 {
                within.push(d);
            } else {
                across.push(d);
            }
        }
    }
    let mut per_process = vec![0; 3];
    let mut waits: Vec<Vec<Duration>> = vec![Vec::new(); 3];
    for (p, h) in &holds {
        per_process[*p] += 1;
        waits[*p].push(Duration::from_nanos(h.got.saturating_sub(h.asked)));
    }
    Ok(Spread {
        handoff: Stats::new(handoff),
        within: Stats::new(within),
        across: Stats::new(across),
        per_process,
        wait_p99_per_process: waits.into_iter().map(|w| Stats::new(w).pct(0.99)).collect(),
        sets: sets as f64 / holds.len().max(1) as f64,
    })
}

/// `SET` calls served so far, summed over the nodes (`INFO commandstats`).
async fn set_calls(urls: &[String]) -> Result<u64, BoxError> {
    let mut total = 0;
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        total += info
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_set:calls="))
            .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

/// The raw baseline's acquire round trip (concurrent `SET NX PX` to every
/// node), p50: the unit of the handoff.
async fn round_trip(setup: &Setup) -> Result<Duration, BoxError> {
    let raw = Raw::new(&setup.pools).await?;
    let mut lat = Vec::new();
    for i in 0..500 {
        let (key, tok) = (format!("bench:wait:rtt:{i}"), Raw::token());
        let start = Instant::now();
        raw.lock(&key, &tok).await;
        lat.push(start.elapsed());
        raw.unlock(&key, &tok).await;
    }
    Ok(Stats::new(lat).pct(0.5))
}

fn line(name: &str, wake: String, poll: String, ratio: String) {
    println!("| {name:<44} | {wake:>16} | {poll:>16} | {ratio:>8} |");
}

pub(super) async fn waiting(setup: &Setup) -> Result<(), BoxError> {
    let secs = if setup.quick { 1.0 } else { 5.0 };
    let rtt = round_trip(setup).await?;
    // Polling first, then wake-ups, then polling again: noise hits both.
    let poll_a = one_process(&setup.urls, false, secs / 2.0).await?;
    let wake = one_process(&setup.urls, true, secs).await?;
    let poll_b = one_process(&setup.urls, false, secs / 2.0).await?;
    let poll = Local {
        rate: (poll_a.rate + poll_b.rate) / 2.0,
        wait: Stats::new([poll_a.wait.sorted, poll_b.wait.sorted].concat()),
        handoff: Stats::new([poll_a.handoff.sorted, poll_b.handoff.sorted].concat()),
        hold: Stats::new([poll_a.hold.sorted, poll_b.hold.sorted].concat()),
        min_per_task: poll_a.min_per_task.min(poll_b.min_per_task),
        max_per_task: poll_a.max_per_task.max(poll_b.max_per_task),
        sets: (poll_a.sets + poll_b.sets) / 2.0,
    };
    println!(
        "\n### 8. waiting: woken by releases vs polling (16 tasks, one key, hold {HOLD:?}, \
         RetryPolicy::deadline(10 s))\n"
    );
    line("metric", "wake".into(), "poll".into(), "ratio".into());
    println!("|{:-<46}|{:->18}|{:->18}|{:->10}|", "", "", "", "");
    let ms = |d: Duration| format!("{:.2} ms", us(d) / 1000.0);
    line(
        "acquisitions/s",
        format!("{:.1}", wake.rate),
        format!("{:.1}", poll.rate),
        format!("{:.2}", wake.rate / poll.rate),
    );
    for (name, p) in [("wait p50", 0.5), ("wait p99", 0.99)] {
        line(
            name,
            ms(wake.wait.pct(p)),
            ms(poll.wait.pct(p)),
            String::new(),
        );
    }
    line(
        "wait max",
        ms(wake.wait.max()),
        ms(poll.wait.max()),
        String::new(),
    );
    for (name, p) in [
        ("handoff p50 (release → next acquire)", 0.5),
        ("handoff p99", 0.99),
    ] {
        line(
            name,
            ms(wake.handoff.pct(p)),
            ms(poll.handoff.pct(p)),
            String::new(),
        );
    }
    line(
        "hold p50 (asked 2 ms)",
        ms(wake.hold.pct(0.5)),
        ms(poll.hold.pct(0.5)),
        String::new(),
    );
    line(
        "SET calls per acquisition (all nodes)",
        format!("{:.1}", wake.sets),
        format!("{:.1}", poll.sets),
        format!("{:.2}", wake.sets / poll.sets.max(1e-9)),
    );
    let fairness = |l: &Local| l.min_per_task as f64 / l.max_per_task.max(1) as f64;
    line(
        "per-task acquisitions min/max",
        format!(
            "{}/{} = {:.2}",
            wake.min_per_task,
            wake.max_per_task,
            fairness(&wake)
        ),
        format!(
            "{}/{} = {:.2}",
            poll.min_per_task,
            poll.max_per_task,
            fairness(&poll)
        ),
        String::new(),
    );
    let procs_wake = three_processes(&setup.urls, true, secs).await?;
    let procs_poll = three_processes(&setup.urls, false, secs).await?;
    println!(
        "\n3 processes × 8 tasks, same loop; one round trip (raw acquire p50) = {}\n",
        ms(rtt)
    );
    line("metric", "wake".into(), "poll".into(), String::new());
    println!("|{:-<46}|{:->18}|{:->18}|{:->10}|", "", "", "", "");
    let rtts = |d: Duration| format!("{:.1} RTT", d.as_secs_f64() / rtt.as_secs_f64().max(1e-9));
    for (name, p) in [
        ("handoff p50 (release → next acquire)", 0.5),
        ("handoff p99", 0.99),
    ] {
        line(
            name,
            format!(
                "{} {}",
                ms(procs_wake.handoff.pct(p)),
                rtts(procs_wake.handoff.pct(p))
            ),
            format!(
                "{} {}",
                ms(procs_poll.handoff.pct(p)),
                rtts(procs_poll.handoff.pct(p))
            ),
            String::new(),
        );
    }
    let split = |s: &Spread| {
        let n = s.within.sorted.len() + s.across.sorted.len();
        format!(
            "{:.0}% {} / {}",
            100.0 * s.within.sorted.len() as f64 / n.max(1) as f64,
            rtts(s.within.pct(0.5)),
            rtts(s.across.pct(0.5))
        )
    };
    line(
        "same process next: share, p50 same / other",
        split(&procs_wake),
        split(&procs_poll),
        String::new(),
    );
    let list = |v: &[usize]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" / ")
    };
    line(
        "acquisitions per process",
        list(&procs_wake.per_process),
        list(&procs_poll.per_process),
        String::new(),
    );
    let p99s = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.0}", us(*d) / 1000.0))
            .collect::<Vec<_>>()
            .join("/")
    };
    line(
        "SET calls per acquisition (all nodes)",
        format!("{:.1}", procs_wake.sets),
        format!("{:.1}", procs_poll.sets),
        String::new(),
    );
    line(
        "wait p99 per process (ms)",
        p99s(&procs_wake.wait_p99_per_process),
        p99s(&procs_poll.wait_p99_per_process),
        String::new(),
    );
    Ok(())
}
