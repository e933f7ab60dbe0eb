//! The benchmark: this library against a raw baseline in the same process and run.
//!
//! ```sh
//! cargo run --release -p redlock-examples --bin bench -- all          # full run (~3 min)
//! cargo run --release -p redlock-examples --bin bench -- all --quick  # smoke (~20 s)
//! cargo run --release -p redlock-examples --bin bench -- sequential   # one scenario
//! ```
//!
//! Scenarios: `sequential`, `concurrent`, `contended`, `paused`, `middleware`,
//! `fenced`, `held`, `waiting`, `idempotency`, `metrics`, `scale`, `native` (not in `all`:
//! for nodes with native commands, e.g. `REDIS_SERVER=<valkey-server>`), `side-by-side`
//! (not in `all`: the library's tasks and raw's at the same time). It starts 5 local Redis nodes, or uses `REDLOCK_NODES`.
//!
//! The raw baseline uses the same deadpool pools with no library logic: one
//! multiplexed connection per node taken from the pool (as the library does), a
//! concurrent `SET key token NX PX ttl` to every node, then the compare-and-delete
//! script by `EVALSHA` on every node. Library and raw runs alternate in blocks so
//! that machine noise hits both alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use futures_util::future::join_all;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlock_core::{Error, LockOptions, Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tower::RedlockLayer;

mod cost;
mod idempotency;
mod metrics_cost;
mod native;
mod publish;
mod scale;
mod side_by_side;
mod waiting;

const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

const TTL: Duration = Duration::from_secs(10);
/// The node timeout: 50 ms, or `BENCH_NODE_TIMEOUT_MS` (an instruction count
/// under valgrind, which runs the client some 50 times slower, needs more).
static NODE_TIMEOUT: std::sync::LazyLock<Duration> =
    std::sync::LazyLock::new(
        || Duration::from_millis(env_or("BENCH_NODE_TIMEOUT_MS", 50.0) as u64),
    );

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Setup {
    _cluster: Option<Cluster>,
    urls: Vec<String>,
    pools: Vec<deadpool_redis::Pool>,
    quick: bool,
}

/// The baseline: the wire work of a Redlock acquire and release, nothing else.
struct Raw {
    conns: Vec<MultiplexedConnection>,
    release_sha: String,
    /// Whether the release script takes the key's waiters flag as its
    /// second key (the library's did until 2026-11-27; `publish` measures
    /// that form against the library's, which names the flag itself).
    flagged: bool,
}

impl Raw {
    async fn new(pools: &[deadpool_redis::Pool]) -> Result<Self, BoxError> {
        Self::with_release(pools, RELEASE).await
    }

    /// The baseline with another release script (`publish` measures the
    /// library's, which also announces the release).
    async fn with_release(pools: &[deadpool_redis::Pool], release: &str) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        for p in pools {
            conns.push(deadpool_redis::Connection::take(p.get().await?));
        }
        let release_sha = redis::Script::new(release).get_hash().to_owned();
        for c in &mut conns {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(release)
                .query_async(c)
                .await?;
        }
        let flagged = release.contains("KEYS[2]");
        Ok(Self {
            conns,
            release_sha,
            flagged,
        })
    }

    /// 128 random bits from the OS, hex: the same work the library does.
    fn token() -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut b = [0u8; 16];
        let _ = getrandom_fill(&mut b);
        let mut s = String::with_capacity(32);
        for x in b {
            s.push(HEX[usize::from(x >> 4)] as char);
            s.push(HEX[usize::from(x & 15)] as char);
        }
        s
    }

    /// Concurrent SET NX PX to every node; true on a quorum.
    async fn lock(&self, key: &str, token: &str) -> bool {
        let ttl = TTL.as_millis() as u64;
        let oks = join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            async move {
                let r = tokio::time::timeout(
                    *NODE_TIMEOUT,
                    redis::cmd("SET")
                        .arg(key)
                        .arg(token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl)
                        .query_async::<Option<String>>(&mut c),
                )
                .await;
                matches!(r, Ok(Ok(Some(_))))
            }
        }))
        .await;
        oks.into_iter().filter(|b| *b).count() > self.conns.len() / 2
    }

    async fn unlock(&self, key: &str, token: &str) {
        let flag = self
            .flagged
            .then(|| format!("{key}{}", redlock_core::__WAITERS_SUFFIX));
        join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let sha = &self.release_sha;
            let flag = &flag;
            async move {
                let mut cmd = redis::cmd("EVALSHA");
                match flag {
                    Some(flag) => cmd.arg(sha).arg(2).arg(key).arg(flag).arg(token),
                    None => cmd.arg(sha).arg(1).arg(key).arg(token),
                };
                let _ = tokio::time::timeout(*NODE_TIMEOUT, cmd.query_async::<i64>(&mut c)).await;
            }
        }))
        .await;
    }
}

/// Whether `BENCH_ONLY` leaves contender `who` (0 library, 1 raw, 2 rslock)
/// out: unset runs all three; `lib`, `raw` or `rslock` runs that one alone,
/// a comma-separated list (`lib,raw`) runs those, and `none` runs none (the rest of the process alone, to take it out of an
/// instruction count).
fn skipped(only: &str, who: usize) -> bool {
    let name = ["lib", "raw", "rslock"].get(who).copied().unwrap_or("");
    !only.is_empty() && !only.split(',').any(|o| o.trim() == name)
}

/// A number from the environment, or `default`.
fn env_or(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn getrandom_fill(b: &mut [u8]) -> Result<(), BoxError> {
    getrandom::fill(b).map_err(|e| e.to_string().into())
}

fn redlock(setup: &Setup) -> Result<Redlock, Error> {
    setup
        .pools
        .iter()
        .cloned()
        .fold(Redlock::builder(), |b, p| b.pool(p))
        .node_timeout(*NODE_TIMEOUT)
        .build()
}

struct Stats {
    sorted: Vec<Duration>,
}

impl Stats {
    fn new(mut v: Vec<Duration>) -> Self {
        v.sort_unstable();
        Self { sorted: v }
    }

    fn pct(&self, p: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.sorted.len() - 1) as f64 * p).round() as usize;
        self.sorted[i]
    }

    fn max(&self) -> Duration {
        self.sorted.last().copied().unwrap_or_default()
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn row(name: &str, lib: f64, raw: f64, unit: &str) {
    let ratio = if raw > 0.0 { lib / raw } else { f64::NAN };
    println!("| {name:<38} | {lib:>12.1} | {raw:>12.1} | {unit:<8} | {ratio:>6.3} |");
}

/// A row with the peer (rslock) as well: its figure and its ratio to raw.
fn row3(name: &str, lib: f64, raw: f64, peer: f64, unit: &str) {
    let ratio = |x: f64| if raw > 0.0 { x / raw } else { f64::NAN };
    println!(
        "| {name:<38} | {lib:>12.1} | {raw:>12.1} | {unit:<8} | {:>6.3} | {peer:>12.1} | {:>6.3} |",
        ratio(lib),
        ratio(peer)
    );
}

fn header3(title: &str) {
    header3_named(title, ["library", "raw", "rslock 0.10"]);
}

/// [`header3`] with other names for the three columns.
fn header3_named(title: &str, [first, second, third]: [&str; 3]) {
    println!("\n### {title}\n");
    println!(
        "| {:<38} | {:>12} | {:>12} | {:<8} | {:>6} | {:>12} | {:>6} |",
        "metric", first, second, "unit", "ratio", third, "ratio"
    );
    println!(
        "|{:-<40}|{:->14}|{:->14}|{:-<10}|{:->8}|{:->14}|{:->8}|",
        "", "", "", "", "", "", ""
    );
}

/// rslock over the same nodes, one attempt per call (as `try_lock`).
fn peer(setup: &Setup) -> rslock::LockManager {
    let mut m = rslock::LockManager::new(setup.urls.clone());
    m.set_retry(1, Duration::ZERO);
    m
}

fn header(title: &str) {
    println!("\n### {title}\n");
    println!(
        "| {:<38} | {:>12} | {:>12} | {:<8} | {:>6} |",
        "metric", "library", "raw", "unit", "ratio"
    );
    println!(
        "|{:-<40}|{:->14}|{:->14}|{:-<10}|{:->8}|",
        "", "", "", "", ""
    );
}

/// 1. Sequential lock+unlock on distinct keys.
async fn sequential(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let (blocks, per_block) = if setup.quick { (4, 250) } else { (10, 600) };
    // Warm-up both paths (connections, script caches).
    for i in 0..300 {
        let l = lib.try_lock(&format!("bench:warm:{i}"), TTL).await?;
        lib.unlock(l).await?;
        let t = Raw::token();
        raw.lock(&format!("bench:rwarm:{i}"), &t).await;
        raw.unlock(&format!("bench:rwarm:{i}"), &t).await;
    }
    let rsl = peer(setup);
    for i in 0..300 {
        let l = rsl.lock(format!("bench:pwarm:{i}").as_str(), TTL).await?;
        rsl.unlock(&l).await;
    }
    let (mut lib_lat, mut raw_lat, mut peer_lat) = (Vec::new(), Vec::new(), Vec::new());
    let mut n = 0u64;
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for b in 0..blocks {
        for pass in 0..3 {
            // Which of library (0), raw (1) and rslock (2) runs, in an order
            // that rotates from block to block.
            let who = (pass + b) % 3;
            let run_lib = who == 0;
            if skipped(&only, who) {
                continue;
            }
            for _ in 0..per_block {
                n += 1;
                let key = format!("bench:seq:{n}");
                let start = Instant::now();
                if who == 2 {
                    let l = rsl.lock(key.as_str(), TTL).await?;
                    rsl.unlock(&l).await;
                    peer_lat.push(start.elapsed());
                } else if run_lib {
                    let l = lib.try_lock(&key, TTL).await?;
                    lib.unlock(l).await?;
                    lib_lat.push(start.elapsed());
                } else {
                    let t = Raw::token();
                    if !raw.lock(&key, &t).await {
                        return Err("raw lock failed".into());
                    }
                    raw.unlock(&key, &t).await;
                    raw_lat.push(start.elapsed());
                }
            }
        }
    }
    let (l, r, p) = (
        Stats::new(lib_lat),
        Stats::new(raw_lat),
        Stats::new(peer_lat),
    );
    header3(&format!(
        "1. sequential lock+unlock, distinct keys ({} pairs each)",
        l.sorted.len()
    ));
    row3("p50", us(l.pct(0.5)), us(r.pct(0.5)), us(p.pct(0.5)), "µs");
    row3(
        "p99",
        us(l.pct(0.99)),
        us(r.pct(0.99)),
        us(p.pct(0.99)),
        "µs",
    );
    row3("max", us(l.max()), us(r.max()), us(p.max()), "µs");
    Ok(())
}

/// `tasks` tasks, each running `pair(task, i)` for i = 1, 2, .. until `secs`
/// are up: how many pairs said `true`.
async fn run_tasks<F, Fut>(tasks: usize, secs: f64, pair: F) -> Result<u64, BoxError>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (stop, count, pair) = (stop.clone(), count.clone(), pair.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if pair(t, i).await {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await?;
    }
    Ok(count.load(Ordering::Relaxed))
}

/// How many of the 64-task scenario's keys are still on the nodes (all
/// nodes together) 2 s after its last round, by contender (library, raw,
/// rslock): every pair was released, and whatever a release left to the
/// background has ended by then, so each one is a key left to expire with
/// its TTL (10 s).
async fn keys_left(setup: &Setup, rounds: usize) -> Result<[u64; 3], BoxError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut left = [0u64; 3];
    for pool in &setup.pools {
        let mut conn = pool.get().await?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("bench:conc:*")
            .query_async(&mut conn)
            .await?;
        for key in keys {
            // bench:conc:{round}:{pass}:{task}:{pair}
            let mut parts = key.split(':').skip(2).map(str::parse::<usize>);
            if let (Some(Ok(round)), Some(Ok(pass))) = (parts.next(), parts.next())
                && round < rounds
            {
                left[(pass + round) % 3] += 1;
            }
        }
    }
    Ok(left)
}

/// 2. 64 tasks on distinct keys for a fixed time.
///
/// The library, raw and rslock run in turn, in an order that rotates from
/// round to round.
async fn concurrent(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Arc::new(Raw::new(&setup.pools).await?);
    let rsl = Arc::new(peer(setup));
    // Short blocks, many rounds: the machine's pace drifts by tens of percent
    // over minutes, and a contender's blocks should share its drift.
    let secs = env_or("BENCH_BLOCK_SECS", if setup.quick { 1.0 } else { 1.5 });
    let rounds = env_or("BENCH_ROUNDS", if setup.quick { 1.0 } else { 8.0 }) as usize;
    // Each round's library and rslock pairs/s over raw's.
    let mut per_round: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // Per contender (library, raw, rslock): pairs, seconds, client CPU, cost.
    let mut total = [0u64; 3];
    let mut time = [0.0f64; 3];
    let mut cpu = [Duration::ZERO; 3];
    let mut costs = [cost::Cost::default(); 3];
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for round in 0..rounds {
        let mut rate = [0.0f64; 3];
        for pass in 0..3 {
            let who = (pass + round) % 3;
            if skipped(&only, who) {
                continue;
            }
            let before = cost::snapshot(&setup.pools).await?;
            let cpu0 = cpu_time();
            let start = Instant::now();
            let contenders = (lib.clone(), raw.clone(), rsl.clone());
            let pairs = run_tasks(64, secs, move |t, i| {
                let (lib, raw, rsl) = contenders.clone();
                let key = format!("bench:conc:{round}:{pass}:{t}:{i}");
                async move {
                    match who {
                        0 => match lib.try_lock(&key, TTL).await {
                            Ok(l) => lib.unlock(l).await.is_ok(),
                            Err(_) => false,
                        },
                        1 => {
                            let tok = Raw::token();
                            let ok = raw.lock(&key, &tok).await;
                            if ok {
                                raw.unlock(&key, &tok).await;
                            }
                            ok
                        }
                        _ => match rsl.lock(key.as_str(), TTL).await {
                            Ok(l) => {
                                rsl.unlock(&l).await;
                                true
                            }
                            Err(_) => false,
                        },
                    }
                }
            })
            .await?;
            time[who] += start.elapsed().as_secs_f64();
            cpu[who] += cpu_time() - cpu0;
            let after = cost::snapshot(&setup.pools).await?;
            costs[who].add(before, after);
            total[who] += pairs;
            rate[who] = pairs as f64 / start.elapsed().as_secs_f64().max(1e-9);
        }
        if rate[1] > 0.0 {
            if std::env::var_os("BENCH_VERBOSE").is_some() {
                eprintln!(
                    "round {round}: library {:.0}, raw {:.0}, rslock {:.0} pairs/s",
                    rate[0], rate[1], rate[2]
                );
            }
            per_round[0].push(rate[0] / rate[1]);
            per_round[1].push(rate[2] / rate[1]);
        }
    }
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        // Exact pair counts, for instruction counts per pair (callgrind).
        eprintln!(
            "pairs: library {}, raw {}, rslock {}",
            total[0], total[1], total[2]
        );
    }
    header3("2. 64 tasks, distinct keys");
    let per_s = |w: usize| total[w] as f64 / time[w].max(1e-9);
    row3(
        "lock+unlock pairs/s",
        per_s(0),
        per_s(1),
        per_s(2),
        "pairs/s",
    );
    let spread =
        |v: &[f64], pick: fn(f64, f64) -> f64| v.iter().copied().reduce(pick).unwrap_or(f64::NAN);
    println!(
        "| {:<38} | {:>12.3} | {:>12.3} | {:<8} | {:>6} | {:>12.3} | {:>6} |",
        "  each round's pairs/s ×raw, min",
        spread(&per_round[0], f64::min),
        1.0,
        "ratio",
        "",
        spread(&per_round[1], f64::min),
        ""
    );
    println!(
        "| {:<38} | {:>12.3} | {:>12.3} | {:<8} | {:>6} | {:>12.3} | {:>6} |",
        "  each round's pairs/s ×raw, max",
        spread(&per_round[0], f64::max),
        1.0,
        "ratio",
        "",
        spread(&per_round[1], f64::max),
        ""
    );
    let per_pair = |w: usize, x: f64| x / total[w].max(1) as f64;
    row3(
        "client CPU per pair",
        per_pair(0, us(cpu[0])),
        per_pair(1, us(cpu[1])),
        per_pair(2, us(cpu[2])),
        "µs",
    );
    // Each contender's costs per pair, in the table's order: what is counted
    // for all nodes together is divided by the node count when `per_node`.
    let n = setup.pools.len().max(1) as f64;
    type Row = (&'static str, fn(&cost::Cost) -> f64, bool, &'static str);
    let rows: [Row; 8] = [
        (
            "allocations per pair (client)",
            |c| c.allocations as f64,
            false,
            "allocs",
        ),
        (
            "server CPU per pair (all nodes)",
            |c| us(c.server_cpu),
            false,
            "µs",
        ),
        (
            "  of it in commands (commandstats usec)",
            |c| us(c.command_time),
            false,
            "µs",
        ),
        (
            "commands per node per pair",
            |c| c.commands as f64,
            true,
            "cmds",
        ),
        (
            "node socket reads per node per pair",
            |c| c.server_reads as f64,
            true,
            "reads",
        ),
        (
            "node socket writes per node per pair",
            |c| c.server_writes as f64,
            true,
            "writes",
        ),
        (
            "client read+write syscalls per pair",
            |c| c.client_syscalls as f64,
            false,
            "calls",
        ),
        (
            "client context switches per pair",
            |c| c.client_switches as f64,
            false,
            "switches",
        ),
    ];
    for (name, value, per_node, unit) in rows {
        let at = |w: usize| per_pair(w, value(&costs[w])) / if per_node { n } else { 1.0 };
        row3(name, at(0), at(1), at(2), unit);
    }
    let left = keys_left(setup, rounds).await?;
    row3(
        "keys left on the nodes after 2 s",
        left[0] as f64,
        left[1] as f64,
        left[2] as f64,
        "keys",
    );
    Ok(())
}

/// Scenario 3, 16 tasks on one key, in turn: the library waiting
/// (`lock_with`), the library trying in a loop (`try_lock`, then the raw
/// loop's sleep), the raw loop, and rslock (one attempt, then the same sleep).
/// Four rounds of 1 s blocks, one per contender, in an order that rotates
/// (`BENCH_CONTENDED_ROUNDS`, `BENCH_CONTENDED_BLOCK_SECS`).
async fn contended(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Arc::new(Raw::new(&setup.pools).await?);
    let rsl = Arc::new(peer(setup));
    // Short blocks whose order rotates from round to round, as in scenario
    // 2: the machine's pace drifts, and a contender's blocks should share its
    // drift instead of one contender taking the fast minute.
    let rounds = env_or(
        "BENCH_CONTENDED_ROUNDS",
        if setup.quick { 1.0 } else { 4.0 },
    ) as usize;
    let secs = env_or("BENCH_CONTENDED_BLOCK_SECS", 1.0);
    let delay = Duration::from_millis(5);
    let jitter = Duration::from_millis(10);
    // 0: library wait, 1: raw, 2: rslock, 3: library try_lock loop; each
    // one's acquisitions, seconds, handoffs and costs over its blocks.
    let order = [0u8, 3, 1, 2];
    let mut acquired = [0u64; 4];
    let mut time = [0.0f64; 4];
    let mut handed: [Vec<Duration>; 4] = Default::default();
    let mut costs = [cost::Cost::default(); 4];
    for (round, pass) in (0..rounds).flat_map(|r| (0..4).map(move |p| (r, p))) {
        let slot = (pass + round) % 4;
        let who = order[slot];
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        // Instant (as ns since `t0`) of the last release; the next acquire measures from it.
        let t0 = Instant::now();
        let last_release = Arc::new(AtomicU64::new(0));
        let handoffs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let key: &'static str = match who {
            0 => "bench:contended:lib",
            3 => "bench:contended:try",
            1 => "bench:contended:raw",
            _ => "bench:contended:rslock",
        };
        let before = cost::snapshot(&setup.pools).await?;
        let start = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (stop, count, lib, raw, rsl) = (
                    stop.clone(),
                    count.clone(),
                    lib.clone(),
                    raw.clone(),
                    rsl.clone(),
                );
                let (last_release, handoffs) = (last_release.clone(), handoffs.clone());
                tokio::spawn(async move {
                    let policy = RetryPolicy::deadline(Duration::from_secs(30))
                        .with_delay(delay)
                        .with_jitter(jitter);
                    let pause = || async {
                        let extra = rand_below(jitter.as_micros() as u64);
                        tokio::time::sleep(delay + Duration::from_micros(extra)).await;
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let tok = Raw::token();
                        let mut lib_lock = None;
                        let mut peer_lock = None;
                        let mut ok = false;
                        match who {
                            0 => {
                                lib_lock = lib.lock_with(key, TTL, &policy).await.ok();
                                ok = lib_lock.is_some();
                            }
                            3 => {
                                while !stop.load(Ordering::Relaxed) {
                                    if let Ok(l) = lib.try_lock(key, TTL).await {
                                        lib_lock = Some(l);
                                        ok = true;
                                        break;
                                    }
                                    pause().await;
                                }
                            }
                            1 => {
                                while !stop.load(Ordering::Relaxed) {
                                    if raw.lock(key, &tok).await {
                                        ok = true;
                                        break;
                                    }
                                    raw.unlock(key, &tok).await;
                                    pause().await;
                                }
                            }
                            _ => {
                                while !stop.load(Ordering::Relaxed) {
                                    if let Ok(l) = rsl.lock(key, TTL).await {
                                        peer_lock = Some(l);
                                        ok = true;
                                        break;
                                    }
                                    pause().await;
                                }
                            }
                        }
                        if !ok {
                            break;
                        }
                        let acquired_at = t0.elapsed().as_nanos() as u64;
                        let released_at = last_release.load(Ordering::SeqCst);
                        if released_at > 0
                            && let Ok(mut h) = handoffs.lock()
                        {
                            h.push(Duration::from_nanos(
                                acquired_at.saturating_sub(released_at),
                            ));
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                        last_release.store(t0.elapsed().as_nanos() as u64, Ordering::SeqCst);
                        if let Some(l) = lib_lock {
                            let _ = lib.unlock(l).await;
                        } else if let Some(l) = peer_lock {
                            rsl.unlock(&l).await;
                        } else {
                            raw.unlock(key, &tok).await;
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        acquired[slot] += count.load(Ordering::Relaxed);
        time[slot] += start.elapsed().as_secs_f64();
        costs[slot].add(before, cost::snapshot(&setup.pools).await?);
        handed[slot].extend(handoffs.lock().map(|v| v.clone()).unwrap_or_default());
    }
    let results: Vec<(f64, Stats, cost::Cost, u64)> = (0..4)
        .map(|i| {
            let rate = acquired[i] as f64 / time[i].max(1e-9);
            let h = Stats::new(std::mem::take(&mut handed[i]));
            (rate, h, costs[i], acquired[i].max(1))
        })
        .collect();
    // Printed in the columns' order: library (try_lock loop), raw, rslock;
    // the waiting library on rows of its own.
    let (wait, try_, raw_, peer_) = (&results[0], &results[1], &results[2], &results[3]);
    header3("3. 16 tasks, one key, try_lock + sleep 5 ms + 0..10 ms jitter (library: try_lock)");
    row3("acquisitions/s", try_.0, raw_.0, peer_.0, "acq/s");
    row3(
        "handoff p50 (release→next acquire)",
        us(try_.1.pct(0.5)),
        us(raw_.1.pct(0.5)),
        us(peer_.1.pct(0.5)),
        "µs",
    );
    row3(
        "handoff p99",
        us(try_.1.pct(0.99)),
        us(raw_.1.pct(0.99)),
        us(peer_.1.pct(0.99)),
        "µs",
    );
    let per_acq = |r: &(f64, Stats, cost::Cost, u64), x: f64| x / r.3 as f64;
    row3(
        "server CPU per acquisition",
        per_acq(try_, us(try_.2.server_cpu)),
        per_acq(raw_, us(raw_.2.server_cpu)),
        per_acq(peer_, us(peer_.2.server_cpu)),
        "µs",
    );
    row3(
        "commands per node per acquisition",
        per_acq(try_, try_.2.commands as f64) / setup.pools.len().max(1) as f64,
        per_acq(raw_, raw_.2.commands as f64) / setup.pools.len().max(1) as f64,
        per_acq(peer_, peer_.2.commands as f64) / setup.pools.len().max(1) as f64,
        "cmds",
    );
    row3(
        "library lock_with (wait): acquisitions/s",
        wait.0,
        raw_.0,
        peer_.0,
        "acq/s",
    );
    row3(
        "library lock_with (wait): handoff p50",
        us(wait.1.pct(0.5)),
        us(raw_.1.pct(0.5)),
        us(peer_.1.pct(0.5)),
        "µs",
    );
    Ok(())
}

fn rand_below(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let mut b = [0u8; 8];
    let _ = getrandom_fill(&mut b);
    u64::from_le_bytes(b) % n
}

/// Scenario 4, one node of five paused: lock+unlock pairs, against healthy
/// pairs in the same run.
async fn paused(setup: &Setup) -> Result<(), BoxError> {
    let Some(cluster) = &setup._cluster else {
        println!("\n(paused: skipped, needs local nodes rather than REDLOCK_NODES)");
        return Ok(());
    };
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let rsl = peer(setup);
    // rslock sets no timeout on a node's call; bounded here so that a pair
    // stuck on the paused node ends (and is counted as failed). One pair per
    // block, since each may take the whole bound.
    let peer_bound = Duration::from_secs(1);
    let mut peer_failed = 0;
    // Alternating blocks of healthy and paused pairs, so the machine's load
    // drifts alike for both; the resumed node gets a moment to answer what was
    // queued while it was stopped.
    let (blocks, per_block) = if setup.quick { (2, 50) } else { (10, 100) };
    let (mut healthy, mut l, mut r, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut failed = 0;
    for b in 0..blocks {
        for i in 0..per_block {
            let key = format!("bench:healthy:{b}:{i}");
            let start = Instant::now();
            let lock = lib.try_lock(&key, TTL).await?;
            lib.unlock(lock).await?;
            healthy.push(start.elapsed());
        }
        cluster.node(4).pause();
        for i in 0..per_block {
            let key = format!("bench:paused:{b}:{i}");
            let start = Instant::now();
            let ok = match lib.try_lock(&key, TTL).await {
                Ok(lock) => lib.unlock(lock).await.is_ok(),
                Err(_) => false,
            };
            l.push(start.elapsed());
            failed += usize::from(!ok);
            if i % 10 == 0 {
                let tok = Raw::token();
                let rkey = format!("bench:rpaused:{b}:{i}");
                let start = Instant::now();
                raw.lock(&rkey, &tok).await;
                raw.unlock(&rkey, &tok).await;
                r.push(start.elapsed());
            }
            // rslock once per block: a pair waits for the paused node.
            if i == 0 {
                let pkey = format!("bench:ppaused:{b}:{i}");
                let start = Instant::now();
                let pair = async {
                    match rsl.lock(pkey.as_str(), TTL).await {
                        Ok(l) => {
                            rsl.unlock(&l).await;
                            true
                        }
                        Err(_) => false,
                    }
                };
                let ok = matches!(tokio::time::timeout(peer_bound, pair).await, Ok(true));
                p.push(start.elapsed());
                peer_failed += usize::from(!ok);
            }
        }
        cluster.node(4).resume();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let (h, l, r, p) = (
        Stats::new(healthy),
        Stats::new(l),
        Stats::new(r),
        Stats::new(p),
    );
    header3(&format!(
        "4. one node of five SIGSTOPped: lock+unlock pairs, node_timeout {:?}",
        *NODE_TIMEOUT
    ));
    row3(
        "pair p50",
        us(l.pct(0.5)),
        us(r.pct(0.5)),
        us(p.pct(0.5)),
        "µs",
    );
    row3(
        "pair p99",
        us(l.pct(0.99)),
        us(r.pct(0.99)),
        us(p.pct(0.99)),
        "µs",
    );
    row3("pair max", us(l.max()), us(r.max()), us(p.max()), "µs");
    println!(
        "library, paused vs healthy (same run): p50 {:.1} vs {:.1} µs = {:.3}x (target <= 1.2x); p99 {:.1} vs {:.1} µs; failed pairs {failed}",
        us(l.pct(0.5)),
        us(h.pct(0.5)),
        us(l.pct(0.5)) / us(h.pct(0.5)),
        us(l.pct(0.99)),
        us(h.pct(0.99)),
    );
    println!(
        "rslock: {} pairs, {peer_failed} failed or past {peer_bound:?}",
        p.sorted.len()
    );
    println!(
        "(raw waits for every node's answer or timeout; rslock for every node's answer; the library decides acquire and release at quorum)"
    );
    Ok(())
}

/// 5. Middleware overhead over loopback HTTP.
async fn middleware(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let bare = Router::new().route("/{*path}", get(|| async { "ok" }));
    let locked = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(RedlockLayer::new(lib.clone(), redlock_tower::ByPath));
    let serve = |app: Router| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok::<_, BoxError>(addr)
    };
    let bare_addr = serve(bare).await?;
    let locked_addr = serve(locked).await?;
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    let n = if setup.quick { 300 } else { 3000 };
    let get_once = |addr: std::net::SocketAddr, path: String| {
        let client = client.clone();
        async move {
            let uri: http::Uri = format!("http://{addr}{path}").parse()?;
            let resp = client.get(uri).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            if !status.is_success() {
                return Err::<(), BoxError>(format!("status {status}").into());
            }
            Ok(())
        }
    };
    for i in 0..200 {
        get_once(bare_addr, format!("/warm/{i}")).await?;
        get_once(locked_addr, format!("/warm/{i}")).await?;
    }
    let (mut b, mut l, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let start = Instant::now();
        get_once(bare_addr, format!("/k/{i}")).await?;
        b.push(start.elapsed());
        let start = Instant::now();
        get_once(locked_addr, format!("/k/{i}")).await?;
        l.push(start.elapsed());
        let tok = Raw::token();
        let key = format!("bench:mw:{i}");
        let start = Instant::now();
        raw.lock(&key, &tok).await;
        raw.unlock(&key, &tok).await;
        r.push(start.elapsed());
    }
    let (b, l, r) = (Stats::new(b), Stats::new(l), Stats::new(r));
    header(&format!(
        "5. middleware over loopback HTTP ({n} requests each)"
    ));
    row("bare request p50", us(b.pct(0.5)), us(b.pct(0.5)), "µs");
    row(
        "with RedlockLayer p50",
        us(l.pct(0.5)),
        us(b.pct(0.5)),
        "µs",
    );
    row(
        "with RedlockLayer p99",
        us(l.pct(0.99)),
        us(b.pct(0.99)),
        "µs",
    );
    let added50 = us(l.pct(0.5)) - us(b.pct(0.5));
    let added99 = us(l.pct(0.99)) - us(b.pct(0.99));
    row(
        "added p50 vs raw acquire+release",
        added50,
        us(r.pct(0.5)),
        "µs",
    );
    row(
        "added p99 vs raw acquire+release",
        added99,
        us(r.pct(0.99)),
        "µs",
    );
    Ok(())
}

fn cpu_time() -> Duration {
    // utime + stime of this process, from /proc (clock ticks of 10 ms on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// 6. Many auto-extended locks held at once.
async fn held(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let (count, hold, ttl) = if setup.quick {
        (1_000, Duration::from_secs(3), Duration::from_secs(2))
    } else {
        (10_000, Duration::from_secs(30), Duration::from_secs(10))
    };
    let rss_before = rss_kib("VmRSS:");
    let opts = LockOptions::new(ttl);
    let mut guards = Vec::with_capacity(count);
    let start = Instant::now();
    for chunk in 0..(count / 100) {
        let futs = (0..100).map(|i| {
            let (lib, opts) = (lib.clone(), opts.clone());
            let key = format!("bench:held:{}", chunk * 100 + i);
            async move { lib.lock_guard(&key, &opts).await }
        });
        for g in join_all(futs).await {
            guards.push(g?);
        }
    }
    let acquire_time = start.elapsed();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(hold).await;
    let cpu = cpu_time() - cpu0;
    let wall = t0.elapsed();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let extensions: u64 = guards
        .iter()
        .map(|g| u64::from(g.handle().extensions()))
        .sum();
    let rss_peak = rss_kib("VmHWM:");
    let rss_now = rss_kib("VmRSS:");
    // Released 100 at a time, as they were taken: 10,000 releases at once are
    // 50,000 node calls in one burst, which keeps two cores busy past the 50 ms
    // node timeout (those keys then expire by TTL).
    let start = Instant::now();
    let mut failed = 0;
    let mut guards = guards.into_iter();
    loop {
        let chunk: Vec<_> = guards.by_ref().take(100).collect();
        if chunk.is_empty() {
            break;
        }
        let releases = join_all(chunk.into_iter().map(|g| g.release())).await;
        failed += releases.iter().filter(|r| r.is_err()).count();
    }
    let release_time = start.elapsed();
    println!("\n### 6. {count} auto-extended locks held for {hold:?} (ttl {ttl:?})\n");
    println!("| metric | value |");
    println!("|---|---|");
    println!("| acquire all | {:.2} s |", acquire_time.as_secs_f64());
    println!(
        "| process CPU while held | {:.2} s over {:.1} s = {:.1}% of one core |",
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    println!("| extensions done | {extensions} |");
    println!("| locks lost | {lost} |");
    println!(
        "| RSS before / while held / peak | {:.1} / {:.1} / {:.1} MiB |",
        rss_before as f64 / 1024.0,
        rss_now as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "| release all, 100 at a time | {:.2} s, {failed} failed |",
        release_time.as_secs_f64()
    );
    Ok(())
}

/// 7. Fenced (one more round trip) against unfenced lock+unlock, alternating blocks.
async fn fenced(setup: &Setup) -> Result<(), BoxError> {
    let plain = redlock(setup)?;
    let fenced = setup
        .pools
        .iter()
        .cloned()
        .fold(Redlock::builder(), |b, p| b.pool(p))
        .node_timeout(*NODE_TIMEOUT)
        .fencing(redlock_core::FencingMode::Hybrid)
        .build()?;
    let (blocks, per_block) = if setup.quick { (4, 250) } else { (10, 600) };
    for i in 0..300 {
        for (rl, name) in [(&plain, "plain"), (&fenced, "fenced")] {
            let l = rl.try_lock(&format!("bench:fwarm:{name}:{i}"), TTL).await?;
            rl.unlock(l).await?;
        }
    }
    let (mut fenced_lat, mut plain_lat) = (Vec::new(), Vec::new());
    let mut n = 0u64;
    for b in 0..blocks {
        for pass in 0..2 {
            let run_fenced = (pass == 0) == (b % 2 == 0);
            let (rl, lat) = if run_fenced {
                (&fenced, &mut fenced_lat)
            } else {
                (&plain, &mut plain_lat)
            };
            for _ in 0..per_block {
                n += 1;
                let key = format!("bench:fenced:{n}");
                let start = Instant::now();
                let l = rl.try_lock(&key, TTL).await?;
                if run_fenced && l.fencing_token().is_none() {
                    return Err("a fenced lock came without a token".into());
                }
                rl.unlock(l).await?;
                lat.push(start.elapsed());
            }
        }
    }
    let (f, p) = (Stats::new(fenced_lat), Stats::new(plain_lat));
    println!(
        "\n### 7. fenced vs unfenced lock+unlock, distinct keys ({} pairs each)\n",
        f.sorted.len()
    );
    println!(
        "| {:<38} | {:>12} | {:>12} | {:<8} | {:>6} |",
        "metric", "fenced", "unfenced", "unit", "ratio"
    );
    println!(
        "|{:-<40}|{:->14}|{:->14}|{:-<10}|{:->8}|",
        "", "", "", "", ""
    );
    row("p50", us(f.pct(0.5)), us(p.pct(0.5)), "µs");
    row("p99", us(f.pct(0.99)), us(p.pct(0.99)), "µs");
    row("max", us(f.max()), us(p.max()), "µs");
    Ok(())
}

async fn setup(quick: bool) -> Result<Setup, BoxError> {
    let (cluster, urls) = match std::env::var("REDLOCK_NODES") {
        Ok(v) if !v.trim().is_empty() => {
            (None, v.split(',').map(|s| s.trim().to_owned()).collect())
        }
        _ => {
            let c = Cluster::start(5);
            let urls = c.urls();
            (Some(c), urls)
        }
    };
    let mut pools = Vec::new();
    for u in &urls {
        pools.push(
            deadpool_redis::Config::from_url(u.clone())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))?,
        );
    }
    Ok(Setup {
        _cluster: cluster,
        urls,
        pools,
        quick,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("waiting-child") {
        return waiting::child(&args[1..]).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let scenario = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "all".into());
    let setup = setup(quick).await?;
    let version: String = {
        let mut c = deadpool_redis::Connection::take(setup.pools[0].get().await?);
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned()
    };
    println!(
        "# redlock bench: {} nodes (redis {version}), {} cores, node_timeout {:?}, ttl {TTL:?}{}",
        setup.urls.len(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        *NODE_TIMEOUT,
        if quick { ", --quick" } else { "" }
    );
    let all = scenario == "all";
    if all || scenario == "sequential" {
        sequential(&setup).await?;
    }
    if all || scenario == "concurrent" {
        concurrent(&setup).await?;
    }
    if all || scenario == "contended" {
        contended(&setup).await?;
    }
    if all || scenario == "paused" {
        paused(&setup).await?;
    }
    if all || scenario == "middleware" {
        middleware(&setup).await?;
    }
    if all || scenario == "fenced" {
        fenced(&setup).await?;
    }
    if all || scenario == "held" {
        held(&setup).await?;
    }
    if all || scenario == "waiting" {
        waiting::waiting(&setup).await?;
    }
    if all || scenario == "idempotency" {
        idempotency::idempotency(&setup).await?;
    }
    if all || scenario == "metrics" {
        metrics_cost::metrics_cost(&setup).await?;
    }
    if all || scenario == "scale" {
        scale::scale(&setup).await?;
    }
    if scenario == "native" {
        native::native(&setup).await?;
    }
    if scenario == "publish" {
        publish::publish(&setup).await?;
    }
    if scenario == "side-by-side" {
        side_by_side::side_by_side(&setup).await?;
    }
    Ok(())
}
