//! The benchmark: this library against a raw baseline in the same process and run.
//!
//! ```sh
//! cargo run --release -p redlock-examples --bin bench -- all          # full run (~3 min)
//! cargo run --release -p redlock-examples --bin bench -- all --quick  # smoke (~20 s)
//! cargo run --release -p redlock-examples --bin bench -- sequential   # one scenario
//! ```
//!
//! Scenarios: `sequential`, `concurrent`, `contended`, `paused`, `middleware`,
//! `fenced`, `held`, `waiting`, `idempotency`, `metrics`, `scale`, `shared`, `cluster-scale`
//! (its own 3 clusters of 4 shards and 3 single servers), `native` (not in `all`:
//! for nodes with native commands, e.g. `REDIS_SERVER=<valkey-server>`), `acked` (not in `all`:
//! replica acks with and without the coalescer, on its own 3 primaries with a replica each), `side-by-side`
//! (not in `all`: the library's tasks and raw's at the same time). It starts 5 local Redis nodes, or uses `REDLOCK_NODES`.
//!
//! The raw baseline uses the same deadpool pools with no library logic: one
//! multiplexed connection per node taken from the pool (as the library does), a
//! concurrent `SET key token NX PX ttl` to every node, then the compare-and-delete
//! script by `EVALSHA` on every node. Library and raw runs alternate in blocks so
//! that machine noise hits both alike.

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use futures_util::future::join_all;
use redlock_core::{Error, Redlock};
use redlock_tests::Cluster;

mod acked;
mod cluster_scale;
mod cost;
mod idempotency;
mod metrics_cost;
mod native;
mod publish;
mod scale;
mod shared;
mod side_by_side;
mod waiting;

mod concurrent;
mod contended;
mod fenced;
mod held;
mod middleware;
mod paused;
mod sequential;
use concurrent::*;
use contended::*;
use fenced::*;
use held::*;
use middleware::*;
use paused::*;
use sequential::*;

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
        // The experimental coalescer (issue 50), off by default as in the
        // library: `REDLOCK_BENCH_COALESCE=1` turns it on.
        .coalesce(env_or("REDLOCK_BENCH_COALESCE", 0.0) == 1.0)
        .build()
}

/// The latencies tasks record for one contender, shared between them.
#[derive(Default)]
struct Samples(std::sync::Mutex<Vec<Duration>>);

impl Samples {
    /// One sample: the time since `started`.
    fn record(&self, started: std::time::Instant) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(started.elapsed());
    }

    /// The samples so far, taken out.
    fn take(&self) -> Stats {
        Stats::new(std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }
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
    if all || scenario == "shared" {
        shared::shared(&setup).await?;
    }
    if all || scenario == "cluster-scale" {
        cluster_scale::cluster_scale(&setup).await?;
    }
    if scenario == "native" {
        native::native(&setup).await?;
    }
    if scenario == "acked" {
        acked::acked(&setup).await?;
    }
    if scenario == "publish" {
        publish::publish(&setup).await?;
    }
    if scenario == "side-by-side" {
        side_by_side::side_by_side(&setup).await?;
    }
    Ok(())
}
