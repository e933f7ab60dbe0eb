//! Helpers shared by the `tower_*` suites: a real axum server on a loopback port,
//! a hyper client with a generous timeout, a `Redlock` over a test cluster, an
//! in-flight gauge, a drop recorder and bounded async waits.
//!
//! Each suite uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use redlock_core::Redlock;
use redlock_tests::Cluster;
pub(crate) use redlock_tests::util::{DropRecorder, Gauge, eventually, within};

/// Every request of the suites is bounded by this.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A `Redlock` over the cluster with a per-node timeout that tolerates a loaded
/// machine (tests run next to other builds on two cores) and stays below the
/// shortest TTL the suites use (300 ms).
pub(crate) fn redlock(cluster: &Cluster) -> Redlock {
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

pub(crate) type HttpClient = Client<HttpConnector, Body>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A whole response.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text()))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Retry-After` in seconds, if present and numeric.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").and_then(|v| v.parse().ok())
    }
}

/// Sends a request and reads the whole response, within [`CLIENT_TIMEOUT`].
pub(crate) async fn try_send(client: &HttpClient, req: Request<Body>) -> Result<Reply, String> {
    let fut = async {
        let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(CLIENT_TIMEOUT, fut)
        .await
        .map_err(|_| format!("no answer within {CLIENT_TIMEOUT:?}"))?
}

pub(crate) async fn http_get(client: &HttpClient, url: &str) -> Reply {
    try_send(client, Request::get(url).body(Body::empty()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

pub(crate) async fn http_get_with(client: &HttpClient, url: &str, header: (&str, &str)) -> Reply {
    let req = Request::get(url)
        .header(header.0, header.1)
        .body(Body::empty())
        .unwrap();
    try_send(client, req)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
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

/// Waits (up to 2 s) until every node of `cluster` has `key`. An acquire returns
/// once a quorum answered, so the last node's key may land a moment later.
pub(crate) async fn on_every_node(cluster: &Cluster, key: &str) -> bool {
    eventually(Duration::from_secs(2), || {
        cluster.count_with_key(key) == cluster.len()
    })
    .await
}

/// A stream of `n` chunks (`chunk 0\n`, `chunk 1\n`, …), the first at once and
/// then one every `every`; each chunk bumps `produced` when it is made, so a
/// test can tell how many were made after some instant.
pub(crate) fn counted_chunks(
    n: usize,
    every: Duration,
    produced: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
    futures_util::stream::unfold(0usize, move |i| {
        let produced = produced.clone();
        async move {
            if i >= n {
                return None;
            }
            if i > 0 {
                tokio::time::sleep(every).await;
            }
            produced.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some((Ok(Bytes::from(format!("chunk {i}\n"))), i + 1))
        }
    })
}

/// A response body as the client saw it: the text, and how it ended.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) text: String,
    /// `None` for a clean end, else the client's error (e.g. an aborted
    /// connection in the middle of a chunked body).
    pub(crate) error: Option<String>,
    pub(crate) ended_at: Instant,
}

impl Received {
    /// How many `chunk N` lines arrived whole.
    pub(crate) fn chunks(&self) -> usize {
        self.text.matches('\n').count()
    }
}

/// Reads `body` to its end or its first error, within [`CLIENT_TIMEOUT`].
pub(crate) async fn receive<B>(mut body: B) -> Received
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut text = String::new();
    let error = within(CLIENT_TIMEOUT, "the body's end", async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        text.push_str(&String::from_utf8_lossy(data));
                    }
                }
                Err(e) => return Some(format!("{e:?}")),
            }
        }
        None
    })
    .await;
    Received {
        text,
        error,
        ended_at: Instant::now(),
    }
}
