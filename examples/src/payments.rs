//! What `axum_payments` and `actix_payments` share: the ledger the handler
//! writes, the request's validation, and the self-test. Each binary keeps only
//! its framework's wiring (the layer or middleware, the scope, the routes).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{Checks, Reply, http_client, random_id, send_retrying_busy};

/// The header that stands in for authentication in the examples: the scope of
/// every key.
pub const CLIENT_HEADER: &str = "x-client-id";

/// The payments made, by id.
#[derive(Debug, Default)]
pub struct Ledger {
    payments: Mutex<HashMap<String, Value>>,
}

/// An answer for the client: a status and a JSON body.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// `application/problem+json` when true, else `application/json`.
    pub problem: bool,
    /// The body.
    pub body: String,
}

/// A problem+json answer.
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Answer {
    Answer {
        status,
        problem: true,
        body: json!({ "type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail })
            .to_string(),
    }
}

/// The answer to a request without a client id.
pub fn unauthorized() -> Answer {
    problem(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "X-Client-Id is required (in production: your API credentials)",
    )
}

impl Ledger {
    /// How many payments were made.
    pub fn count(&self) -> usize {
        self.payments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Makes one payment from a JSON body `{"amount": 1250, "currency":
    /// "EUR"}`: `201` with the payment, or `422` for a body that is not one.
    /// The idempotency layer runs this only for a key it has no record of in
    /// the client's scope, under that key's lock.
    pub fn pay(&self, body: &[u8]) -> Answer {
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
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
        self.payments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, payment.clone());
        Answer {
            status: StatusCode::CREATED,
            problem: false,
            body: payment.to_string(),
        }
    }
}

/// The curl lines a program prints when it serves.
pub fn try_lines(addr: &str) -> String {
    let pay = format!(
        "curl -i -X POST -H 'X-Client-Id: acme' -H 'Content-Type: application/json' \
         http://{addr}/payments"
    );
    format!(
        "\ntry:\n  \
         {pay} -H 'Idempotency-Key: \"k-1\"' -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'   # 201\n  \
         {pay} -H 'Idempotency-Key: \"k-1\"' -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'   # same bytes, Idempotent-Replayed: true\n  \
         {pay} -H 'Idempotency-Key: \"k-1\"' -d '{{\"amount\":9999,\"currency\":\"EUR\"}}'   # 422\n  \
         {pay} -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'   # 400: no Idempotency-Key\n  \
         curl -s http://{addr}/payments/count\n\n\
         (records expire after 24 h; with your own REDLOCK_NODES use fresh keys)\n\
         Ctrl-C to stop."
    )
}

/// One `POST /payments`, retried on 409 as a client would (a copy still in
/// flight), up to 1 s.
async fn post_payment(
    base: &str,
    client: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> Option<Reply> {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(client.map(|c| (CLIENT_HEADER, c)));
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

/// Fires the example's requests at `base` and checks each answer and the
/// ledger: one payment per (client, key), replays byte for byte, 422, 400,
/// 401, and scopes that do not see each other.
pub async fn self_test(base: &str, ledger: &Ledger) -> ExitCode {
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
