//! WebSocket sessions under the middleware (`actix-ws`): the frames are the
//! response body, and the lock of an upgraded request is kept until that body
//! has ended and the last handle lent to the handler is dropped, the same rule
//! as redlock-tower's. Real server on loopback, real WebSocket client
//! (tokio-tungstenite), real `redis-server` nodes.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use redlock_actix::{LockHandle, Redlock, RedlockMiddleware};
use redlock_tests::Cluster;
use tokio::sync::Notify;

use crate::common::*;

/// A `Redlock` over the cluster whose node timeout leaves room for a loaded
/// machine: a 503 here would be the machine, not the case under test.
fn patient_redlock(cluster: &Cluster) -> Redlock {
    cluster.patient_redlock()
}

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
    /// Two sessions ran at once while this one ran (`?meet=1`).
    met: bool,
}

#[derive(Default)]
struct Sessions {
    seen: Mutex<Vec<Seen>>,
    /// Sessions running now, and the most that ever ran at once.
    running: Mutex<(usize, usize)>,
    changed: Notify,
    /// `?linger=1`: the test's go, once the client saw the connection closed.
    go: Notify,
    /// `?linger=1`: whether the handle still said held after that.
    held_after_close: Mutex<Option<bool>>,
}

impl Sessions {
    fn seen(&self) -> Vec<Seen> {
        let mut seen = self.seen.lock().unwrap().clone();
        seen.sort_by_key(|s| s.start);
        seen
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

/// `GET /ws/{doc}`: the session runs [`SESSION`] (or, with `?meet=1`, until
/// two sessions have run at once), recording what its handle says, then
/// closes.
async fn ws(
    req: HttpRequest,
    body: web::Payload,
    doc: web::Path<String>,
    lock: web::ReqData<LockHandle>,
    sessions: web::Data<Sessions>,
) -> actix_web::Result<HttpResponse> {
    let (response, mut session, _messages) = actix_ws::handle(&req, body)?;
    let meet = req.query_string().split('&').any(|kv| kv == "meet=1");
    let linger = req.query_string().split('&').any(|kv| kv == "linger=1");
    let (doc, lock, sessions) = (doc.into_inner(), lock.into_inner(), sessions.into_inner());
    actix_web::rt::spawn(async move {
        let held = |l: &LockHandle| !l.is_lost() && !l.remaining().is_zero();
        let start = Instant::now();
        let held_at_start = held(&lock);
        sessions.add_running(1);
        let _ = session.text("started").await;
        let met = if meet {
            sessions.meet().await
        } else {
            actix_web::rt::time::sleep(SESSION).await;
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
        let _ = session.close(None).await;
        if linger {
            // The frames have ended; the session still has work to do under
            // its lock.
            let go = tokio::time::timeout(answered(Duration::ZERO), sessions.go.notified()).await;
            *sessions.held_after_close.lock().unwrap() = Some(go.is_ok() && held(&lock));
        }
        drop(lock);
    });
    Ok(response)
}

fn server(cluster: &Cluster, sessions: &web::Data<Sessions>) -> Server {
    let redlock = patient_redlock(cluster);
    let sessions = sessions.clone();
    serve!(move || {
        App::new()
            .app_data(redlock.clone())
            .app_data(sessions.clone())
            .service(
                web::resource("/ws/{doc}")
                    .wrap(RedlockMiddleware::by_path().wait(answered(SESSION)))
                    .route(web::get().to(ws)),
            )
    })
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

#[actix_web::test]
async fn two_sessions_on_one_doc_never_overlap_and_each_holds_the_lock() {
    let cluster = Cluster::start(3);
    let sessions = web::Data::new(Sessions::default());
    let server = server(&cluster, &sessions);
    let url = ws_url(&server, "/ws/doc-1");

    let (a, b) = tokio::join!(tokio::spawn(client(url.clone())), tokio::spawn(client(url)));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.0, b.0), (101, 101), "both sessions were upgraded");
    assert_eq!(a.1, ["started"]);
    assert_eq!(b.1, ["started"]);

    let seen = sessions.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert!(
            s.held_at_start && s.held_at_end,
            "the handle must say held while the session runs: {s:?}"
        );
    }
    assert!(
        seen[0].end <= seen[1].start,
        "the sessions on one doc overlapped: {seen:?}"
    );
    assert!(
        on_no_node(&cluster, "redlock:/ws/doc-1").await,
        "the lock is released when the session ends"
    );
}

#[actix_web::test]
async fn a_session_holds_its_doc_while_one_on_another_doc_runs_beside_it() {
    let cluster = Cluster::start(3);
    let sessions = web::Data::new(Sessions::default());
    let server = server(&cluster, &sessions);

    let (a, b) = tokio::join!(
        tokio::spawn(client(ws_url(&server, "/ws/doc-a?meet=1"))),
        tokio::spawn(client(ws_url(&server, "/ws/doc-b?meet=1")))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
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

/// The frames ending is not the end of the session: one that still owns its
/// handle after closing keeps the lock until it drops it (the rule of
/// redlock-tower, where the response body is empty).
#[actix_web::test]
async fn a_session_that_closed_its_frames_keeps_the_lock_while_it_holds_the_handle() {
    let cluster = Cluster::start(3);
    let sessions = web::Data::new(Sessions::default());
    let server = server(&cluster, &sessions);

    let (status, texts) = client(ws_url(&server, "/ws/doc-l?linger=1")).await;
    assert_eq!(
        (status, texts.as_slice()),
        (101, &["started".to_owned()][..])
    );
    // The server closed the connection: the body has ended.
    assert!(
        cluster.count_with_key("redlock:/ws/doc-l") >= 2,
        "released when the frames ended, while the session still holds its handle"
    );
    sessions.go.notify_one();
    assert!(
        eventually(answered(Duration::ZERO), || sessions
            .held_after_close
            .lock()
            .unwrap()
            .is_some())
        .await,
        "the session finished"
    );
    assert_eq!(
        *sessions.held_after_close.lock().unwrap(),
        Some(true),
        "the handle said lost after the frames ended"
    );
    assert!(
        on_no_node(&cluster, "redlock:/ws/doc-l").await,
        "released once the session dropped its handle"
    );
}
