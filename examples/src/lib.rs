//! Shared pieces of the runnable examples and the demo in `src/bin/`:
//!
//! - [`Nodes`]: the Redis nodes to lock on, from `REDLOCK_NODES` or three local
//!   `redis-server` processes started for the run;
//! - [`Args`]: the few command-line flags the programs take;
//! - [`serve`]: an axum app on `127.0.0.1:PORT`;
//! - [`HttpClient`], [`send`] and [`Reply`]: a small HTTP/1 client for the
//!   self-tests and the demo's burst (re-exported from `redlock_tests::http`,
//!   which the tower and actix suites use too);
//! - [`Gauge`]: how many requests are inside a section at once, and the most seen
//!   (re-exported from `redlock_tests::util`);
//! - [`percentile`] and [`Checks`]: the numbers and the verdict of a run;
//! - [`payments`]: the ledger and self-test of `axum_payments` and `actix_payments`;
//! - [`webhooks`]: the same for `axum_webhook` and `actix_webhook`.

#![deny(missing_docs)]

pub mod payments;
pub mod webhooks;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use axum::Router;
use redlock_core::Redlock;
use redlock_tests::Cluster;
pub use redlock_tests::http::{
    CLIENT_TIMEOUT, HttpClient, HttpError, Reply, client as http_client, percentile, send,
    send_retrying_busy,
};
pub use redlock_tests::util::{Gauge, GaugeGuard};

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
        self.port_or(3000)
    }

    /// [`Args::port`] with another default (the actix examples: 8080).
    ///
    /// # Errors
    /// A port that does not parse.
    pub fn port_or(&self, default: u16) -> Result<u16, String> {
        if let Some(p) = self.value("--port")? {
            return Ok(p);
        }
        if self.flag("--self-test") {
            return Ok(0);
        }
        match std::env::var("PORT") {
            Ok(p) => p.parse().map_err(|_| format!("PORT: cannot parse {p:?}")),
            Err(_) => Ok(default),
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
