//! How long `RedlockLayer` holds a lock: through a response body streamed for
//! longer than the TTL and no longer (default `ReleasePolicy::BodyEnd`), only up
//! to the response head with `ReleasePolicy::ResponseHead`, and through a handler
//! that runs for several TTLs (auto-extension). A streamed body whose lock is
//! lost is cut off (default `LostPolicy::Abort`), or streams on
//! (`LostPolicy::Signal`); a frame made in the poll in which the lock was lost
//! is never given out.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use crate::common::*;
use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use redlock_core::LockHandle;
use std::sync::Arc;

use axum::extract::State;
use redlock_tests::Cluster;
use redlock_tests::http_timing::Gate;
use redlock_tower::{RedlockLayer, ReleasePolicy};

mod cut_off;

/// Renewals through several TTLs are the subject here, not a slow node: the
/// handles are patient, and the TTL the shortest they renew (two node
/// timeouts).
const TTL: Duration = PATIENT_NODE_TIMEOUT.saturating_mul(2);
const KEY: &str = "redlock:/stream";
/// The stream's pace: a quarter TTL.
const STEP: Duration = Duration::from_millis(TTL.as_millis() as u64 / 4);

/// A body of 11 chunks, the first at once, then, once the gate is open, one
/// every [`STEP`]: two and a half TTLs in all.
async fn stream(State(gate): State<Arc<Gate>>) -> Body {
    let chunks = futures_util::stream::unfold(0u32, move |i| {
        let gate = gate.clone();
        async move {
            if i > 10 {
                return None;
            }
            if i == 1 {
                gate.passed().await;
            }
            if i > 0 {
                tokio::time::sleep(STEP).await;
            }
            Some((
                Ok::<_, Infallible>(Bytes::from(format!("chunk {i}\n"))),
                i + 1,
            ))
        }
    });
    Body::from_stream(chunks)
}

/// The node timeout of the handles here.
fn node_timeout(cluster: &Cluster) -> Duration {
    cluster.patient_redlock().node_timeout()
}

fn stream_app(cluster: &Cluster, layer: RedlockLayer, gate: Arc<Gate>) -> Router {
    Router::new()
        .route("/stream", get(stream))
        .with_state(gate)
        .layer(layer.ttl(TTL))
        .layer(Extension(cluster.patient_redlock()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_body_holds_the_lock_until_its_last_frame_and_no_longer() {
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    gate.open();
    let server = Server::start(stream_app(&cluster, RedlockLayer::by_path(), gate)).await;
    let client = client();
    let url = server.url("/stream");

    let response = open(&client, &url).await;
    assert_eq!(response.status(), StatusCode::OK);
    let head_at = Instant::now();
    let mut body = response.into_body();
    let (mut frames, mut probes) = (0, Vec::new());
    let mut text = String::new();
    while let Some(frame) = within(CLIENT_TIMEOUT, "next frame", body.frame()).await {
        let frame = frame.unwrap();
        if let Some(data) = frame.data_ref() {
            text.push_str(std::str::from_utf8(data).unwrap());
        }
        frames += 1;
        // Probe after chunks 3 and 9: the second past two TTLs, body not
        // done yet.
        if frames == 4 || frames == 10 {
            let elapsed = head_at.elapsed();
            let keys = cluster.count_with_key(KEY);
            let other = http_get(&client, &url).await;
            probes.push((elapsed, keys, other.status));
        }
    }
    let end_at = Instant::now();
    assert!(text.ends_with("chunk 10\n"), "whole body: {text:?}");
    assert!(
        end_at - head_at > TTL * 2,
        "the body must outlast the TTL: {:?}",
        end_at - head_at
    );
    assert_eq!(probes.len(), 2);
    for (elapsed, keys, status) in &probes {
        assert_eq!(
            *status,
            StatusCode::CONFLICT,
            "a request {elapsed:?} into the stream must find the lock busy"
        );
        assert!(
            *keys >= 2,
            "{keys} nodes hold the key {elapsed:?} into the stream"
        );
    }
    assert!(
        probes.iter().any(|(elapsed, ..)| *elapsed > TTL * 2),
        "one probe must come after two TTLs: {probes:?}"
    );

    let settle = timing::settle(node_timeout(&cluster));
    let freed = eventually_at(settle, || cluster.count_with_key(KEY) == 0)
        .await
        .expect("the key must go once the body has ended");
    assert!(
        freed - end_at <= settle,
        "released {:?} after the body's end",
        freed - end_at
    );
    let next = open(&client, &url).await;
    assert_eq!(next.status(), StatusCode::OK, "the lock is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_head_release_frees_the_lock_while_the_body_still_streams() {
    let cluster = Cluster::start(3);
    let layer = RedlockLayer::by_path().release_on(ReleasePolicy::ResponseHead);
    let gate = Arc::new(Gate::default());
    let server = Server::start(stream_app(&cluster, layer, gate.clone())).await;
    let client = client();
    let url = server.url("/stream");

    let response = open(&client, &url).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = within(CLIENT_TIMEOUT, "first frame", body.frame())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.data_ref().map(|b| &b[..]), Some(&b"chunk 0\n"[..]));

    // The body waits at the gate after its first chunk; with the lock held to
    // the body's end the key would stay (renewed) until the test opens it.
    let settle = timing::settle(node_timeout(&cluster));
    let freed = eventually_at(settle, || cluster.count_with_key(KEY) == 0).await;
    assert!(freed.is_some(), "the key must go at the response head");
    let other = open(&client, &url).await;
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "a second request runs while the first body streams"
    );
    drop(other);
    gate.open();

    // The first body was still streaming all along: its remaining chunks arrive.
    let rest = within(CLIENT_TIMEOUT, "rest of the body", body.collect())
        .await
        .unwrap()
        .to_bytes();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.starts_with("chunk 1\n") && rest.ends_with("chunk 10\n"),
        "{rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_running_three_ttls_stays_exclusive_through_auto_extension() {
    let cluster = Cluster::start(3);
    let gate = Arc::new(Gate::default());
    let app = Router::new()
        .route(
            "/long",
            get(
                |State(gate): State<Arc<Gate>>, Extension(lock): Extension<LockHandle>| async move {
                    // Three TTLs at least, and until the test has probed.
                    tokio::time::sleep(TTL * 3 + ms(100)).await;
                    gate.passed().await;
                    format!("extensions={}", lock.extensions())
                },
            ),
        )
        .with_state(gate.clone())
        .layer(RedlockLayer::by_path().ttl(TTL))
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;
    let client = client();
    let url = server.url("/long");

    let long = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { http_get(&client, &url).await }
    });
    assert!(
        on_every_node(&cluster, "redlock:/long").await,
        "the long handler never took the lock"
    );
    let started = Instant::now();
    let mut probes = Vec::new();
    // One probe every ~100 ms while the long handler runs, until five probes
    // and one after two TTLs were made (the handler waits for them), within a
    // liveness bound.
    let end = started + liveness(TTL * 3 + ms(500));
    while !long.is_finished() && Instant::now() < end {
        let reply = http_get(&client, &url).await;
        if long.is_finished() {
            break; // the probe may have raced the release
        }
        probes.push((started.elapsed(), reply.status));
        if probes.len() >= 5 && probes.iter().any(|(t, _)| *t > TTL * 2) {
            break;
        }
        tokio::time::sleep(ms(100)).await;
    }
    gate.open();
    let long = long.await.unwrap();
    assert_eq!(long.status, StatusCode::OK);
    let extensions: u32 = long
        .text()
        .strip_prefix("extensions=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", long.text()));
    assert!(extensions >= 2, "3 TTLs need renewals, saw {extensions}");
    assert!(
        probes.len() >= 5,
        "too few probes during the handler: {probes:?}"
    );
    assert!(
        probes.iter().any(|(t, _)| *t > TTL * 2),
        "no probe after two TTLs: {probes:?}"
    );
    assert!(
        probes.iter().all(|(_, s)| *s == StatusCode::CONFLICT),
        "every request during the handler must be rejected: {probes:?}"
    );
}
