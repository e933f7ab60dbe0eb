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

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderName, Method, StatusCode, header};
use redlock_examples::{
    Args, BoxError, Checks, Nodes, Reply, http_client, random_id, send_retrying_busy, serve,
};
use redlock_tower::idempotency::IdempotencyLayer;
use serde_json::{Value, json};

const CLIENT_HEADER: HeaderName = HeaderName::from_static("x-client-id");

/// The payments made, by id (for the self-test and `GET /payments/count`).
#[derive(Default)]
struct Ledger {
    payments: Mutex<HashMap<String, Value>>,
}

impl Ledger {
    fn count(&self) -> usize {
        self.payments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        json!({ "type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail })
            .to_string(),
    )
        .into_response()
}

/// Stands in for authentication: a request without a client id is refused
/// before the idempotency layer sees it, so every key has a scope.
async fn require_client(req: Request, next: Next) -> Response {
    if req.headers().contains_key(CLIENT_HEADER) {
        next.run(req).await
    } else {
        problem(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "X-Client-Id is required (in production: your API credentials)",
        )
    }
}

/// Makes one payment: the layer runs this only for a key it has no record of
/// in the client's scope, under that key's lock.
async fn pay(State(ledger): State<Arc<Ledger>>, body: Json<Value>) -> Response {
    let amount = body
        .get("amount")
        .and_then(Value::as_u64)
        .filter(|a| *a > 0);
    let currency = body
        .get("currency")
        .and_then(Value::as_str)
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()));
    let (Some(amount), Some(currency)) = (amount, currency) else {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid payment",
            "amount must be a positive integer (minor units), currency an ISO 4217 code",
        );
    };
    let id = format!("pay_{}", random_id());
    let payment =
        json!({ "id": id, "amount": amount, "currency": currency, "status": "succeeded" });
    ledger
        .payments
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, payment.clone());
    (StatusCode::CREATED, Json(payment)).into_response()
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
    let payments = Router::new()
        .route("/payments", post(pay))
        .route_layer(idempotency)
        .route_layer(middleware::from_fn(require_client));
    let app = Router::new()
        .merge(payments)
        .route("/payments/count", get(count))
        .with_state(ledger.clone());

    let addr = serve(app, args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(self_test(&format!("http://{addr}"), &ledger).await);
    }
    let pay = format!(
        "curl -i -X POST -H 'X-Client-Id: acme' -H 'Content-Type: application/json' \
         http://{addr}/payments"
    );
    println!(
        "\ntry:\n  \
         {pay} -H 'Idempotency-Key: \"k-1\"' -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'   # 201\n  \
         {pay} -H 'Idempotency-Key: \"k-1\"' -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'   # same bytes, Idempotent-Replayed: true\n  \
         {pay} -H 'Idempotency-Key: \"k-1\"' -d '{{\"amount\":9999,\"currency\":\"EUR\"}}'   # 422\n  \
         {pay} -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'   # 400: no Idempotency-Key\n  \
         curl -s http://{addr}/payments/count\n\n\
         (records expire after 24 h; with your own REDLOCK_NODES use fresh keys)\n\
         Ctrl-C to stop."
    );
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}

/// One `POST /payments`, retried on 409 as a client would (a copy still in
/// flight, or its lock's release not yet on the nodes), up to 1 s.
async fn post_payment(
    base: &str,
    client: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> Option<Reply> {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(client.map(|c| ("x-client-id", c)));
    headers.extend(key.map(|k| ("idempotency-key", k)));
    send_retrying_busy(
        &http_client(),
        Method::POST,
        &format!("{base}/payments"),
        &headers,
        body.to_owned(),
        20,
        Duration::from_millis(50),
    )
    .await
    .map(|(reply, _)| reply)
    .map_err(|e| println!("  ({e})"))
    .ok()
}

fn status(r: &Option<Reply>) -> Option<StatusCode> {
    r.as_ref().map(|r| r.status)
}

fn payment_id(r: &Option<Reply>) -> Option<String> {
    let body: Value = serde_json::from_slice(&r.as_ref()?.body).ok()?;
    body.get("id")?.as_str().map(str::to_owned)
}

async fn self_test(base: &str, ledger: &Ledger) -> ExitCode {
    let mut checks = Checks::default();
    let body = r#"{"amount":1250,"currency":"EUR"}"#;
    // An sf-string key, fresh per run so earlier runs' records do not answer.
    let key = format!("\"{}\"", random_id());
    println!("self-test (key {key}):");

    let first = post_payment(base, Some("acme"), Some(&key), body).await;
    let first_id = payment_id(&first);
    checks.check(
        status(&first) == Some(StatusCode::CREATED) && first_id.is_some(),
        format!("first call: {:?}, payment {first_id:?}", status(&first)),
    );

    let retry = post_payment(base, Some("acme"), Some(&key), body).await;
    let same_bytes = matches!((&first, &retry), (Some(a), Some(b)) if a.body == b.body);
    let replayed = retry
        .as_ref()
        .and_then(|r| r.header("idempotent-replayed"))
        .unwrap_or("-");
    checks.check(
        status(&retry) == Some(StatusCode::CREATED) && same_bytes && replayed == "true",
        format!(
            "retry, same key and body: {:?}, same bytes: {same_bytes}, Idempotent-Replayed: {replayed}",
            status(&retry)
        ),
    );

    let other = post_payment(
        base,
        Some("acme"),
        Some(&key),
        r#"{"amount":9999,"currency":"EUR"}"#,
    )
    .await;
    checks.check(
        status(&other) == Some(StatusCode::UNPROCESSABLE_ENTITY),
        format!("same key, other body: {:?}", status(&other)),
    );

    let keyless = post_payment(base, Some("acme"), None, body).await;
    let problem_json = keyless
        .as_ref()
        .and_then(|r| r.header("content-type"))
        .is_some_and(|t| t.starts_with("application/problem+json"));
    checks.check(
        status(&keyless) == Some(StatusCode::BAD_REQUEST) && problem_json,
        format!(
            "no key: {:?}, problem+json: {problem_json}",
            status(&keyless)
        ),
    );

    // A bare token is a key too.
    let token = format!("tok-{}", random_id());
    let bare = post_payment(base, Some("acme"), Some(&token), body).await;
    checks.check(
        status(&bare) == Some(StatusCode::CREATED),
        format!("bare-token key: {:?}", status(&bare)),
    );

    let globex = post_payment(base, Some("globex"), Some(&key), body).await;
    let globex_id = payment_id(&globex);
    let own = globex
        .as_ref()
        .and_then(|r| r.header("idempotent-replayed"))
        .is_none();
    checks.check(
        status(&globex) == Some(StatusCode::CREATED)
            && globex_id.is_some()
            && globex_id != first_id
            && own,
        format!(
            "another client, same key: {:?}, its own payment {globex_id:?} (not replayed: {own})",
            status(&globex)
        ),
    );

    let anonymous = post_payment(base, None, Some(&key), body).await;
    checks.check(
        status(&anonymous) == Some(StatusCode::UNAUTHORIZED),
        format!("no client id: {:?}", status(&anonymous)),
    );

    checks.check(
        ledger.count() == 3,
        format!(
            "payments made: {} (acme's key, acme's token, globex's key)",
            ledger.count()
        ),
    );
    checks.finish()
}
