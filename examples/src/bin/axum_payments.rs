//! An `Idempotency-Key` API: a client may retry `POST /payments` as often as it
//! likes, and the payment is made once.
//!
//! ```sh
//! cargo run -p redlock-examples --bin axum_payments                 # serve on 127.0.0.1:3000
//! cargo run -p redlock-examples --bin axum_payments -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 3000).
//!
//! `POST /payments` with a JSON body `{"amount": 1250, "currency": "EUR"}`,
//! `Idempotency-Key: "<key>"` (an sf-string, or a bare token) and
//! `X-Client-Id: <client>`, under `redlock_tower::idempotency::IdempotencyLayer`:
//!
//! - the first request with a key makes the payment: `201` with its id;
//! - a retry with the same key and body gets the same response byte for byte,
//!   with `Idempotent-Replayed: true`, and no second payment;
//! - the same key with another body gets `422`; no key gets `400`
//!   (problem+json both); a copy that arrives while the first is in flight gets
//!   `409` with `Retry-After`;
//! - keys are scoped by client, so two clients that happen to pick the same
//!   key each get their own payment and never see the other's.
//!
//! The scope here is the `X-Client-Id` header so the example runs with curl.
//! In production the scope must come from authentication (the principal of a
//! verified API key or token), never from a header the client chooses: a
//! client that can name another's scope can read that client's responses by
//! replaying its keys.
//!
//! `actix_payments` is the same API in actix-web; the two share the ledger and
//! the self-test (`redlock_examples::payments`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header;
use redlock_examples::payments::{self, Answer, CLIENT_HEADER, Ledger};
use redlock_examples::{Args, BoxError, Nodes, serve};
use redlock_tower::idempotency::IdempotencyLayer;

fn respond(answer: Answer) -> Response {
    let content_type = if answer.problem {
        "application/problem+json"
    } else {
        "application/json"
    };
    (
        answer.status,
        [(header::CONTENT_TYPE, content_type)],
        answer.body,
    )
        .into_response()
}

/// Stands in for authentication: a request without a client id is refused
/// before the idempotency layer sees it, so every key has a scope.
async fn require_client(req: Request, next: Next) -> Response {
    if req.headers().contains_key(CLIENT_HEADER) {
        next.run(req).await
    } else {
        respond(payments::unauthorized())
    }
}

/// Makes one payment: the layer runs this only for a key it has no record of
/// in the client's scope, under that key's lock.
async fn pay(State(ledger): State<Arc<Ledger>>, body: Bytes) -> Response {
    respond(ledger.pay(&body))
}

async fn count(State(ledger): State<Arc<Ledger>>) -> String {
    format!("{}\n", ledger.count())
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let ledger = Arc::new(Ledger::default());

    let idempotency = IdempotencyLayer::new(redlock).scope(|parts| {
        parts
            .headers
            .get(CLIENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let routes = Router::new()
        .route("/payments", post(pay))
        .route_layer(idempotency)
        .route_layer(middleware::from_fn(require_client));
    let app = Router::new()
        .merge(routes)
        .route("/payments/count", get(count))
        .with_state(ledger.clone());

    let addr = serve(app, args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(payments::self_test(&format!("http://{addr}"), &ledger).await);
    }
    println!("{}", payments::try_lines(&addr.to_string()));
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}
