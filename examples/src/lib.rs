//! Shared pieces of the runnable examples and the demo in `src/bin/`:
//!
//! - [`Nodes`]: the Redis nodes to lock on, from `REDLOCK_NODES` or three local
//!   `redis-server` processes started for the run;
//! - [`Args`]: the few command-line flags the programs take;
//! - [`serve`]: an axum app on `127.0.0.1:PORT`;
//! - [`HttpClient`], [`send`] and [`Reply`]: a small HTTP/1 client for the
//!   self-tests and the demo's burst;
//! - [`Gauge`]: how many requests are inside a section at once, and the most seen;
//! - [`percentile`] and [`Checks`]: the numbers and the verdict of a run.

#![deny(missing_docs)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use redlock_core::Redlock;
use redlock_tests::Cluster;

/// The error type of the example programs.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The Redis nodes a program locks on.
///
/// With `REDLOCK_NODES` set (comma-separated `redis://` URLs, one per independent
/// master) those are used; otherwise three local `redis-server` processes are
/// started on free loopback ports and stopped when this value is dropped.
#[derive(Debug)]
pub struct Nodes {
    urls: Vec<String>,
    cluster: Option<Cluster>,
}

impl Nodes {
    /// The nodes of `REDLOCK_NODES`, or three local nodes.
    ///
    /// # Panics
    /// When `REDLOCK_NODES` is unset and `redis-server` is not installed (the
    /// message says how to install it).
    pub fn from_env_or_local() -> Self {
        match std::env::var("REDLOCK_NODES") {
            Ok(v) if !v.trim().is_empty() => Self {
                urls: v
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
                cluster: None,
            },
            _ => {
                let cluster = Cluster::start(3);
                Self {
                    urls: cluster.urls(),
                    cluster: Some(cluster),
                }
            }
        }
    }

    /// The node URLs, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Whether the nodes were started by this program.
    pub fn is_local(&self) -> bool {
        self.cluster.is_some()
    }

    /// One line saying which nodes are used (passwords redacted).
    pub fn describe(&self) -> String {
        let urls: Vec<String> = self
            .urls
            .iter()
            .map(|u| redlock_core::redact_url(u))
            .collect();
        if self.is_local() {
            format!(
                "{} local redis-server nodes started for this run: {}",
                urls.len(),
                urls.join(", ")
            )
        } else {
            format!(
                "{} nodes from REDLOCK_NODES: {}",
                urls.len(),
                urls.join(", ")
            )
        }
    }

    /// A `Redlock` handle over the nodes, with a per-node timeout of `node_timeout`.
    ///
    /// # Errors
    /// An invalid URL or an empty list.
    pub fn redlock(&self, node_timeout: Duration) -> Result<Redlock, redlock_core::Error> {
        Redlock::builder()
            .urls(self.urls.iter().cloned())
            .node_timeout(node_timeout)
            .build()
    }

    /// A deadpool-redis pool to the first node, for programs that also keep
    /// application data in Redis.
    ///
    /// # Errors
    /// An invalid URL.
    pub fn first_node_pool(&self) -> Result<deadpool_redis::Pool, BoxError> {
        let url = self.urls.first().ok_or("no Redis nodes")?;
        Ok(deadpool_redis::Config::from_url(url.clone())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))?)
    }
}

/// The command-line arguments after the program name.
#[derive(Debug, Clone)]
pub struct Args(Vec<String>);

impl Args {
    /// The arguments of this process.
    pub fn from_env() -> Self {
        Self(std::env::args().skip(1).collect())
    }

    /// Whether `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }

    /// The value after `--name` (or of `--name=value`), parsed.
    ///
    /// # Errors
    /// A value that does not parse, or a flag without a value.
    pub fn value<T: FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        let mut raw = None;
        for (i, a) in self.0.iter().enumerate() {
            if a == name {
                raw = Some(
                    self.0
                        .get(i + 1)
                        .ok_or_else(|| format!("{name} needs a value"))?
                        .clone(),
                );
            } else if let Some(v) = a.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                raw = Some(v.to_owned());
            }
        }
        raw.map(|v| v.parse().map_err(|_| format!("{name}: cannot parse {v:?}")))
            .transpose()
    }

    /// The port to serve on: `--port N`, else `$PORT`, else 3000; with
    /// `--self-test`, an ephemeral port unless `--port` is given (so a self-test
    /// never collides with a running server).
    ///
    /// # Errors
    /// A port that does not parse.
    pub fn port(&self) -> Result<u16, String> {
        if let Some(p) = self.value("--port")? {
            return Ok(p);
        }
        if self.flag("--self-test") {
            return Ok(0);
        }
        match std::env::var("PORT") {
            Ok(p) => p.parse().map_err(|_| format!("PORT: cannot parse {p:?}")),
            Err(_) => Ok(3000),
        }
    }
}

/// Logs to stderr at `RUST_LOG`, or `warn` when it is unset.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Serves `app` on `127.0.0.1:port` (0: any free port) in a background task and
/// returns the bound address.
///
/// # Errors
/// The port is taken.
pub async fn serve(app: Router, port: u16) -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("server error: {e}");
        }
    });
    Ok(addr)
}

/// A pooled HTTP/1 client.
pub type HttpClient = Client<HttpConnector, Body>;

/// A new [`HttpClient`].
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Every request of [`send`] is bounded by this.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A whole response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body, as text.
    pub body: String,
}

impl Reply {
    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends one request and reads the whole response, within [`CLIENT_TIMEOUT`].
///
/// # Errors
/// A transport error or the timeout.
pub async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Reply, BoxError> {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Body::from(body.into()))?;
    let exchange = async {
        let resp = client.request(req).await?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok::<_, BoxError>(Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    tokio::time::timeout(CLIENT_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{url}: no answer within {CLIENT_TIMEOUT:?}"))?
}

/// Like [`send`], but retries a `409 Conflict` up to `retries` times, `pause`
/// apart, as a client that expects the key to be free does. Returns the last
/// reply and how many retries it took.
///
/// A request sent right after the previous one on the same key completed can
/// still find that lock for a moment: the layer starts the release when the
/// response body ends, and the release reaches Redis a little after the client
/// has the response.
///
/// # Errors
/// A transport error or the timeout.
pub async fn send_retrying_busy(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    retries: u32,
    pause: Duration,
) -> Result<(Reply, u32), BoxError> {
    let body = body.into();
    let mut attempt = 0;
    loop {
        let reply = send(client, method.clone(), url, headers, body.clone()).await?;
        if reply.status != StatusCode::CONFLICT || attempt >= retries {
            return Ok((reply, attempt));
        }
        attempt += 1;
        tokio::time::sleep(pause).await;
    }
}

/// The `p`-th percentile (0.0..=100.0, nearest rank) of sorted `values`; zero
/// for none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Counts how many callers are inside a section at once, and the most seen.
#[derive(Debug, Default)]
pub struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    /// Enters the section until the returned guard is dropped.
    pub fn enter(&self) -> GaugeGuard<'_> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        GaugeGuard(self)
    }

    /// The most callers seen inside at once.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// A caller inside a [`Gauge`]'s section.
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a Gauge);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The verdict of a self-test: each check prints one line, and [`Checks::finish`]
/// gives the exit code (0 when all passed, 1 otherwise). `main` returns that code,
/// so that destructors still run (they stop the local Redis nodes; a
/// `std::process::exit` would leave them running).
#[derive(Debug, Default)]
pub struct Checks {
    failed: usize,
    total: usize,
}

impl Checks {
    /// Records and prints one check.
    pub fn check(&mut self, ok: bool, what: impl std::fmt::Display) {
        self.total += 1;
        if !ok {
            self.failed += 1;
        }
        println!("  [{}] {what}", if ok { " ok " } else { "FAIL" });
    }

    /// Whether every check so far passed.
    pub fn all_passed(&self) -> bool {
        self.failed == 0
    }

    /// Prints the summary; the exit code is 0 when every check passed, else 1.
    pub fn finish(self) -> ExitCode {
        if self.all_passed() {
            println!("self-test passed ({} checks)", self.total);
            ExitCode::SUCCESS
        } else {
            println!(
                "self-test FAILED ({} of {} checks)",
                self.failed, self.total
            );
            ExitCode::FAILURE
        }
    }
}

/// A random lowercase hex id (16 characters), for keys that must not collide
/// with earlier runs against the same nodes.
pub fn random_id() -> String {
    format!("{:016x}", getrandom::u64().unwrap_or(0))
}

/// Waits for Ctrl-C (serve mode).
pub async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&v, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&v, 0.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn args_take_both_value_forms() {
        let a = Args(vec!["--requests".into(), "7".into(), "--port=81".into()]);
        assert_eq!(a.value::<usize>("--requests").unwrap(), Some(7));
        assert_eq!(a.value::<u16>("--port").unwrap(), Some(81));
        assert_eq!(a.value::<u16>("--concurrency").unwrap(), None);
        assert!(
            Args(vec!["--requests".into()])
                .value::<usize>("--requests")
                .is_err()
        );
        assert!(
            Args(vec!["--requests".into(), "x".into()])
                .value::<usize>("--requests")
                .is_err()
        );
    }
}
