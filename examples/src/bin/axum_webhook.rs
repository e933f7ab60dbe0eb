//! An idempotent webhook receiver: each delivery's work runs once, however often
//! and however concurrently the sender delivers it.
//!
//! ```sh
//! cargo run -p redlock-examples --bin axum_webhook                 # serve on 127.0.0.1:3000
//! cargo run -p redlock-examples --bin axum_webhook -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 3000).
//!
//! `POST /webhooks` with `X-Delivery-Id: <id>`, under
//! `redlock_tower::idempotency::IdempotencyLayer` keyed by that header:
//!
//! - a request without the header gets `400` (problem+json);
//! - a duplicate that arrives while the first copy is being processed gets `409`
//!   with `Retry-After` (senders retry on 409);
//! - once a delivery is processed, its response (status, `content-type`, body)
//!   is recorded on a quorum of the lock's nodes, written only while this
//!   replica still holds the delivery's lock; a later retry gets the same
//!   response byte for byte, with `Idempotent-Replayed: true`, without running
//!   the work again;
//! - the same id with another payload gets `422`; a `5xx` is not recorded, so
//!   the sender's retry runs the work again;
//! - records are kept 4 days: longer than the sender's retry window (Stripe
//!   retries for up to 3 days).
//!
//! `GET /work/{id}` tells how many times the work ran for a delivery (always 0 or 1).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use redlock_core::idempotency::{Idempotency, IdempotencyPolicy, RedisStore};
use redlock_examples::webhooks::{self, DELIVERY_HEADER, RECORD_TTL, WORK_TIME, Webhooks};
use redlock_examples::{Args, BoxError, Nodes, serve};
use redlock_tower::idempotency::IdempotencyLayer;

const DELIVERY: HeaderName = HeaderName::from_static(DELIVERY_HEADER);

/// The work, at most once per delivery id: the layer runs this handler only
/// for a delivery it has no record of, under the delivery's lock.
async fn receive(State(hooks): State<Arc<Webhooks>>, headers: HeaderMap, payload: Bytes) -> String {
    // The layer rejects requests without the header, so it is here.
    let id = headers
        .get(DELIVERY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let done = hooks.record_run(id, payload.len());
    tokio::time::sleep(WORK_TIME).await;
    done
}

async fn work_runs(State(hooks): State<Arc<Webhooks>>, Path(id): Path<String>) -> String {
    format!("{}\n", hooks.runs(&id))
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let hooks = Arc::new(Webhooks::default());

    let idempotency = Idempotency::new(redlock.clone())
        .store(RedisStore::new(redlock).record_ttl(RECORD_TTL))
        .policy(IdempotencyPolicy::default().lock(|l| l.namespace("webhook:")));
    let webhooks = Router::new()
        .route("/webhooks", post(receive))
        .route_layer(IdempotencyLayer::with_engine(idempotency).key_header(DELIVERY));
    let app = Router::new()
        .merge(webhooks)
        .route("/work/{id}", get(work_runs))
        .with_state(hooks.clone());

    let addr = serve(app, args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(webhooks::self_test(&format!("http://{addr}"), &hooks).await);
    }
    println!(
        "\ntry (the work takes {WORK_TIME:?}):\n  \
         curl -i -X POST -H 'X-Delivery-Id: d-1' -d '{{\"event\":\"paid\"}}' http://{addr}/webhooks &\n  \
         sleep 0.3; curl -i -X POST -H 'X-Delivery-Id: d-1' -d '{{\"event\":\"paid\"}}' http://{addr}/webhooks   # 409: in progress\n  \
         wait; curl -i -X POST -H 'X-Delivery-Id: d-1' -d '{{\"event\":\"paid\"}}' http://{addr}/webhooks   # 200, Idempotent-Replayed: true\n  \
         curl -s http://{addr}/work/d-1    # the work ran once\n  \
         curl -i -X POST http://{addr}/webhooks    # 400: no X-Delivery-Id\n\n\
         (records expire after 4 days; with your own REDLOCK_NODES use fresh ids)\n\
         Ctrl-C to stop."
    );
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}
