//! A streamed body whose lock is lost is cut off (or, in signal mode, runs to its end), at the loss and not at its next chunk.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use http_body_util::BodyExt;
use redlock_core::LockHandle;
use redlock_tests::Cluster;
use redlock_tests::http::{AcrossTheLoss, chunk_made_across_the_loss};
use redlock_tower::{LostPolicy, RedlockLayer};

/// The TTL of the loss tests: short, so that the renewal that finds the lock
/// gone comes soon after it was taken away.
pub(super) const LOSS_TTL: Duration = Duration::from_millis(500);
/// 60 chunks, one every 50 ms: a body of about 3 s.
pub(super) const LONG_CHUNKS: usize = 60;
/// The stalled stream: this many chunks, then a pause of [`STALL`], then one.
pub(super) const STALLED_CHUNKS: usize = 6;
pub(super) const STALL: Duration = Duration::from_secs(8);

/// What the long stream's handler shares with the test.
#[derive(Default)]
pub(super) struct Producer {
    pub(super) produced: Arc<AtomicUsize>,
    pub(super) handle: Mutex<Option<LockHandle>>,
}

pub(super) async fn long_stream(
    State(p): State<Arc<Producer>>,
    Extension(lock): Extension<LockHandle>,
) -> Body {
    *p.handle.lock().unwrap() = Some(lock);
    Body::from_stream(counted_chunks(LONG_CHUNKS, ms(50), p.produced.clone()))
}

/// [`STALLED_CHUNKS`] chunks 50 ms apart, then nothing for [`STALL`], then one
/// more: a producer that keeps its body waiting.
pub(super) async fn stalled_stream(
    State(p): State<Arc<Producer>>,
    Extension(lock): Extension<LockHandle>,
) -> Body {
    *p.handle.lock().unwrap() = Some(lock);
    let produced = p.produced.clone();
    let last = futures_util::stream::once(async move {
        tokio::time::sleep(STALL).await;
        produced.fetch_add(1, Ordering::SeqCst);
        Ok(Bytes::from("after the stall\n"))
    });
    Body::from_stream(counted_chunks(STALLED_CHUNKS, ms(50), p.produced.clone()).chain(last))
}

/// How a stream went when its lock was taken away while it streamed.
pub(super) struct AfterLoss {
    pub(super) key: String,
    pub(super) received: Received,
    /// When another holder took the key on every node.
    pub(super) stolen_at: Instant,
    /// Chunks the handler's stream made before the holder saw the loss.
    pub(super) produced_at_loss: usize,
    /// Chunks it made after that, up to 300 ms after the client's end.
    pub(super) produced_after_loss: usize,
    pub(super) cluster: Cluster,
}

/// Serves the stream at `path` under `layer` (TTL [`LOSS_TTL`]), and once a few
/// chunks have arrived, sets the key to another holder's token on every node:
/// the next renewal finds the lock gone.
pub(super) async fn stream_and_take_the_lock_away(layer: RedlockLayer, path: &str) -> AfterLoss {
    let key = format!("redlock:{path}");
    let cluster = Cluster::start(3);
    let producer = Arc::new(Producer::default());
    let app = Router::new()
        .route("/long-stream", get(long_stream))
        .route("/stalled-stream", get(stalled_stream))
        .with_state(producer.clone())
        .layer(layer.ttl(LOSS_TTL))
        .layer(Extension(short_ttl_redlock(&cluster)));
    let server = Server::start(app).await;

    let response = open(&client(), &server.url(path)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let reader = tokio::spawn(receive(response.into_body()));
    assert!(
        eventually(answered(ms(250)), || producer
            .produced
            .load(Ordering::SeqCst)
            >= 5)
        .await,
        "the stream never got going"
    );
    // The lock holds (a quorum has the key). Every node is not promised: with
    // the short node timeout this TTL needs, a slow node's SET or renewal may
    // have missed (seen under load); the theft below covers every node.
    let holding = cluster.settled_count(&key, cluster.len()).await;
    assert!(holding >= 2, "held on a quorum: {holding} of 3");
    let handle = producer.handle.lock().unwrap().clone().unwrap();

    for i in 0..cluster.len() {
        cluster
            .node(i)
            .cmd(&["SET", &key, "another-holder", "PX", "30000"]);
    }
    let stolen_at = Instant::now();
    assert!(
        eventually(liveness(LOSS_TTL), || handle.is_lost()).await,
        "the holder never saw the loss"
    );
    let produced_at_loss = producer.produced.load(Ordering::SeqCst);
    let total = if path == "/stalled-stream" {
        STALLED_CHUNKS + 1
    } else {
        LONG_CHUNKS
    };
    assert!(
        produced_at_loss < total,
        "the stream was over before the loss was seen"
    );

    let received = within(STALL * 2, "the client's end", reader).await.unwrap();
    tokio::time::sleep(ms(300)).await;
    let produced_after_loss = producer.produced.load(Ordering::SeqCst) - produced_at_loss;
    AfterLoss {
        key,
        received,
        stolen_at,
        produced_at_loss,
        produced_after_loss,
        cluster,
    }
}

/// Checks that the body of `run` was cut off at the loss.
pub(super) async fn assert_cut_off(run: AfterLoss) {
    let received = &run.received;
    let after = received.ended_at - run.stolen_at;
    println!(
        "client end {after:?} after the loss, {} chunks received, {} made before the \
         loss was seen and {} after, error: {:?}",
        received.chunks(),
        run.produced_at_loss,
        run.produced_after_loss,
        received.error
    );
    assert!(
        received.error.is_some(),
        "the body must be cut off (an aborted response), but it ended cleanly {after:?} \
         after the loss with {} chunks, {} of them made after the loss",
        received.chunks(),
        run.produced_after_loss
    );
    assert!(
        after <= liveness(LOSS_TTL),
        "the body went on for {after:?} after the loss"
    );
    assert!(
        run.produced_after_loss <= 1,
        "{} chunks were made after the loss was seen",
        run.produced_after_loss
    );
    assert!(
        received.chunks() <= run.produced_at_loss + 1,
        "the client got {} chunks, {} were made before the loss",
        received.chunks(),
        run.produced_at_loss
    );
    // The release after the cut is a compare-and-delete: the new holder keeps
    // its key.
    tokio::time::sleep(ms(300)).await;
    for i in 0..run.cluster.len() {
        assert_eq!(
            run.cluster.node(i).get(&run.key).as_deref(),
            Some("another-holder")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn streamed_body_is_cut_off_when_its_lock_is_lost() {
    assert_cut_off(stream_and_take_the_lock_away(RedlockLayer::by_path(), "/long-stream").await)
        .await;
}

/// A body waiting on its producer is woken by the loss: it is cut off then,
/// not when the producer next yields ([`STALL`] later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn stalled_streamed_body_is_cut_off_at_the_loss_not_at_its_next_chunk() {
    assert_cut_off(stream_and_take_the_lock_away(RedlockLayer::by_path(), "/stalled-stream").await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn signal_mode_lets_a_streamed_body_run_to_its_end_after_a_loss() {
    let run = stream_and_take_the_lock_away(
        RedlockLayer::by_path().on_lost(LostPolicy::Signal),
        "/long-stream",
    )
    .await;
    let received = &run.received;
    assert_eq!(received.error, None, "the body must end cleanly");
    assert_eq!(received.chunks(), LONG_CHUNKS, "{:?}", received.text);
    assert!(
        received
            .text
            .ends_with(&format!("chunk {}\n", LONG_CHUNKS - 1))
    );
    assert_eq!(
        run.produced_at_loss + run.produced_after_loss,
        LONG_CHUNKS,
        "the handler's stream made every chunk"
    );
}

/// A chunk made in the poll in which the lock was lost (its producer blocked
/// the runtime's only thread, so no renewal ran, until the clock ran the lock
/// out) is not given out: the body is cut off instead, as a handler that
/// finishes after the loss gets no answer but 503. The body is read in
/// process, frame by frame, so what it gives out is what the test sees.
#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_chunk_made_in_the_poll_in_which_the_lock_was_lost_is_not_given_out() {
    use tower::{Layer, Service, ServiceExt};

    let cluster = Cluster::start(3);
    let state = Arc::new(AcrossTheLoss::default());
    let handler = tower::service_fn({
        let state = state.clone();
        move |req: http::Request<Body>| {
            let state = state.clone();
            async move {
                let lock = req.extensions().get::<LockHandle>().cloned();
                let body = chunk_made_across_the_loss(lock.expect("the lock's handle"), state);
                Ok::<_, Infallible>(http::Response::new(Body::from_stream(body)))
            }
        }
    });
    let mut service = RedlockLayer::by_path()
        .ttl(LOSS_TTL)
        .with_redlock(short_ttl_redlock(&cluster))
        .layer(handler);
    let request = http::Request::get("/across").body(Body::empty()).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "before the loss\n");

    let second = within(liveness(LOSS_TTL), "the second frame", body.frame()).await;
    assert!(
        state.made_after_the_loss.load(Ordering::SeqCst),
        "the producer never saw the loss"
    );
    match second {
        Some(Ok(frame)) => panic!(
            "a frame made after the loss was given out: {:?}",
            frame.into_data()
        ),
        Some(Err(error)) => assert!(
            matches!(
                error.downcast_ref::<redlock_core::Error>(),
                Some(redlock_core::Error::Lost { .. })
            ),
            "{error}"
        ),
        None => panic!("the body ended cleanly after the loss"),
    }
}

/// A body of one frame, made in its first poll, which blocks its thread until
/// `lock` is lost (checked every 5 ms, for at most 10 s); it reports its end
/// with that frame, as an in-memory body does.
pub(super) struct WholeAfterTheLoss {
    pub(super) lock: LockHandle,
    pub(super) state: Arc<AcrossTheLoss>,
    pub(super) done: bool,
}

impl hyper::body::Body for WholeAfterTheLoss {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        if self.done {
            return std::task::Poll::Ready(None);
        }
        self.done = true;
        let started = Instant::now();
        while !self.lock.is_lost() && started.elapsed() < liveness(LOSS_TTL) {
            std::thread::sleep(ms(5));
        }
        let lost = self.lock.is_lost();
        self.state.made_after_the_loss.store(lost, Ordering::SeqCst);
        let frame = hyper::body::Frame::data(Bytes::from("made after the loss\n"));
        std::task::Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The same for a body whose one poll (the layer's, before the head) makes
/// its whole content past the deadline: it is not given out, though the lock
/// was released at once, as for any whole body; and as the head has not gone
/// out, the answer is the loss's 503.
#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_whole_body_made_in_the_poll_in_which_the_lock_was_lost_is_not_given_out() {
    use tower::{Layer, Service, ServiceExt};

    let cluster = Cluster::start(3);
    let state = Arc::new(AcrossTheLoss::default());
    let handler = tower::service_fn({
        let state = state.clone();
        move |req: http::Request<Body>| {
            let state = state.clone();
            async move {
                let lock = req.extensions().get::<LockHandle>().cloned();
                let body = WholeAfterTheLoss {
                    lock: lock.expect("the lock's handle"),
                    state,
                    done: false,
                };
                Ok::<_, Infallible>(http::Response::new(body))
            }
        }
    });
    let mut service = RedlockLayer::by_path()
        .ttl(LOSS_TTL)
        .with_redlock(short_ttl_redlock(&cluster))
        .layer(handler);
    let request = http::Request::get("/whole").body(Body::empty()).unwrap();
    let response = within(
        liveness(LOSS_TTL),
        "the response",
        service.ready().await.unwrap().call(request),
    )
    .await
    .unwrap();
    assert!(
        state.made_after_the_loss.load(Ordering::SeqCst),
        "the body never saw the loss"
    );
    let (head, body) = response.into_parts();
    let body = within(liveness(LOSS_TTL), "the body", body.collect())
        .await
        .map(|body| String::from_utf8_lossy(&body.to_bytes()).into_owned());
    assert_eq!(
        head.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the head has not gone out: the answer is the loss's ({body:?})"
    );
    let body = body.unwrap();
    assert!(!body.contains("made after the loss"), "{body}");
    assert!(body.contains("Lock lost"), "{body}");
}

/// Issue 18 item 2, through the layer: a handler clones its `Held` handle into
/// a spawned task and answers `202`. Once the response is done the layer has
/// released the lock, and the task's handle must say so. Before the fix it
/// still said "held" (`is_lost() == false`, most of the TTL `remaining()`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_handle_kept_by_a_spawned_task_stops_saying_held_after_the_response() {
    use redlock_tower::Held;
    use tokio::sync::{Notify, mpsc};

    type Report = mpsc::UnboundedSender<(bool, Duration)>;
    let cluster = Cluster::start(3);
    let go = Arc::new(Notify::new());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/jobs/{id}",
            axum::routing::post(
                |Held(lock): Held, State((go, tx)): State<(Arc<Notify>, Report)>| async move {
                    tokio::spawn(async move {
                        go.notified().await;
                        let _ = tx.send((lock.is_lost(), lock.remaining()));
                    });
                    StatusCode::ACCEPTED
                },
            ),
        )
        .with_state((Arc::clone(&go), tx))
        .layer(
            RedlockLayer::by_path()
                .ttl(Duration::from_secs(10))
                .with_redlock(cluster.patient_redlock()),
        );
    let server = Server::start(app).await;
    let client = client();
    let reply = within(
        CLIENT_TIMEOUT,
        "the 202",
        redlock_tests::http::send(
            &client,
            http::Method::POST,
            &server.url("/jobs/7"),
            &[],
            Bytes::new(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    // The response is done: the layer released the lock.
    assert!(on_no_node(&cluster, "redlock:/jobs/7").await);
    go.notify_one();
    let (lost, remaining) = within(CLIENT_TIMEOUT, "the task's report", rx.recv())
        .await
        .unwrap();
    assert!(
        lost && remaining == Duration::ZERO,
        "the spawned task's handle says it holds a released lock: is_lost={lost}, remaining={remaining:?}"
    );
}
