//! Helpers shared by the `actix_*` suites: a real `HttpServer` on a loopback
//! port, a `Redlock` over a test cluster and in-process calls (`call!`); the
//! HTTP client (`redlock_tests::http`), the in-flight gauge, the drop recorder
//! and the bounded waits (`redlock_tests::util`) are re-exported.
//!
//! The client's statuses are `http` 1.x `StatusCode`s and actix's are `http`
//! 0.2's: tests compare both with numbers (`reply.status == 409`).
//!
//! Each suite uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code, unused_macros, unused_imports)]

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use redlock_core::Redlock;
use redlock_tests::Cluster;
pub(crate) use redlock_tests::http::{
    CLIENT_TIMEOUT, HttpClient, Received, Reply, burst, client, count, counted_chunks, get, open,
    receive, try_get,
};
pub(crate) use redlock_tests::http_timing::{Gate, answered, answered_with};
pub(crate) use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT, liveness};
pub(crate) use redlock_tests::util::{DropRecorder, Gauge, eventually, within};

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A `Redlock` for a test whose TTL is its subject and is too short for the
/// patient node timeout of [`Cluster::patient_redlock`] (the handle of every
/// other test, whose locks need a TTL of at least twice that to be renewed:
/// the middleware's default is 5 s): 100 ms. Such a test must accept the
/// library's honest answer to a node slower than that (a 503, a loss) as long
/// as safety held.
pub(crate) fn short_ttl_redlock(cluster: &Cluster) -> Redlock {
    redlock_with_timeout(cluster, ms(100))
}

/// A `Redlock` over the cluster with this per-node timeout.
pub(crate) fn redlock_with_timeout(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// Waits (up to [`timing::settled`]) until every node of `cluster` has `key`:
/// an acquire returns at quorum, the last node's key may land a moment later.
pub(crate) async fn on_every_node(cluster: &Cluster, key: &str) -> bool {
    cluster.settled_count(key, cluster.len()).await == cluster.len()
}

/// Waits (up to [`timing::settled`]) until no node of `cluster` has `key`: a
/// release returns at quorum, the last node's deletion may land a moment later.
pub(crate) async fn on_no_node(cluster: &Cluster, key: &str) -> bool {
    cluster.settled_count(key, 0).await == 0
}

/// Starts `HttpServer::new($factory)` on 127.0.0.1:0 with `$workers` workers
/// (2 by default) and returns a [`Server`]. Extra tokens after the factory are
/// method calls on the `HttpServer` before it binds, e.g.
/// `serve!(1, factory, .h1_allow_half_closed(false))`.
macro_rules! serve {
    ($factory:expr) => {
        serve!(2, $factory,)
    };
    ($workers:expr, $factory:expr) => {
        serve!($workers, $factory,)
    };
    ($workers:expr, $factory:expr, $($tune:tt)*) => {{
        let server = ::actix_web::HttpServer::new($factory)
            .workers($workers)
            .disable_signals()
            .shutdown_timeout(1)
            $($tune)*
            .bind(("127.0.0.1", 0))
            .unwrap();
        let addr = server.addrs()[0];
        $crate::common::Server::spawn(addr, server.run())
    }};
}

/// A running actix server; stopped on drop.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    handle: ServerHandle,
}

impl Server {
    pub(crate) fn spawn(addr: SocketAddr, server: actix_web::dev::Server) -> Self {
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Self { addr, handle }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The stop command is sent at once; nothing needs to wait for it.
        drop(self.handle.stop(false));
    }
}

/// What a test needs of an in-process response (`actix_web::test`).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: Option<String>,
    pub(crate) retry_after: Option<u64>,
    /// The `RateLimit-Policy` and `RateLimit` fields.
    pub(crate) rate_limit: (Option<String>, Option<String>),
    pub(crate) body: String,
}

impl Answer {
    pub(crate) async fn of<B: actix_web::body::MessageBody>(
        resp: actix_web::dev::ServiceResponse<B>,
    ) -> Self {
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (content_type, retry_after) = (
            header("content-type"),
            header("retry-after").map(|v| v.parse().unwrap()),
        );
        let rate_limit = (header("ratelimit-policy"), header("ratelimit"));
        let status = resp.status().as_u16();
        let body = actix_web::test::read_body(resp).await;
        Self {
            status,
            content_type,
            retry_after,
            rate_limit,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// Calls an `actix_web::test::init_service` app with `GET $uri` (plus optional
/// `(name, value)` headers): a future of its [`Answer`]. A macro because the
/// request type lives in actix-http, which this crate does not name.
macro_rules! call {
    ($app:expr, $uri:expr $(, $header:expr)*) => {
        async {
            let req = ::actix_web::test::TestRequest::get().uri($uri)
                $(.insert_header($header))*
                .to_request();
            $crate::common::Answer::of(::actix_web::test::call_service($app, req).await).await
        }
    };
}
