//! The web matrix (`web_matrix.rs`) through `redlock-tower`: an axum 0.8
//! router with a `RedlockLayer` per primitive and fencing mode, on one
//! cluster, served by `axum::serve`. A panicking handler ends its
//! connection's task there, which drops the request's future and its lock
//! (what `tower/endings.rs` relies on too); the handler reads its lock with
//! the `Held` extractor, and its token as `Extension<FencingToken>`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use http::HeaderMap;
use redlock_core::Redlock;
use redlock_tests::Cluster;
use redlock_tower::{FencingToken, Held, RedlockLayer};

use super::matrix::{SHAPES, Shape, TTL, assert_hygiene, handle};
use super::web_matrix::{Answer, FENCINGS, Probe, REQUEST, Target, run_cases, template, wait};

async fn handler(
    State(probe): State<Arc<Probe>>,
    Held(lock): Held,
    token: Option<Extension<FencingToken>>,
    headers: HeaderMap,
) -> Response {
    let id = headers.get(REQUEST).and_then(|v| v.to_str().ok());
    let token = token.map(|Extension(t)| t);
    match super::web_matrix::handle(probe, id, lock, token).await {
        Answer::Whole(text) => text.into_response(),
        Answer::Stream(chunks) => Body::from_stream(chunks).into_response(),
    }
}

/// The route of `shape` under `tag`, behind its layer.
fn route(shape: Shape, tag: &str, redlock: Redlock) -> Router<Arc<Probe>> {
    let route = Router::new().route(&template(tag, shape), get(handler).post(handler));
    match shape {
        Shape::MutexOne => route.layer(
            RedlockLayer::by_path()
                .ttl(TTL)
                .wait(wait())
                .with_redlock(redlock),
        ),
        Shape::MutexSet => route.layer(
            RedlockLayer::by_path_params(["from", "to"])
                .ttl(TTL)
                .wait(wait())
                .with_redlock(redlock),
        ),
        Shape::Permits2 => route.layer(
            RedlockLayer::by_path()
                .permits(2)
                .ttl(TTL)
                .wait(wait())
                .with_redlock(redlock),
        ),
        Shape::ReadWrite => route.layer(
            RedlockLayer::by_path()
                .shared_for_safe_methods()
                .ttl(TTL)
                .wait(wait())
                .with_redlock(redlock),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_fencing_and_ending_through_the_layer() {
    let cluster = Cluster::start(3);
    let probe = Arc::new(Probe::default());
    let mut app = Router::new();
    for (fencing, tag) in FENCINGS {
        let redlock = handle(&cluster, fencing);
        for shape in SHAPES {
            app = app.merge(route(shape, tag, redlock.clone()));
        }
    }
    let (base, server) = super::tower::serve(app.with_state(Arc::clone(&probe))).await;
    let addr = base.strip_prefix("http://").unwrap().parse().unwrap();
    run_cases("tower", &Target { addr, probe }).await;
    server.abort();
    assert_hygiene(&cluster, "tower");
}
