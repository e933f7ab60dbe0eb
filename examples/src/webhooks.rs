//! What `axum_webhook` and `actix_webhook` share: the work's bookkeeping,
//! the constants, and the self-test. Each binary keeps only its framework's
//! wiring (the layer or middleware, the handlers, the routes).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::join_all;
use http::{Method, StatusCode};

use crate::{Checks, Reply, http_client, random_id, send, send_retrying_busy};

/// The header that names a delivery.
pub const DELIVERY_HEADER: &str = "x-delivery-id";
/// How long the work takes.
pub const WORK_TIME: Duration = Duration::from_secs(1);
/// How long a processed delivery is remembered: more than the sender retries
/// (Stripe retries for up to 3 days).
pub const RECORD_TTL: Duration = Duration::from_secs(4 * 24 * 3600);
/// The body the self-test delivers.
pub const PAYLOAD: &str = r#"{"event":"invoice.paid"}"#;

/// How many times the work ran, per delivery id (for the self-test and
/// `GET /work/{id}`).
#[derive(Debug, Default)]
pub struct Webhooks {
    work_runs: Mutex<HashMap<String, u32>>,
}

impl Webhooks {
    /// How many times the work ran for `id`.
    pub fn runs(&self, id: &str) -> u32 {
        let runs = self.work_runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.get(id).copied().unwrap_or(0)
    }

    /// Counts one run of the work for `id`, and describes it: the handler's
    /// body, after [`WORK_TIME`] of work that the handler sleeps.
    pub fn record_run(&self, id: &str, payload_len: usize) -> String {
        *self
            .work_runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_default() += 1;
        format!("processed delivery {id}: {payload_len} payload bytes\n")
    }
}

async fn deliver(base: &str, id: Option<&str>, payload: &str) -> Option<Reply> {
    let headers: Vec<(&str, &str)> = id.map(|id| (DELIVERY_HEADER, id)).into_iter().collect();
    send(
        &http_client(),
        Method::POST,
        &format!("{base}/webhooks"),
        &headers,
        payload.to_owned(),
    )
    .await
    .map_err(|e| println!("  ({e})"))
    .ok()
}

fn status(r: &Option<Reply>) -> Option<StatusCode> {
    r.as_ref().map(|r| r.status)
}

/// Fires the example's deliveries at `base` and checks each answer and how
/// often the work ran: 400 without an id, 409 while in flight, a byte-identical
/// replay after, 422 for another payload, one run per delivery.
pub async fn self_test(base: &str, hooks: &Webhooks) -> ExitCode {
    let mut checks = Checks::default();
    println!("self-test:");

    let missing = deliver(base, None, PAYLOAD).await;
    let problem_json = missing
        .as_ref()
        .and_then(|r| r.header("content-type"))
        .is_some_and(|t| t.starts_with("application/problem+json"));
    checks.check(
        status(&missing) == Some(StatusCode::BAD_REQUEST) && problem_json,
        format!(
            "no X-Delivery-Id: {:?}, problem+json: {problem_json}",
            status(&missing)
        ),
    );

    // A duplicate while the first copy is processed, then a retry afterwards.
    let id = format!("d-{}", random_id());
    let first = tokio::spawn({
        let (base, id) = (base.to_owned(), id.clone());
        async move { deliver(&base, Some(&id), PAYLOAD).await }
    });
    tokio::time::sleep(WORK_TIME / 3).await;
    let duplicate = deliver(base, Some(&id), PAYLOAD).await;
    checks.check(
        status(&duplicate) == Some(StatusCode::CONFLICT)
            && duplicate
                .as_ref()
                .is_some_and(|r| r.header("retry-after").is_some()),
        format!(
            "duplicate during processing: {:?} with Retry-After",
            status(&duplicate)
        ),
    );
    let first = first.await.ok().flatten();
    checks.check(
        status(&first) == Some(StatusCode::OK),
        format!("first delivery: {:?}", status(&first)),
    );
    // Senders retry on 409; the first copy's release may reach Redis a moment
    // after its response reached us, so this retries too (up to 1 s).
    let retry = send_retrying_busy(
        &http_client(),
        Method::POST,
        &format!("{base}/webhooks"),
        &[(DELIVERY_HEADER, &id)],
        PAYLOAD,
        20,
        Duration::from_millis(50),
    )
    .await
    .map(|(r, _)| r)
    .ok();
    let replayed = retry
        .as_ref()
        .is_some_and(|r| r.header("idempotent-replayed") == Some("true"));
    let same_bytes = matches!((&first, &retry), (Some(a), Some(b)) if a.body == b.body);
    checks.check(
        status(&retry) == Some(StatusCode::OK) && replayed && same_bytes,
        format!(
            "retry after completion: {:?}, replayed: {replayed}, same bytes: {same_bytes}",
            status(&retry)
        ),
    );
    let other = deliver(base, Some(&id), r#"{"event":"something.else"}"#).await;
    checks.check(
        status(&other) == Some(StatusCode::UNPROCESSABLE_ENTITY),
        format!("same id, other payload: {:?}", status(&other)),
    );
    checks.check(
        hooks.runs(&id) == 1,
        format!("work ran {} time(s) for {id}", hooks.runs(&id)),
    );

    // Five copies at once, then the sender's retries until one gets 200.
    let id = format!("d-{}", random_id());
    let copies = (0..5).map(|_| {
        let (base, id) = (base.to_owned(), id.clone());
        tokio::spawn(async move { deliver(&base, Some(&id), PAYLOAD).await })
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
        let r = deliver(base, Some(&id), PAYLOAD).await;
        if status(&r) == Some(StatusCode::OK) {
            retried = r;
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
        hooks.runs(&id) == 1,
        format!("work ran {} time(s) for {id}", hooks.runs(&id)),
    );
    checks.finish()
}
