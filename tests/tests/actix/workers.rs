//! One `Redlock` shared by the workers of a real `HttpServer` (issue 38, item
//! 2): a worker whose handler blocks its thread (`std::thread::sleep` inside
//! its lock) must not fail, stall or delay the locked requests of another
//! worker, whichever worker opened the node connections or took the first
//! guard. Each actix worker is a runtime of its own; the handle keeps its
//! connections, renewals and background calls per runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::{App, HttpResponse, web};
use redlock_actix::RedlockMiddleware;
use redlock_tests::Cluster;

/// The shortest TTL the patient handle renews (two node timeouts).
const TTL: Duration = PATIENT_NODE_TIMEOUT.saturating_mul(2);
/// How long B holds its lock, off its worker's thread (`web::block`): two
/// TTLs, so that its lock must be renewed.
const HOLD: Duration = TTL.saturating_mul(2);
const KEY_B: &str = "redlock:/locked/b";

/// What the handlers tell the test: where each ran, and when A and B are in.
#[derive(Default)]
struct Seen {
    threads: Mutex<Vec<(&'static str, ThreadId)>>,
    a_in: AtomicBool,
    a_done: AtomicBool,
    b_in: AtomicBool,
    /// B's work is over: its lock is released from then on.
    b_done: AtomicBool,
    /// Set by the test to let A's blocked thread go (once B was answered).
    release_a: (Mutex<bool>, Condvar),
}

impl Seen {
    fn ran(&self, who: &'static str) {
        let mut threads = self.threads.lock().unwrap();
        threads.push((who, std::thread::current().id()));
    }

    /// Blocks the calling thread until the test lets A go (bounded, so that a
    /// failing test does not leave a worker stuck for ever).
    fn block_until_released(&self) {
        let (released, cv) = &self.release_a;
        let bound = liveness(HOLD) * 2;
        let released = released.lock().unwrap();
        drop(cv.wait_timeout_while(released, bound, |r| !*r).unwrap());
    }

    /// Lets A's blocked thread go.
    fn release_a(&self) {
        let (released, cv) = &self.release_a;
        *released.lock().unwrap() = true;
        cv.notify_all();
    }

    fn thread(&self, who: &str) -> ThreadId {
        let threads = self.threads.lock().unwrap();
        threads
            .iter()
            .find(|(w, _)| *w == who)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("{who} never ran: {threads:?}"))
    }
}

/// Two workers, one handle, `by_path().ttl(TTL)` on `/locked`: `/locked/a`
/// blocks its thread until the test lets it go (after B's answer),
/// `/locked/b` holds its lock for [`HOLD`] in `web::block`, `/locked/w`
/// returns at once.
fn server(cluster: &Cluster, seen: &Arc<Seen>) -> Server {
    let redlock = cluster.patient_redlock();
    let seen = web::Data::from(Arc::clone(seen));
    serve!(2, move || {
        App::new().app_data(seen.clone()).service(
            web::scope("/locked")
                .wrap(
                    RedlockMiddleware::by_path()
                        .ttl(TTL)
                        .with_redlock(redlock.clone()),
                )
                .route(
                    "/w",
                    web::get().to(|seen: web::Data<Seen>| async move {
                        seen.ran("w");
                        HttpResponse::Ok().finish()
                    }),
                )
                .route(
                    "/a",
                    web::get().to(|seen: web::Data<Seen>| async move {
                        seen.ran("a");
                        seen.a_in.store(true, Ordering::SeqCst);
                        // Blocking work done wrong: this worker's thread is stuck.
                        seen.block_until_released();
                        seen.a_done.store(true, Ordering::SeqCst);
                        HttpResponse::Ok().finish()
                    }),
                )
                .route(
                    "/b",
                    web::get().to(|seen: web::Data<Seen>| async move {
                        seen.ran("b");
                        seen.b_in.store(true, Ordering::SeqCst);
                        web::block(|| std::thread::sleep(HOLD)).await.unwrap();
                        seen.b_done.store(true, Ordering::SeqCst);
                        HttpResponse::Ok().finish()
                    }),
                ),
        )
    })
}

/// Each request on a client of its own: a connection of its own, which actix
/// hands to its workers in turn.
fn spawn_get(url: String) -> actix_web::rt::task::JoinHandle<(Reply, Instant)> {
    actix_web::rt::spawn(async move {
        let reply = get(&client(), &url).await;
        (reply, Instant::now())
    })
}

/// How many nodes hold `key` with a positive TTL left.
fn held_on(cluster: &Cluster, key: &str) -> usize {
    cluster.nodes().iter().filter(|n| n.pttl(key) > 0).count()
}

/// Samples B's key on the nodes every 50 ms until `b` answers; returns the
/// samples read while B's work ran, as (time since B came in, nodes holding it).
async fn sample_until_answered(
    cluster: &Cluster,
    seen: &Seen,
    b: &mut actix_web::rt::task::JoinHandle<(Reply, Instant)>,
) -> ((Reply, Instant), Vec<(Duration, usize)>) {
    assert!(
        eventually(answered(Duration::ZERO), || seen
            .b_in
            .load(Ordering::SeqCst))
        .await,
        "B's handler never ran"
    );
    let b_in = Instant::now();
    let mut samples = Vec::new();
    let end = b_in + CLIENT_TIMEOUT;
    loop {
        tokio::select! {
            done = &mut *b => return (done.unwrap(), samples),
            () = actix_web::rt::time::sleep(ms(50)) => {
                let held = held_on(cluster, KEY_B);
                // Only a sample read before B's work ended counts: the release
                // may come before this task sees B's answer.
                if !seen.b_done.load(Ordering::SeqCst) {
                    samples.push((b_in.elapsed(), held));
                }
                assert!(Instant::now() < end, "B never answered: {samples:?}");
            }
        }
    }
}

/// The scenario: A (first to use the nodes, on one worker) blocks
/// its thread; 200 ms later B, on the other worker, holds its lock for
/// [`HOLD`]. B must get its lock, keep it on the nodes, and answer 200 after
/// [`HOLD`], while A's thread is still blocked (it is let go only then).
#[actix_web::test]
async fn a_blocked_worker_does_not_fail_the_locked_request_of_another() {
    let cluster = Cluster::start(3);
    let seen = Arc::new(Seen::default());
    let server = server(&cluster, &seen);

    let a = spawn_get(server.url("/locked/a"));
    assert!(
        eventually(answered(Duration::ZERO), || seen
            .a_in
            .load(Ordering::SeqCst))
        .await,
        "A's handler never ran"
    );
    actix_web::rt::time::sleep(ms(200)).await;
    let sent = Instant::now();
    let mut b = spawn_get(server.url("/locked/b"));
    let ((reply, answered_at), samples) = {
        // B may be refused before its handler runs: then there is nothing to
        // sample, only the answer to report.
        let refused = tokio::time::timeout(answered(Duration::ZERO), async {
            while !seen.b_in.load(Ordering::SeqCst) {
                if b.is_finished() {
                    return;
                }
                actix_web::rt::time::sleep(ms(5)).await;
            }
        })
        .await;
        if b.is_finished() && !seen.b_in.load(Ordering::SeqCst) {
            let (reply, at) = (&mut b).await.unwrap();
            panic!(
                "B was answered {} after {:?} without running (A's thread blocked): {}",
                reply.status,
                at - sent,
                reply.text()
            );
        }
        assert!(refused.is_ok(), "B's handler never ran");
        sample_until_answered(&cluster, &seen, &mut b).await
    };
    let took = answered_at - sent;
    assert_ne!(
        seen.thread("a"),
        seen.thread("b"),
        "A and B ran on one worker: the scenario needs two"
    );
    assert_eq!(reply.status, 200, "B after {took:?}: {}", reply.text());
    assert!(
        took >= HOLD && !seen.a_done.load(Ordering::SeqCst),
        "B answered after {took:?}, A done: {}",
        seen.a_done.load(Ordering::SeqCst)
    );
    assert!(
        samples.len() >= 10 && samples.iter().all(|&(_, n)| n == 3),
        "B's lock not held on every node while B ran: {samples:?}"
    );
    seen.release_a();
    let (a_reply, _) = within(answered(Duration::ZERO), "A's answer", a)
        .await
        .unwrap();
    // A's thread was blocked past its TTL: what it gets is its own affair,
    // as long as it gets an answer.
    assert!(
        a_reply.status == 200 || a_reply.status == 503,
        "{a_reply:?}"
    );
}

/// B starts first, on a worker other than the one that took the first guard
/// and opened the connections (W's); then A, on W's worker, blocks its
/// thread while B holds its lock. B must answer 200 on time, its lock
/// renewed past the TTL, and its release not wait for A.
#[actix_web::test]
async fn a_worker_that_blocks_later_does_not_stop_the_renewal_or_release_of_another() {
    let cluster = Cluster::start(3);
    let seen = Arc::new(Seen::default());
    let server = server(&cluster, &seen);

    // W opens the node connections and starts the renewal task on its worker.
    let w = get(&client(), &server.url("/locked/w")).await;
    assert_eq!(w.status, 200, "{}", w.text());
    let sent = Instant::now();
    let mut b = spawn_get(server.url("/locked/b"));
    assert!(
        eventually(answered(Duration::ZERO), || seen
            .b_in
            .load(Ordering::SeqCst))
        .await,
        "B's handler never ran"
    );
    let a = spawn_get(server.url("/locked/a"));
    assert!(
        eventually(answered(Duration::ZERO), || seen
            .a_in
            .load(Ordering::SeqCst))
        .await,
        "A's handler never ran"
    );
    let ((reply, answered_at), samples) = sample_until_answered(&cluster, &seen, &mut b).await;
    let took = answered_at - sent;
    assert_eq!(seen.thread("w"), seen.thread("a"), "W and A on one worker");
    assert_ne!(seen.thread("a"), seen.thread("b"), "A and B on one worker");
    assert_eq!(reply.status, 200, "B after {took:?}: {}", reply.text());
    let a_done_at_b = seen.a_done.load(Ordering::SeqCst);
    assert!(
        !a_done_at_b,
        "B answered after {took:?}, only once A's thread was free"
    );
    assert!(
        samples
            .iter()
            .any(|&(t, _)| t > TTL + ms(300) && t < HOLD - ms(100)),
        "no sample past the TTL while B held its lock: {samples:?}"
    );
    assert!(
        samples
            .iter()
            .filter(|&&(t, _)| t < HOLD - ms(100))
            .all(|&(_, n)| n == 3),
        "B's lock not renewed on every node past its {TTL:?} TTL: {samples:?}"
    );
    // The release is not left to A's worker: the key is gone soon after B's
    // answer, while A's thread is still blocked.
    let gone = eventually(timing::settled(), || cluster.count_with_key(KEY_B) == 0).await;
    let a_done_at_gone = seen.a_done.load(Ordering::SeqCst);
    assert!(
        gone && !a_done_at_gone,
        "B's key gone: {gone} ({:?} after B's answer), A's thread free by then: {a_done_at_gone}",
        answered_at.elapsed()
    );
    seen.release_a();
    let (a_reply, _) = within(answered(Duration::ZERO), "A's answer", a)
        .await
        .unwrap();
    assert!(
        a_reply.status == 200 || a_reply.status == 503,
        "{a_reply:?}"
    );
}
