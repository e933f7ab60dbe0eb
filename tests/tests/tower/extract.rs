//! `redlock-tower`'s axum ergonomics on real `redis-server` processes: the
//! `Held` extractor (and `Option<Held>` for requests that run unlocked),
//! `on_rejection` with a closure that returns any `IntoResponse`, and wait mode:
//! woken by the holder's release, and with wake-ups off spaced by the policy's
//! own retry, else by the handle's.

use std::time::{Duration, Instant};

use crate::common::*;
use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{HeaderName, Request, StatusCode};
use redlock_core::{LockOptions, Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tower::{Held, RedlockLayer, Rejection};
use tower::ServiceExt;

async fn held(Held(lock): Held) -> String {
    format!("held {} lost={}", lock.key(), lock.is_lost())
}

async fn maybe_held(lock: Option<Held>) -> String {
    lock.map_or_else(|| "unlocked".to_owned(), |l| l.key().to_owned())
}

/// Sends a GET to `app` in-process and returns the status and body text.
async fn get_text(app: &Router, uri: &str, header: Option<(&str, &str)>) -> (StatusCode, String) {
    let mut req = Request::get(uri);
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    let reply = within(
        CLIENT_TIMEOUT,
        "the reply",
        app.clone().oneshot(req.body(Body::empty()).unwrap()),
    )
    .await
    .unwrap();
    let status = reply.status();
    let body = axum::body::to_bytes(reply.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_extractor_gets_the_lock_of_the_request() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/job", get(held))
        .route("/maybe", get(maybe_held))
        .layer(RedlockLayer::by_path().with_redlock(cluster.patient_redlock()));

    let (status, text) = get_text(&app, "/job", None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text, "held redlock:/job lost=false");
    let (status, text) = get_text(&app, "/maybe", None).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "redlock:/maybe"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_held_is_none_for_a_request_without_a_key_and_held_answers_500() {
    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/maybe", get(maybe_held))
        .route("/job", get(held))
        .layer(RedlockLayer::by_header(HeaderName::from_static(
            "x-tenant-id",
        )))
        .layer(Extension(cluster.patient_redlock()));

    let (status, text) = get_text(&app, "/maybe", None).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, "unlocked"),
        "no key: the handler runs unlocked and sees no lock, without a 500"
    );
    let (status, text) = get_text(&app, "/maybe", Some(("x-tenant-id", "acme"))).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, "redlock:x-tenant-id=acme")
    );
    let (status, _) = get_text(&app, "/job", None).await;
    assert_eq!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "a plain `Held` on an unlocked request is a programming error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_held_is_none_for_a_fail_open_request() {
    let cluster = Cluster::start(3);
    let app = Router::new().route("/maybe", get(maybe_held)).layer(
        RedlockLayer::by_path()
            .fail_open()
            .with_redlock(cluster.patient_redlock()),
    );
    let (status, text) = get_text(&app, "/maybe", None).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "redlock:/maybe"));

    cluster.node(1).kill();
    cluster.node(2).kill();
    let (status, text) = get_text(&app, "/maybe", None).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, "unlocked"),
        "no quorum, fail-open: run unlocked, no lock for the extractor, no 500"
    );
}

/// Takes the layer's key for `/job` (`redlock:/job`) first.
async fn take_job_key(redlock: &Redlock) -> redlock_core::Lock {
    redlock
        .mutex("redlock:/job")
        .try_acquire(Duration::from_secs(5))
        .await
        .expect("the test takes the key first")
}

/// Holds the layer's key for `/job` for `hold`, then releases it (a sleep of
/// the scenario: what is asserted of it holds however late the release runs).
async fn hold_job_key(redlock: &Redlock, hold: Duration) -> tokio::task::JoinHandle<()> {
    let lock = take_job_key(redlock).await;
    let redlock = redlock.clone();
    tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        redlock.unlock(lock).await.unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rejection_takes_a_closure_returning_status_and_string() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let app = Router::new().route("/job", get(held)).layer(
        RedlockLayer::by_path()
            .with_redlock(redlock.clone())
            .on_rejection(|rejection: &Rejection| {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "custom {}: {}",
                        rejection.status().as_u16(),
                        rejection.key().unwrap_or("-")
                    ),
                )
            }),
    );
    // Held until the request was answered.
    let lock = take_job_key(&redlock).await;

    let (status, text) = get_text(&app, "/job", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(text, "custom 409: redlock:/job");
    redlock.unlock(lock).await.unwrap();
}

/// How long a waiting request to `/job` takes while the key is held for 300 ms.
async fn wait_for_busy_key(redlock: &Redlock, layer: RedlockLayer) -> (StatusCode, Duration) {
    let app = Router::new().route("/job", get(held)).layer(layer);
    let holder = hold_job_key(redlock, HOLD).await;
    let started = Instant::now();
    let (status, text) = get_text(&app, "/job", None).await;
    let took = started.elapsed();
    holder.await.unwrap();
    assert!(
        status != StatusCode::OK || text == "held redlock:/job lost=false",
        "{text}"
    );
    (status, took)
}

/// How long the holder of [`wait_for_busy_key`] keeps the key.
const HOLD: Duration = Duration::from_millis(300);

/// The retry delay of the tests that tell a wake-up (or a short delay) from
/// this delay: longer than the liveness bound of a request that waits out
/// [`HOLD`], so that only the wake-up (or the short delay) can answer within
/// that bound, however loaded the machine.
fn long_delay() -> Duration {
    answered(HOLD) * 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_is_woken_by_the_release_before_its_fallback_poll() {
    let cluster = Cluster::start(3);
    let slow = RetryPolicy::default()
        .with_delay(long_delay())
        .with_jitter(Duration::ZERO);
    // Wake-ups on (the default): the long delay is only the safety-net poll;
    // the holder's release at 300 ms wakes the waiting request.
    let plain = cluster.patient_redlock();
    let (status, took) = wait_for_busy_key(
        &plain,
        RedlockLayer::by_path().with_redlock(plain.clone()).options(
            LockOptions::new(Duration::from_secs(5)).retry(slow.with_deadline(long_delay() * 2)),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        took >= HOLD - ms(50) && took < answered(HOLD),
        "woken by the release at 300 ms, not by the {:?} poll: {took:?}",
        long_delay()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_retries_with_the_policy_s_retry_else_the_handle_s() {
    let cluster = Cluster::start(3);
    let slow = RetryPolicy::default()
        .with_delay(Duration::from_millis(1500))
        .with_jitter(Duration::ZERO);
    // Polling handles (wake-ups off), so that the delays are what spaces the
    // attempts.
    let polling = |retry: Option<RetryPolicy>| {
        let mut b = Redlock::builder()
            .urls(cluster.urls())
            .node_timeout(PATIENT_NODE_TIMEOUT)
            .wake_on_release(false);
        if let Some(r) = retry {
            b = b.retry(r);
        }
        b.build().unwrap()
    };
    // A deadline (or wait) that outlasts the holder's 300 ms and one more
    // 1.5 s delay: a liveness bound.
    let deadline = answered(HOLD + ms(1500));

    // The policy's own retry: its 1.5 s delay spaces the attempts, so the
    // second attempt comes long after the holder left at 300 ms.
    let plain = polling(None);
    let (status, took) = wait_for_busy_key(
        &plain,
        RedlockLayer::by_path().with_redlock(plain.clone()).options(
            LockOptions::new(Duration::from_secs(5)).retry(slow.clone().with_deadline(deadline)),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "options with a retry wait");
    assert!(
        took >= Duration::from_millis(1400),
        "the policy's delay: {took:?}"
    );

    // Its attempt cap too: two quick attempts, then busy, while the key is
    // held (until the request was answered). Node 0 counts the attempts.
    let app = Router::new().route("/job", get(held)).layer(
        RedlockLayer::by_path().with_redlock(plain.clone()).options(
            LockOptions::new(Duration::from_secs(5)).retry(
                RetryPolicy::attempts(2)
                    .with_delay(Duration::from_millis(20))
                    .with_jitter(Duration::ZERO),
            ),
        ),
    );
    let lock = take_job_key(&plain).await;
    let monitor = cluster.node(0).monitor();
    let (status, text) = get_text(&app, "/job", None).await;
    let attempts = monitor
        .stop()
        .iter()
        .filter(|l| !l.contains(" lua]"))
        .filter_map(|l| redlock_tests::monitor::parse_monitor_line(l))
        .filter(|c| {
            c.len() == 6
                && c[0].eq_ignore_ascii_case("SET")
                && c[1] == "redlock:/job"
                && c[3].eq_ignore_ascii_case("NX")
        })
        .count();
    plain.unlock(lock).await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(attempts, 2, "two attempts, no more");

    // No retry in the policy: `wait` spaces attempts by the handle's delays...
    let slow_handle = polling(Some(slow));
    let (status, took) = wait_for_busy_key(
        &slow_handle,
        RedlockLayer::by_path()
            .with_redlock(slow_handle.clone())
            .wait(deadline),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        took >= Duration::from_millis(1400),
        "the handle's delay: {took:?}"
    );

    // ...unless the policy sets its own (the handle's delay here is longer
    // than the liveness bound, so only the policy's can answer within it).
    let long_handle = polling(Some(
        RetryPolicy::default()
            .with_delay(long_delay())
            .with_jitter(Duration::ZERO),
    ));
    let (status, took) = wait_for_busy_key(
        &long_handle,
        RedlockLayer::by_path()
            .with_redlock(long_handle.clone())
            .wait(long_delay() * 2)
            .retry_delay(Duration::from_millis(20), Duration::ZERO),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        took < answered(HOLD),
        "the policy's retry_delay, not the handle's {:?}: {took:?}",
        long_delay()
    );
}
