//! The combination matrix of issue 47 through the web adapters (the core
//! API's is `matrix.rs`), written once for both: what each case's requests
//! are, what a handler does for each way a request ends, what the clients
//! do, and how a case is judged. `tower_matrix.rs` and `actix_matrix.rs`
//! only serve the routes.
//!
//! Each primitive an adapter can express for a request (a mutex on the
//! path, a mutex on a set of path parameters, `.permits(2)`, and
//! `.shared_for_safe_methods()` with GET readers and a POST writer) × the
//! fencing of the handle (off, Hybrid, Durable) × how the request ends:
//!
//! - **release:** the handler answers, in memory (released before the head);
//! - **streamed:** the handler answers with a stream of a few chunks, read to
//!   its end (the body holds the lock and releases at its end);
//! - **panic:** the handler panics (the server drops the request with its
//!   connection);
//! - **cancel:** the client drops its connection while the handler runs (the
//!   server drops the handler);
//! - **body dropped:** the handler answers with an endless stream, and the
//!   client drops its connection once the first chunk is in (the body, which
//!   holds the lock, is dropped).
//!
//! Each case runs the core matrix's contenders and rounds, and is judged by
//! its `judge` from the sections the handlers recorded: a section runs from
//! the handler's start to its end, or to the drop of what it left holding
//! the lock (the handler's future, the streamed body), so it lies inside the
//! lock. The tokens are those the handler's `LockHandle` gives per resource
//! (and the `FencingToken` the adapter lends beside it must be the handle's).
//! An adapter's cases all run at once, on one cluster and one server, and
//! hygiene is the core matrix's, on every node, once they all ended.
//! Several keys with permits or a shared side are refused by both adapters
//! before the handler, with nothing written: `tower.rs` and `actix.rs`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use http::{Method, StatusCode};
use redlock_core::{FencingMode, FencingToken, LockHandle};
use redlock_tests::http::{CLIENT_TIMEOUT, HttpClient, client, send};
use redlock_tests::http_timing::answered;
use redlock_tests::util::{eventually, within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::matrix::{
    CONTENDERS, ROUNDS, SHAPES, Section, Shape, Tokens, WORK, all_passed, judge, tokens,
};

/// How a request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    Release,
    Streamed,
    Panic,
    Cancel,
    BodyDropped,
}

const ENDINGS: [Ending; 5] = [
    Ending::Release,
    Ending::Streamed,
    Ending::Panic,
    Ending::Cancel,
    Ending::BodyDropped,
];

/// Every fencing mode, with the name of its routes.
pub(super) const FENCINGS: [(Option<FencingMode>, &str); 3] = [
    (None, "plain"),
    (Some(FencingMode::Hybrid), "hybrid"),
    (Some(FencingMode::Durable), "durable"),
];

/// The header that names a request to the [`Probe`].
pub(super) const REQUEST: &str = "x-matrix-request";

/// How long a request waits for its lock before the busy answer (which the
/// client retries): a request through a patient layer, doing the matrix's
/// work, and within the client's own bound, so that the busy answer comes
/// before the client gives up.
pub(super) fn wait() -> Duration {
    answered(WORK).min(CLIENT_TIMEOUT / 2)
}

/// How many busy answers a contender retries in one round.
const BUSY_RETRIES: usize = 5;

impl Ending {
    fn word(self) -> &'static str {
        match self {
            Ending::Release => "release",
            Ending::Streamed => "streamed",
            Ending::Panic => "panic",
            Ending::Cancel => "cancel",
            Ending::BodyDropped => "body",
        }
    }
}

/// The route template of `shape`'s routes under `tag`; `{ending}` (and a
/// set's `{from}` and `{to}`) keep the cases' keys apart.
pub(super) fn template(tag: &str, shape: Shape) -> String {
    match shape {
        Shape::MutexOne => format!("/{tag}/mutex/{{ending}}"),
        Shape::MutexSet => format!("/{tag}/set/{{ending}}/{{from}}/{{to}}"),
        Shape::Permits2 => format!("/{tag}/permits/{{ending}}"),
        Shape::ReadWrite => format!("/{tag}/rw/{{ending}}"),
    }
}

/// The request contender `c` of a case sends, and whether it takes the lock
/// alone.
fn request(tag: &str, shape: Shape, ending: Ending, c: usize) -> (Method, String, bool) {
    let ending = ending.word();
    match shape {
        Shape::MutexOne => (Method::POST, format!("/{tag}/mutex/{ending}"), true),
        // Every two of {a, b}, {b, c}, {a, c} share a key, as in the core
        // matrix; the values name the case, so that cases share none.
        Shape::MutexSet => {
            let names = ["a", "b", "c"];
            let (from, to) = (names[c % 3], names[(c + 1) % 3]);
            let path = format!("/{tag}/set/{ending}/{tag}.{ending}.{from}/{tag}.{ending}.{to}");
            (Method::POST, path, true)
        }
        Shape::Permits2 => (Method::POST, format!("/{tag}/permits/{ending}"), false),
        // Contender 0 writes, the others read.
        Shape::ReadWrite => {
            let path = format!("/{tag}/rw/{ending}");
            if c == 0 {
                (Method::POST, path, true)
            } else {
                (Method::GET, path, false)
            }
        }
    }
}

/// What the test knows of each request it sent, and what its handler
/// recorded. Shared by the app (its state) and the clients.
#[derive(Debug, Default)]
pub(super) struct Probe {
    next: AtomicU64,
    requests: Mutex<HashMap<u64, Sent>>,
}

#[derive(Debug)]
struct Sent {
    case: Arc<str>,
    ending: Ending,
    exclusive: bool,
    entered: bool,
    section: Option<Section>,
}

impl Probe {
    fn register(&self, case: &Arc<str>, ending: Ending, exclusive: bool) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.requests.lock().unwrap().insert(
            id,
            Sent {
                case: Arc::clone(case),
                ending,
                exclusive,
                entered: false,
                section: None,
            },
        );
        id
    }

    fn entered(&self, id: u64) -> bool {
        self.requests.lock().unwrap()[&id].entered
    }

    fn section(&self, id: u64) -> Option<Section> {
        self.requests.lock().unwrap()[&id].section.clone()
    }

    /// The sections the handlers of `case` recorded.
    fn sections_of(&self, case: &str) -> Vec<Section> {
        self.requests
            .lock()
            .unwrap()
            .values()
            .filter(|sent| &*sent.case == case)
            .filter_map(|sent| sent.section.clone())
            .collect()
    }
}

/// A handler's section under way; recorded when dropped: by the handler, or
/// with the handler's future or the body that holds the lock.
struct Recording {
    probe: Arc<Probe>,
    id: u64,
    enter: Instant,
    exclusive: bool,
    tokens: Tokens,
}

impl Drop for Recording {
    fn drop(&mut self) {
        let section = Section {
            enter: self.enter,
            exit: Instant::now(),
            exclusive: self.exclusive,
            tokens: std::mem::take(&mut self.tokens),
        };
        if let Some(sent) = self.probe.requests.lock().unwrap().get_mut(&self.id) {
            sent.section = Some(section);
        }
    }
}

/// A streamed body.
pub(super) type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, Infallible>> + Send>>;

/// What a handler answers.
pub(super) enum Answer {
    /// An in-memory body.
    Whole(&'static str),
    /// A streamed body.
    Stream(Chunks),
}

/// The handler of every route: records its section and ends as its request
/// asks. `id` is the [`REQUEST`] header, `lock` the handle the adapter lent
/// and `token` the fencing token it lent.
pub(super) async fn handle(
    probe: Arc<Probe>,
    id: Option<&str>,
    lock: LockHandle,
    token: Option<FencingToken>,
) -> Answer {
    let id: u64 = id.and_then(|v| v.parse().ok()).expect("a matrix request");
    assert_eq!(
        token,
        lock.fencing_token(),
        "the token lent is the handle's"
    );
    let (ending, exclusive) = {
        let mut requests = probe.requests.lock().unwrap();
        let sent = requests.get_mut(&id).expect("a registered request");
        sent.entered = true;
        (sent.ending, sent.exclusive)
    };
    let recording = Recording {
        probe,
        id,
        enter: Instant::now(),
        exclusive,
        tokens: tokens(&lock),
    };
    match ending {
        Ending::Release => {
            tokio::time::sleep(WORK).await;
            assert!(!lock.is_lost(), "lost while held");
            drop(recording);
            Answer::Whole("released")
        }
        Ending::Panic => {
            tokio::time::sleep(WORK).await;
            drop(recording);
            panic!("the handler panics (on purpose)");
        }
        Ending::Streamed => {
            // The section ends with the stream's state, when it ends.
            let chunks =
                futures_util::stream::unfold((recording, 0), |(recording, n)| async move {
                    tokio::time::sleep(WORK / 3).await;
                    (n < 3).then(|| (Ok(Bytes::from_static(b"chunk\n")), (recording, n + 1)))
                });
            Answer::Stream(Box::pin(chunks))
        }
        Ending::Cancel => {
            // Until the client leaves and the server drops this future: one
            // that is never dropped never ends its section, and fails the case.
            let _recording = recording;
            std::future::pending().await
        }
        Ending::BodyDropped => {
            // Endless, until the client leaves and the server drops the body.
            let chunks = futures_util::stream::unfold(recording, |recording| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Some((Ok(Bytes::from_static(b"chunk\n")), recording))
            });
            // The first chunk at once: the head goes out with the lock held.
            let first = futures_util::stream::iter([Ok(Bytes::from_static(b"chunk\n"))]);
            Answer::Stream(Box::pin(futures_util::StreamExt::chain(first, chunks)))
        }
    }
}

/// Where a matrix app is served.
pub(super) struct Target {
    pub(super) addr: SocketAddr,
    pub(super) probe: Arc<Probe>,
}

/// What one attempt got.
enum Attempt {
    /// The handler ran.
    Held,
    /// The busy answer, before the handler.
    Busy,
}

fn is_busy(status: u16) -> bool {
    status == StatusCode::CONFLICT || status == StatusCode::TOO_MANY_REQUESTS
}

/// A raw request on a connection of its own, for the endings where the
/// client leaves mid-response.
async fn raw(target: &Target, method: &Method, path: &str, id: u64) -> tokio::net::TcpStream {
    let mut conn = tokio::net::TcpStream::connect(target.addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: matrix\r\n{REQUEST}: {id}\r\ncontent-length: 0\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn
}

/// The status of a response whose start is `bytes`.
fn status_of(bytes: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(bytes);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP/1.1 response: {text:?}"))
}

/// One request of a case, ended by `ending`.
async fn attempt(
    target: &Target,
    client: &HttpClient,
    (method, path): (&Method, &str),
    ending: Ending,
    id: u64,
) -> Attempt {
    let url = format!("http://{}{path}", target.addr);
    let header = id.to_string();
    let probe = &target.probe;
    match ending {
        Ending::Release | Ending::Streamed => {
            let reply = send(client, method.clone(), &url, &[(REQUEST, &header)], "")
                .await
                .unwrap();
            if probe.entered(id) {
                assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text());
                let want = if ending == Ending::Release {
                    "released"
                } else {
                    "chunk\nchunk\nchunk\n"
                };
                assert_eq!(reply.text(), want, "{path}");
                Attempt::Held
            } else {
                assert!(is_busy(reply.status.as_u16()), "{path}: {}", reply.text());
                Attempt::Busy
            }
        }
        Ending::Panic => {
            let reply = send(client, method.clone(), &url, &[(REQUEST, &header)], "").await;
            if probe.entered(id) {
                assert!(
                    !matches!(&reply, Ok(r) if r.status.is_success()),
                    "{path}: a panicking handler answered {reply:?}"
                );
                Attempt::Held
            } else {
                let reply = reply.unwrap();
                assert!(is_busy(reply.status.as_u16()), "{path}: {}", reply.text());
                Attempt::Busy
            }
        }
        Ending::Cancel => {
            let mut conn = raw(target, method, path, id).await;
            let mut buf = [0u8; 512];
            tokio::select! {
                inside = eventually(CLIENT_TIMEOUT, || probe.entered(id)) => {
                    assert!(inside, "{path}: neither inside nor answered");
                    drop(conn);
                    Attempt::Held
                }
                n = conn.read(&mut buf) => {
                    let status = status_of(&buf[..n.unwrap()]);
                    assert!(is_busy(status), "{path}: {status} before the client left");
                    Attempt::Busy
                }
            }
        }
        Ending::BodyDropped => {
            let mut conn = raw(target, method, path, id).await;
            let mut seen = Vec::new();
            let mut buf = [0u8; 512];
            within(
                CLIENT_TIMEOUT,
                "the head and a chunk, or the busy answer",
                async {
                    loop {
                        let n = conn.read(&mut buf).await.unwrap();
                        assert!(
                            n > 0,
                            "{path}: closed: {:?}",
                            String::from_utf8_lossy(&seen)
                        );
                        seen.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&seen);
                        if let Some((_, body)) = text.split_once("\r\n\r\n")
                            && (body.contains("chunk") || !text.starts_with("HTTP/1.1 200"))
                        {
                            return;
                        }
                    }
                },
            )
            .await;
            let status = status_of(&seen);
            if status == 200 {
                assert!(probe.entered(id));
                drop(conn);
                Attempt::Held
            } else {
                assert!(is_busy(status), "{path}: {status}");
                Attempt::Busy
            }
        }
    }
}

/// One contender of a case: a section per round, retrying busy answers.
async fn contender(
    target: &Target,
    case: &Arc<str>,
    request: (Method, String, bool),
    ending: Ending,
) {
    let (method, path, exclusive) = request;
    let client = client();
    for _ in 0..ROUNDS {
        let mut held = None;
        for _ in 0..=BUSY_RETRIES {
            let id = target.probe.register(case, ending, exclusive);
            if let Attempt::Held = attempt(target, &client, (&method, &path), ending, id).await {
                held = Some(id);
                break;
            }
        }
        let id = held.unwrap_or_else(|| panic!("{path}: busy {BUSY_RETRIES} times"));
        // The section ends when what held the lock is dropped.
        assert!(
            eventually(answered(Duration::ZERO), || target
                .probe
                .section(id)
                .is_some())
            .await,
            "{path} ({ending:?}): the handler's section never ended"
        );
    }
}

/// Runs every case on `target` at once and judges each; panics with every
/// case that failed.
pub(super) async fn run_cases(adapter: &str, target: &Target) {
    let mut cases = Vec::new();
    for (fencing, tag) in FENCINGS {
        for shape in SHAPES {
            for ending in ENDINGS {
                let case: Arc<str> = format!("{adapter}/{tag}/{shape:?}/{ending:?}").into();
                cases.push(async move {
                    let contenders = (0..CONTENDERS)
                        .map(|c| contender(target, &case, request(tag, shape, ending, c), ending));
                    let ran = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
                        futures_util::future::join_all(contenders),
                    ))
                    .await;
                    let why = |e: Box<dyn std::any::Any + Send>| {
                        e.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default()
                    };
                    if let Err(e) = ran {
                        return Some(format!("{case}: {}", why(e)));
                    }
                    // The judge's messages name the case.
                    let sections = target.probe.sections_of(&case);
                    std::panic::catch_unwind(|| judge(&case, shape, fencing, &sections))
                        .err()
                        .map(why)
                });
            }
        }
    }
    all_passed(cases).await;
}
