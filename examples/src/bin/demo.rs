//! The demo: a burst of concurrent requests against an axum app behind
//! `RedlockLayer::by_path()`, and a report that shows the lock kept every key's
//! critical section exclusive.
//!
//! ```sh
//! cargo run --release -p redlock-examples --bin demo
//! cargo run --release -p redlock-examples --bin demo -- --requests 400 --concurrency 32
//! cargo run --release -p redlock-examples --bin demo -- --poll   # waiters poll instead
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run.
//!
//! The app serves `POST /accounts/{a,b,c,d}/settle`. The handler reads the key's
//! counter, sleeps about 10 ms, and writes the counter + 1: a read-modify-write
//! that loses updates as soon as two requests of one key overlap. It also counts
//! how many requests are inside each key's section at once. Keys `a` and `b` are
//! served in fail-fast mode (a busy key answers 409 at once), keys `c` and `d` in
//! wait mode (a busy key waits up to 10 s for its turn). Waiting requests are
//! woken by the release before theirs (`--poll`: they poll every 25 ms + up to
//! 50 ms instead, as before wake-ups existed, for comparison).
//!
//! The program exits with 1 if two requests of one key were ever inside at once,
//! if a key's counter differs from its number of 200 answers (a lost update), or
//! if no request got through at all; else 0.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::Uri;
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_util::StreamExt;
use http::{Method, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redlock_examples::{Args, BoxError, Gauge, Nodes, http_client, percentile, send, serve};
use redlock_tower::RedlockLayer;

const KEYS: [&str; 4] = ["a", "b", "c", "d"];
const WAIT: Duration = Duration::from_secs(10);
const NODE_TIMEOUT: Duration = Duration::from_millis(100);

fn is_wait_mode(key: usize) -> bool {
    key >= 2
}

/// One key's critical section: a counter updated non-atomically, and a gauge of
/// the requests inside.
#[derive(Default)]
struct Account {
    balance: AtomicU64,
    inside: Gauge,
}

#[derive(Default)]
struct Accounts([Account; 4]);

async fn settle(State(accounts): State<Arc<Accounts>>, uri: Uri) -> StatusCode {
    let Some(i) = KEYS
        .iter()
        .position(|k| uri.path() == format!("/accounts/{k}/settle"))
    else {
        return StatusCode::NOT_FOUND;
    };
    let account = &accounts.0[i];
    let _inside = account.inside.enter();
    let seen = account.balance.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(8 + seen % 5)).await;
    account.balance.store(seen + 1, Ordering::SeqCst);
    StatusCode::OK
}

fn app(
    accounts: Arc<Accounts>,
    redlock: redlock_core::Redlock,
    metrics: PrometheusHandle,
) -> Router {
    let route = |router: Router<Arc<Accounts>>, key: usize| {
        router.route(&format!("/accounts/{}/settle", KEYS[key]), post(settle))
    };
    let fail_fast = (0..4)
        .filter(|k| !is_wait_mode(*k))
        .fold(Router::new(), route)
        .route_layer(RedlockLayer::by_path());
    let waiting = (0..4)
        .filter(|k| is_wait_mode(*k))
        .fold(Router::new(), route)
        // Waiters are woken by releases; this delay is only their safety-net
        // poll (and, with `--poll`, the polling interval: the handlers take
        // ~10 ms, so polling sooner than the default 100 ms + up to 100 ms).
        .route_layer(
            RedlockLayer::by_path()
                .wait(WAIT)
                .retry_delay(Duration::from_millis(25), Duration::from_millis(50)),
        );
    Router::new()
        .merge(fail_fast)
        .merge(waiting)
        .with_state(accounts)
        .layer(Extension(redlock))
        // The lock metrics, as Prometheus scrapes them.
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
}

/// What one request of the burst got.
struct Outcome {
    key: usize,
    status: Option<StatusCode>,
    latency: Duration,
}

#[derive(Default)]
struct Tally {
    requests: usize,
    ok: usize,
    busy: usize,
    unavailable: usize,
    other: usize,
    latencies: Vec<Duration>,
}

impl Tally {
    fn add(&mut self, o: &Outcome) {
        self.requests += 1;
        match o.status {
            Some(StatusCode::OK) => self.ok += 1,
            Some(StatusCode::CONFLICT) => self.busy += 1,
            Some(StatusCode::SERVICE_UNAVAILABLE) => self.unavailable += 1,
            _ => self.other += 1,
        }
        self.latencies.push(o.latency);
    }

    fn sort(&mut self) {
        self.latencies.sort_unstable();
    }

    /// The `p`-th latency percentile in ms (call after [`Tally::sort`]).
    fn p(&self, p: f64) -> String {
        format!("{:.1}", percentile(&self.latencies, p).as_secs_f64() * 1e3)
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let requests: usize = args.value("--requests")?.unwrap_or(400);
    let concurrency: usize = args.value("--concurrency")?.unwrap_or(32).max(1);

    let nodes = Nodes::from_env_or_local();
    let poll = args.flag("--poll");
    let redlock = redlock_core::Redlock::builder()
        .urls(nodes.urls().iter().cloned())
        .node_timeout(NODE_TIMEOUT)
        .wake_on_release(!poll)
        .build()?;
    let accounts = Arc::new(Accounts::default());
    let metrics = PrometheusBuilder::new().install_recorder()?;
    redlock_core::metrics::describe();
    let addr = serve(app(accounts.clone(), redlock, metrics), 0).await?;

    println!("# redlock demo");
    println!("nodes:   {}", nodes.describe());
    println!(
        "app:     http://{addr}, RedlockLayer::by_path(), ttl 5 s, node timeout {NODE_TIMEOUT:?}"
    );
    println!(
        "handler: read counter, sleep ~10 ms, write counter + 1 (loses updates if two requests of a key overlap)"
    );
    println!(
        "modes:   /accounts/a|b/settle fail-fast (busy: 409 at once); \
         /accounts/c|d/settle wait mode (busy: wait up to {WAIT:?}, {})",
        if poll {
            "polling every 25 ms + up to 50 ms"
        } else {
            "woken by releases"
        }
    );
    println!(
        "burst:   {requests} requests, {concurrency} concurrent, round-robin over the 4 keys\n"
    );

    let client = http_client();
    let started = Instant::now();
    let outcomes: Vec<Outcome> = futures_util::stream::iter(0..requests)
        .map(|i| {
            let client = client.clone();
            let key = i % KEYS.len();
            let url = format!("http://{addr}/accounts/{}/settle", KEYS[key]);
            async move {
                let t = Instant::now();
                let status = send(&client, Method::POST, &url, &[], "")
                    .await
                    .ok()
                    .map(|r| r.status);
                Outcome {
                    key,
                    status,
                    latency: t.elapsed(),
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let elapsed = started.elapsed();

    let mut per_key: Vec<Tally> = (0..KEYS.len()).map(|_| Tally::default()).collect();
    let mut modes = [Tally::default(), Tally::default()];
    let mut total = Tally::default();
    for o in &outcomes {
        per_key[o.key].add(o);
        modes[usize::from(is_wait_mode(o.key))].add(o);
        total.add(o);
    }
    for t in per_key.iter_mut().chain(modes.iter_mut()) {
        t.sort();
    }
    total.sort();

    println!(
        "{:<20} {:<9} {:>8} {:>5} {:>5} {:>5} {:>5} {:>10} {:>8} {:>6} {:>8} {:>8}",
        "key",
        "mode",
        "requests",
        "200",
        "409",
        "503",
        "other",
        "max-inside",
        "counter",
        "lost",
        "p50 ms",
        "p99 ms"
    );
    let mut violations = Vec::new();
    for (i, t) in per_key.iter().enumerate() {
        let account = &accounts.0[i];
        let counter = account.balance.load(Ordering::SeqCst) as usize;
        let max_inside = account.inside.max();
        let lost = t.ok.saturating_sub(counter);
        let path = format!("/accounts/{}/settle", KEYS[i]);
        let mode = if is_wait_mode(i) { "wait" } else { "fail-fast" };
        println!(
            "{path:<20} {mode:<9} {:>8} {:>5} {:>5} {:>5} {:>5} {max_inside:>10} {counter:>8} {lost:>6} {:>8} {:>8}",
            t.requests,
            t.ok,
            t.busy,
            t.unavailable,
            t.other,
            t.p(50.0),
            t.p(99.0),
        );
        if max_inside > 1 {
            violations.push(format!(
                "{path}: {max_inside} requests were inside the critical section at once"
            ));
        }
        if counter != t.ok {
            violations.push(format!(
                "{path}: counter {counter} but {} answers were 200 ({lost} lost updates)",
                t.ok
            ));
        }
    }
    for (name, t) in [("fail-fast", &modes[0]), ("wait", &modes[1])] {
        println!(
            "{:<20} {name:<9} {:>8} {:>5} {:>5} {:>5} {:>5} {:>10} {:>8} {:>6} {:>8} {:>8}",
            "(mode total)",
            t.requests,
            t.ok,
            t.busy,
            t.unavailable,
            t.other,
            "",
            "",
            "",
            t.p(50.0),
            t.p(99.0),
        );
    }
    let max_inside = accounts.0.iter().map(|a| a.inside.max()).max().unwrap_or(0);
    let lost: usize = per_key
        .iter()
        .zip(&accounts.0)
        .map(|(t, a)| {
            t.ok.saturating_sub(a.balance.load(Ordering::SeqCst) as usize)
        })
        .sum();
    println!(
        "\nrequests {}: {} x 200, {} x 409, {} x 503, {} other (transport errors count here) in {:.2} s ({:.0} req/s)",
        total.requests,
        total.ok,
        total.busy,
        total.unavailable,
        total.other,
        elapsed.as_secs_f64(),
        total.requests as f64 / elapsed.as_secs_f64().max(1e-9),
    );
    println!(
        "latency: p50 {} ms, p99 {} ms (all requests, 409s included)",
        total.p(50.0),
        total.p(99.0)
    );
    println!("max concurrency inside any key's critical section: {max_inside} (must be 1)");
    println!("lost updates: {lost} (must be 0)");
    if total.ok == 0 {
        violations.push("no request got through: nothing was exercised".into());
    }
    // What an operator's Prometheus sees after the burst (quantile lines left
    // out for length).
    let scrape = send(
        &client,
        Method::GET,
        &format!("http://{addr}/metrics"),
        &[],
        "",
    )
    .await?;
    println!("\nGET /metrics after the burst (redlock_ series, quantiles omitted):");
    for line in String::from_utf8_lossy(&scrape.body)
        .lines()
        .filter(|l| l.starts_with("redlock_") && !l.contains("quantile="))
    {
        println!("  {line}");
    }
    drop(nodes);
    if violations.is_empty() {
        println!(
            "\nRESULT: PASS, every key's critical section was exclusive and no update was lost"
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nRESULT: FAIL");
        for v in &violations {
            println!("  - {v}");
        }
        Ok(ExitCode::FAILURE)
    }
}
