//! A small HTTP/1 client for the tower and actix suites and for the examples'
//! self-tests and demo: a pooled hyper client ([`HttpClient`], [`client`]),
//! whole responses ([`Reply`], [`send`], [`get`]), bursts of concurrent
//! requests ([`burst`], [`count`]), streamed bodies ([`open`], [`receive`],
//! [`counted_chunks`]) and latency [`percentile`]s.
//!
//! Every exchange is bounded by [`CLIENT_TIMEOUT`]. Statuses are `http` 1.x
//! [`StatusCode`]s, which compare equal to their numbers (`reply.status == 409`),
//! so the actix suites (whose own `StatusCode` is `http` 0.2's) can compare them
//! with plain numbers.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::util::within;

/// A pooled HTTP/1 client whose requests carry a whole body (empty for a `GET`).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new [`HttpClient`] (plain `http://` only).
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Every exchange of this module is bounded by this: generous, because tests
/// run next to other builds on two cores.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request got no whole response: an invalid request, a transport
/// error, a body cut off, or no answer within [`CLIENT_TIMEOUT`]. The message
/// starts with the method and URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError(String);

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HttpError {}

/// A whole response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    ///
    /// # Panics
    /// When the body is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text()))
    }

    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Retry-After` in seconds, if present and numeric.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").and_then(|v| v.parse().ok())
    }
}

/// Sends one request with these headers and body and reads the whole
/// response, within [`CLIENT_TIMEOUT`].
///
/// # Errors
/// An invalid method, URL or header, a transport error, or the timeout.
pub async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Reply, HttpError> {
    let fail = |what: String| HttpError(format!("{method} {url}: {what}"));
    let mut req = Request::builder().method(method.clone()).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(body.into()))
        .map_err(|e| fail(format!("invalid request: {e}")))?;
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| fail(format!("{e:?}")))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| fail(format!("body: {e:?}")))?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(CLIENT_TIMEOUT, exchange)
        .await
        .map_err(|_| fail(format!("no answer within {CLIENT_TIMEOUT:?}")))?
}

/// Sends `GET url` with these headers and reads the whole response, within
/// [`CLIENT_TIMEOUT`].
///
/// # Errors
/// As [`send`].
pub async fn try_get(
    client: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, HttpError> {
    send(client, Method::GET, url, headers, Bytes::new()).await
}

/// Sends `GET url` and reads the whole response.
///
/// # Panics
/// When [`try_get`] fails.
pub async fn get(client: &HttpClient, url: &str) -> Reply {
    get_with(client, url, &[]).await
}

/// Sends `GET url` with these headers and reads the whole response.
///
/// # Panics
/// When [`try_get`] fails.
pub async fn get_with(client: &HttpClient, url: &str, headers: &[(&str, &str)]) -> Reply {
    try_get(client, url, headers)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Sends `GET url` and returns the response as soon as its head arrived, the
/// body still to read (with [`receive`] or frame by frame).
///
/// # Panics
/// A transport error, or no head within [`CLIENT_TIMEOUT`].
pub async fn open(client: &HttpClient, url: &str) -> Response<Incoming> {
    let req = Request::get(url)
        .body(Full::default())
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    within(CLIENT_TIMEOUT, "response head", client.request(req))
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e:?}"))
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
/// As [`send`].
pub async fn send_retrying_busy(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    retries: u32,
    pause: Duration,
) -> Result<(Reply, u32), HttpError> {
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

/// Sends `n` concurrent `GET url` (on this task) and returns the statuses.
///
/// # Panics
/// When a request fails.
pub async fn burst(client: &HttpClient, url: &str, n: usize) -> Vec<StatusCode> {
    let requests = (0..n).map(|_| async move { get(client, url).await.status });
    futures_util::future::join_all(requests).await
}

/// How many of `statuses` are `status` (a [`StatusCode`] or a number).
pub fn count<S>(statuses: &[StatusCode], status: S) -> usize
where
    StatusCode: PartialEq<S>,
{
    statuses.iter().filter(|s| **s == status).count()
}

/// A stream of `n` chunks (`chunk 0\n`, `chunk 1\n`, …), the first at once and
/// then one every `every`; each chunk bumps `produced` when it is made, so a
/// test can tell how many were made after some instant.
///
/// It sleeps with `tokio::time`, so it runs on any tokio runtime, actix-web's
/// workers included.
pub fn counted_chunks(
    n: usize,
    every: Duration,
    produced: Arc<AtomicUsize>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures_util::stream::unfold(0usize, move |i| {
        let produced = produced.clone();
        async move {
            if i >= n {
                return None;
            }
            if i > 0 {
                tokio::time::sleep(every).await;
            }
            produced.fetch_add(1, Ordering::SeqCst);
            Some((Ok(Bytes::from(format!("chunk {i}\n"))), i + 1))
        }
    })
}

/// What [`chunk_made_across_the_loss`] tells the test.
#[derive(Debug, Default)]
pub struct AcrossTheLoss {
    /// The producer made its second chunk after it saw the lock lost.
    pub made_after_the_loss: std::sync::atomic::AtomicBool,
}

/// A stream of two chunks: `before the loss\n` at once, then `made after the
/// loss\n`, made in a poll that blocks its thread until `lock` is lost
/// (checked every 5 ms, for at most 10 s): a producer that runs past its
/// lock's deadline without yielding, so that the loss happens inside the poll
/// that makes the chunk. On a runtime with one thread (a current-thread
/// runtime, an actix-web worker) the renewal task cannot run meanwhile, and
/// the clock runs the lock out.
pub fn chunk_made_across_the_loss(
    lock: redlock_core::LockHandle,
    state: Arc<AcrossTheLoss>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let first = futures_util::stream::iter([Ok(Bytes::from("before the loss\n"))]);
    let second = futures_util::stream::once(async move {
        let started = Instant::now();
        while !lock.is_lost() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        state
            .made_after_the_loss
            .store(lock.is_lost(), Ordering::SeqCst);
        Ok(Bytes::from("made after the loss\n"))
    });
    futures_util::StreamExt::chain(first, second)
}

/// A response body as the client saw it: the text, and how it ended.
#[derive(Debug)]
pub struct Received {
    /// The text that arrived.
    pub text: String,
    /// `None` for a clean end, else the client's error (e.g. an aborted
    /// connection in the middle of a chunked body).
    pub error: Option<String>,
    /// When the body ended (or failed).
    pub ended_at: Instant,
}

impl Received {
    /// How many `chunk N` lines arrived whole.
    pub fn chunks(&self) -> usize {
        self.text.matches('\n').count()
    }
}

/// Reads `body` to its end or its first error.
///
/// # Panics
/// When the body neither ends nor fails within [`CLIENT_TIMEOUT`].
pub async fn receive<B>(mut body: B) -> Received
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: fmt::Debug,
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

/// The `p`-th percentile (0.0..=100.0, nearest rank) of `sorted`; zero for
/// none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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
    fn count_takes_codes_and_numbers() {
        let s = [StatusCode::OK, StatusCode::CONFLICT, StatusCode::OK];
        assert_eq!(count(&s, StatusCode::OK), 2);
        assert_eq!(count(&s, 409), 1);
        assert_eq!(count(&s, 423), 0);
    }
}
