//! Helpers shared by the `actix_*` suites: a real `HttpServer` on a loopback
//! port, a hyper client with a generous timeout, a `Redlock` over a test
//! cluster, an in-flight gauge, a drop recorder and bounded waits.
//!
//! Each suite uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code, unused_macros, unused_imports)]

use std::net::SocketAddr;
use std::time::Duration;
use std::time::Instant;

use actix_web::dev::ServerHandle;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
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
/// machine (tests run next to other builds on two cores).
pub(crate) fn redlock(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(100))
        .build()
        .unwrap()
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

pub(crate) type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A whole response, with the status as a number (hyper and actix use
/// different `http` versions).
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
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

/// Sends `GET url` with extra headers and reads the whole response, within
/// [`CLIENT_TIMEOUT`].
pub(crate) async fn try_get(
    client: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let mut req = http::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::new()).unwrap();
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?
            .to_bytes();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(CLIENT_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {CLIENT_TIMEOUT:?}"))?
}

pub(crate) async fn get(client: &HttpClient, url: &str) -> Reply {
    try_get(client, url, &[])
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Sends `n` concurrent `GET url` and returns the statuses.
pub(crate) async fn burst(client: &HttpClient, url: &str, n: usize) -> Vec<u16> {
    let requests = (0..n).map(|_| {
        let (client, url) = (client.clone(), url.to_owned());
        async move { get(&client, &url).await.status }
    });
    futures_util::future::join_all(requests).await
}

/// How many of `statuses` are `status`.
pub(crate) fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

/// What a test needs of an in-process response (`actix_web::test`).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: Option<String>,
    pub(crate) retry_after: Option<u64>,
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
        let status = resp.status().as_u16();
        let body = actix_web::test::read_body(resp).await;
        Self {
            status,
            content_type,
            retry_after,
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

/// A stream of `n` chunks (`chunk 0\n`, `chunk 1\n`, …), the first at once and
/// then one every `every`; each chunk bumps `produced` when it is made, so a
/// test can tell how many were made after some instant.
pub(crate) fn counted_chunks(
    n: usize,
    every: Duration,
    produced: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + 'static {
    futures_util::stream::unfold(0usize, move |i| {
        let produced = produced.clone();
        async move {
            if i >= n {
                return None;
            }
            if i > 0 {
                actix_web::rt::time::sleep(every).await;
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
