//! Helpers shared by the `tower_*` suites: a real axum server on a loopback port
//! and a `Redlock` over a test cluster; the HTTP client (`redlock_tests::http`),
//! the in-flight gauge, the drop recorder and the bounded async waits
//! (`redlock_tests::util`) are re-exported.
//!
//! Each suite uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use redlock_core::Redlock;
use redlock_tests::Cluster;
pub(crate) use redlock_tests::http::{
    CLIENT_TIMEOUT, HttpClient, Received, Reply, client, counted_chunks, get as http_get,
    get_with as http_get_with, open, receive, try_get,
};
pub(crate) use redlock_tests::http_timing::{answered, answered_with};
pub(crate) use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT, liveness};
pub(crate) use redlock_tests::util::{DropRecorder, Gauge, eventually, within};

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A `Redlock` for a test whose TTL is its subject and is too short for the
/// patient node timeout of [`Cluster::patient_redlock`] (the handle of every
/// other test, whose locks need a TTL above 2 s: the layers' default is 5 s):
/// 200 ms, below the shortest TTL the suites use (300 ms). Such a test must
/// accept the library's honest answer to a node slower than that (a 503, a
/// loss) as long as safety held.
pub(crate) fn short_ttl_redlock(cluster: &Cluster) -> Redlock {
    redlock_with_timeout(cluster, ms(200))
}

/// A `Redlock` over the cluster with this per-node timeout.
pub(crate) fn redlock_with_timeout(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// An axum app served by `axum::serve` on 127.0.0.1:0; the accept loop is
/// aborted on drop.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, task }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Like [`eventually`], returning the instant the condition was first seen.
pub(crate) async fn eventually_at(timeout: Duration, f: impl FnMut() -> bool) -> Option<Instant> {
    eventually(timeout, f).await.then(Instant::now)
}

/// The number in `?hold=<ms>` of a request URI (0 when absent): how long the
/// test handlers keep the lock.
pub(crate) fn hold_of(uri: &http::Uri) -> Duration {
    let n = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("hold="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ms(n)
}

/// Waits (up to [`timing::settled`]) until every node of `cluster` has `key`.
/// An acquire returns once a quorum answered, so the last node's key may land
/// a moment later.
pub(crate) async fn on_every_node(cluster: &Cluster, key: &str) -> bool {
    cluster.settled_count(key, cluster.len()).await == cluster.len()
}

/// Waits (up to [`timing::settled`]) until no node of `cluster` has `key`: a
/// release returns at quorum, so the last node's deletion may land a moment
/// later.
pub(crate) async fn on_no_node(cluster: &Cluster, key: &str) -> bool {
    cluster.settled_count(key, 0).await == 0
}
