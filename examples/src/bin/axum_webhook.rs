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

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderMap, HeaderName, Method, StatusCode};
use redlock_core::idempotency::{Idempotency, IdempotencyPolicy, RedisStore};
use redlock_examples::{
    Args, BoxError, Checks, HttpClient, Nodes, Reply, http_client, random_id, send,
    send_retrying_busy, serve,
};
use redlock_tower::idempotency::IdempotencyLayer;

const DELIVERY_HEADER: HeaderName = HeaderName::from_static("x-delivery-id");
const WORK_TIME: Duration = Duration::from_secs(1);
/// How long a processed delivery is remembered: more than the sender retries.
const RECORD_TTL: Duration = Duration::from_secs(4 * 24 * 3600);
/// The body the self-test delivers.
const PAYLOAD: &str = r#"{"event":"invoice.paid"}"#;

#[derive(Default)]
struct Webhooks {
    /// How many times the work ran, per delivery id (for the self-test and
    /// `GET /work/{id}`).
    work_runs: Mutex<HashMap<String, u32>>,
}

/// The work, at most once per delivery id: the layer runs this handler only
/// for a delivery it has no record of, under the delivery's lock.
async fn receive(State(hooks): State<Arc<Webhooks>>, headers: HeaderMap, payload: Bytes) -> String {
    // The layer rejects requests without the header, so it is here.
    let id = headers
        .get(DELIVERY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    *hooks
        .work_runs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(id.clone())
        .or_default() += 1;
    tokio::time::sleep(WORK_TIME).await;
    format!("processed delivery {id}: {} payload bytes\n", payload.len())
}

async fn work_runs(State(hooks): State<Arc<Webhooks>>, Path(id): Path<String>) -> String {
    let runs = hooks.work_runs.lock().unwrap_or_else(|e| e.into_inner());
    format!("{}\n", runs.get(&id).copied().unwrap_or(0))
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
        .route_layer(IdempotencyLayer::with_engine(idempotency).key_header(DELIVERY_HEADER));
    let app = Router::new()
        .merge(webhooks)
        .route("/work/{id}", get(work_runs))
        .with_state(hooks.clone());

    let addr = serve(app, args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(self_test(&format!("http://{addr}"), &hooks).await);
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

async fn deliver(client: &HttpClient, base: &str, id: Option<&str>) -> Result<Reply, BoxError> {
    let headers: Vec<(&str, &str)> = id.map(|id| ("x-delivery-id", id)).into_iter().collect();
    send(
        client,
        Method::POST,
        &format!("{base}/webhooks"),
        &headers,
        PAYLOAD,
    )
    .await
    .map_err(BoxError::from)
}

fn runs(hooks: &Webhooks, id: &str) -> u32 {
    let runs = hooks.work_runs.lock().unwrap_or_else(|e| e.into_inner());
    runs.get(id).copied().unwrap_or(0)
}

async fn self_test(base: &str, hooks: &Webhooks) -> ExitCode {
    let client = http_client();
    let mut checks = Checks::default();
    let status = |r: &Result<Reply, BoxError>| r.as_ref().map(|r| r.status).ok();
    println!("self-test:");

    let missing = deliver(&client, base, None).await;
    checks.check(
        status(&missing) == Some(StatusCode::BAD_REQUEST),
        format!("no X-Delivery-Id: {:?}", status(&missing)),
    );

    // A duplicate while the first copy is processed, then a retry afterwards.
    let id = format!("d-{}", random_id());
    let first = tokio::spawn({
        let (client, base, id) = (client.clone(), base.to_owned(), id.clone());
        async move { deliver(&client, &base, Some(&id)).await }
    });
    tokio::time::sleep(WORK_TIME / 3).await;
    let duplicate = deliver(&client, base, Some(&id)).await;
    checks.check(
        status(&duplicate) == Some(StatusCode::CONFLICT)
            && duplicate
                .as_ref()
                .is_ok_and(|r| r.header("retry-after").is_some()),
        format!(
            "duplicate during processing: {:?} with Retry-After",
            status(&duplicate)
        ),
    );
    let first = first.await.map_err(BoxError::from).and_then(|r| r);
    checks.check(
        status(&first) == Some(StatusCode::OK),
        format!("first delivery: {:?}", status(&first)),
    );
    // Senders retry on 409; the first copy's release may reach Redis a moment
    // after its response reached us, so this retries too (up to 1 s).
    let retry = send_retrying_busy(
        &client,
        Method::POST,
        &format!("{base}/webhooks"),
        &[("x-delivery-id", &id)],
        PAYLOAD,
        20,
        Duration::from_millis(50),
    )
    .await
    .map(|(r, _)| r)
    .map_err(BoxError::from);
    let replayed = retry
        .as_ref()
        .is_ok_and(|r| r.header("idempotent-replayed") == Some("true"));
    let same_result = matches!((&first, &retry), (Ok(a), Ok(b)) if a.body == b.body);
    checks.check(
        status(&retry) == Some(StatusCode::OK) && replayed && same_result,
        format!(
            "retry after completion: {:?}, replayed: {replayed}, same result: {same_result}",
            status(&retry)
        ),
    );
    let other = send(
        &client,
        Method::POST,
        &format!("{base}/webhooks"),
        &[("x-delivery-id", &id)],
        r#"{"event":"something.else"}"#,
    )
    .await
    .map_err(BoxError::from);
    checks.check(
        status(&other) == Some(StatusCode::UNPROCESSABLE_ENTITY),
        format!("same id, other payload: {:?}", status(&other)),
    );
    checks.check(
        runs(hooks, &id) == 1,
        format!("work ran {} time(s) for {id}", runs(hooks, &id)),
    );

    // Five copies at once, then the sender's retries until one gets 200.
    let id = format!("d-{}", random_id());
    let copies = (0..5).map(|_| {
        let (client, base, id) = (client.clone(), base.to_owned(), id.clone());
        tokio::spawn(async move { deliver(&client, &base, Some(&id)).await })
    });
    let statuses: Vec<Option<StatusCode>> = join_all(copies)
        .await
        .into_iter()
        .map(|r| r.ok().and_then(|r| status(&r)))
        .collect();
    let ok = statuses
        .iter()
        .filter(|s| **s == Some(StatusCode::OK))
        .count();
    let busy = statuses
        .iter()
        .filter(|s| **s == Some(StatusCode::CONFLICT))
        .count();
    checks.check(
        ok <= 1 && ok + busy == 5,
        format!("5 simultaneous copies: {ok} x 200, {busy} x 409"),
    );
    let mut retried = None;
    for _ in 0..10 {
        let r = deliver(&client, base, Some(&id)).await;
        if status(&r) == Some(StatusCode::OK) {
            retried = r.ok();
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    checks.check(
        retried.is_some(),
        format!(
            "a retry gets 200 (replayed: {})",
            retried
                .as_ref()
                .and_then(|r| r.header("idempotent-replayed"))
                .unwrap_or("-")
        ),
    );
    checks.check(
        runs(hooks, &id) == 1,
        format!("work ran {} time(s) for {id}", runs(hooks, &id)),
    );
    checks.finish()
}
