//! WebSocket sessions under the layer: axum answers `101` with an empty body
//! and runs the session in a task of its own afterwards, so the end of the
//! body is not the end of the work. The lock of an upgraded request is kept
//! while the handles lent to the handler live: a session that moved its `Held`
//! into `on_upgrade` holds the lock until it ends. Real server on loopback, real
//! WebSocket client (tokio-tungstenite), real `redis-server` nodes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::StreamExt;
use redlock_tests::Cluster;
use redlock_tower::{Held, RedlockLayer};
use tokio::sync::Notify;

use crate::common::*;

/// How long a session of the scenario runs.
const SESSION: Duration = Duration::from_millis(800);

/// What one session saw.
#[derive(Debug, Clone)]
struct Seen {
    doc: String,
    start: Instant,
    end: Instant,
    held_at_start: bool,
    held_at_end: bool,
    /// Another session was running while this one ran (`?meet=1`).
    met: bool,
}

#[derive(Default)]
struct Sessions {
    seen: Mutex<Vec<Seen>>,
    /// Sessions running now, and the most that ever ran at once.
    running: Mutex<(usize, usize)>,
    changed: Notify,
}

impl Sessions {
    fn seen(&self) -> Vec<Seen> {
        let mut seen = self.seen.lock().unwrap().clone();
        seen.sort_by_key(|s| s.start);
        seen
    }

    fn running(&self) -> usize {
        self.running.lock().unwrap().0
    }

    fn add_running(&self, n: isize) {
        let mut running = self.running.lock().unwrap();
        running.0 = running.0.saturating_add_signed(n);
        running.1 = running.1.max(running.0);
        self.changed.notify_waiters();
    }

    /// Waits (within a liveness bound) until two sessions have run at once.
    async fn meet(&self) -> bool {
        let deadline = Instant::now() + answered(SESSION);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.running.lock().unwrap().1 >= 2 {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
                return false;
            }
        }
    }
}

/// Whether the query of `uri` has `flag`.
fn has(uri: &http::Uri, flag: &str) -> bool {
    uri.query().unwrap_or("").split('&').any(|kv| kv == flag)
}

/// `GET /ws/{doc}`: the session runs [`SESSION`] (or, with `?meet=1`, until
/// another session runs beside it), recording what its `Held` says, then
/// closes. With `?keep=0` the handler keeps no `Held`.
async fn ws(
    upgrade: WebSocketUpgrade,
    Path(doc): Path<String>,
    uri: http::Uri,
    State(sessions): State<Arc<Sessions>>,
    Held(lock): Held,
) -> Response {
    let lock = (!has(&uri, "keep=0")).then_some(lock);
    let meet = has(&uri, "meet=1");
    upgrade.on_upgrade(move |socket| session(socket, doc, meet, lock, sessions))
}

async fn session(
    mut socket: WebSocket,
    doc: String,
    meet: bool,
    lock: Option<redlock_core::LockHandle>,
    sessions: Arc<Sessions>,
) {
    let held = |l: &Option<redlock_core::LockHandle>| {
        l.as_ref()
            .is_some_and(|l| !l.is_lost() && !l.remaining().is_zero())
    };
    let start = Instant::now();
    let held_at_start = held(&lock);
    sessions.add_running(1);
    let _ = socket.send(Message::Text("started".into())).await;
    let met = if meet {
        sessions.meet().await
    } else {
        tokio::time::sleep(SESSION).await;
        false
    };
    let held_at_end = held(&lock);
    let end = Instant::now();
    sessions.add_running(-1);
    sessions.seen.lock().unwrap().push(Seen {
        doc,
        start,
        end,
        held_at_start,
        held_at_end,
        met,
    });
    let _ = socket.send(Message::Close(None)).await;
    // The lock goes with `lock`, at the end of the session.
    drop(lock);
}

fn app(cluster: &Cluster, sessions: &Arc<Sessions>) -> Router {
    Router::new()
        .route("/ws/{doc}", get(ws))
        .with_state(Arc::clone(sessions))
        .layer(RedlockLayer::by_path().wait(answered(SESSION)))
        .layer(Extension(cluster.patient_redlock()))
}

/// Opens a WebSocket to `url` and reads it until the server has closed the
/// connection (the close handshake is answered on the way). Returns the
/// upgrade's status and the text messages received.
async fn client(url: String) -> (u16, Vec<String>) {
    within(answered(SESSION * 2), "a WebSocket session", async move {
        let (mut stream, response) = tokio_tungstenite::connect_async(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let mut texts = Vec::new();
        while let Some(message) = stream.next().await {
            match message {
                Ok(tokio_tungstenite::tungstenite::Message::Text(t)) => texts.push(t.to_string()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        (response.status().as_u16(), texts)
    })
    .await
}

fn ws_url(server: &Server, path: &str) -> String {
    format!("ws://{}{path}", server.addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_on_one_doc_never_overlap_and_each_holds_the_lock() {
    let cluster = Cluster::start(3);
    let sessions = Arc::new(Sessions::default());
    let server = Server::start(app(&cluster, &sessions)).await;
    let url = ws_url(&server, "/ws/doc-1");

    let (a, b) = tokio::join!(client(url.clone()), client(url));
    assert_eq!((a.0, b.0), (101, 101), "both sessions were upgraded");
    assert_eq!(a.1, ["started"]);
    assert_eq!(b.1, ["started"]);

    let seen = sessions.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert!(
            s.held_at_start && s.held_at_end,
            "`Held` must say held while the session runs: {s:?}"
        );
    }
    assert!(
        seen[0].end <= seen[1].start,
        "the sessions on one doc overlapped: {seen:?}"
    );
    // Released once the last session ended.
    assert!(
        on_no_node(&cluster, "redlock:/ws/doc-1").await,
        "the lock is released when the session ends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holds_its_doc_while_one_on_another_doc_runs_beside_it() {
    let cluster = Cluster::start(3);
    let sessions = Arc::new(Sessions::default());
    let server = Server::start(app(&cluster, &sessions)).await;

    let (a, b) = tokio::join!(
        client(ws_url(&server, "/ws/doc-a?meet=1")),
        client(ws_url(&server, "/ws/doc-b?meet=1"))
    );
    assert_eq!((a.0, b.0), (101, 101));
    let seen = sessions.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert!(
            s.met,
            "the sessions on two docs did not run together: {seen:?}"
        );
        assert!(s.held_at_start && s.held_at_end, "{s:?}");
    }
    let docs: Vec<&str> = seen.iter().map(|s| s.doc.as_str()).collect();
    assert!(
        docs.contains(&"doc-a") && docs.contains(&"doc-b"),
        "{docs:?}"
    );
}

/// A handler that kept no `Held` cannot tell when its session ends: the lock
/// is released with the (empty) body, as documented, and the session runs
/// unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_handler_kept_no_held_is_released_at_once() {
    let cluster = Cluster::start(3);
    let sessions = Arc::new(Sessions::default());
    let server = Server::start(app(&cluster, &sessions)).await;

    let session = tokio::spawn(client(ws_url(&server, "/ws/doc-x?keep=0&meet=1")));
    assert!(
        eventually(answered(Duration::ZERO), || sessions.running() == 1).await,
        "the first session started"
    );
    assert!(
        on_no_node(&cluster, "redlock:/ws/doc-x").await,
        "released while the first session still runs"
    );
    // So a second session on the doc starts beside it.
    let second = client(ws_url(&server, "/ws/doc-x?keep=0&meet=1")).await;
    assert_eq!(second.0, 101);
    let first = within(answered(SESSION * 2), "first session", session)
        .await
        .unwrap();
    assert_eq!(first.0, 101);
    assert!(
        sessions.seen().iter().all(|s| s.met),
        "{:?}",
        sessions.seen()
    );
}
