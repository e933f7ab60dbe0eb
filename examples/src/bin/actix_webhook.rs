//! An idempotent webhook receiver in actix-web, the twin of `axum_webhook`:
//! each delivery's work runs once, however often and however concurrently the
//! sender delivers it.
//!
//! ```sh
//! cargo run -p redlock-examples --bin actix_webhook                 # serve on 127.0.0.1:8080
//! cargo run -p redlock-examples --bin actix_webhook -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 8080).
//!
//! `POST /webhooks` with `X-Delivery-Id: <id>`, under
//! `redlock_actix::idempotency::IdempotencyMiddleware` keyed by that header
//! (wrapped on the `/webhooks` resource only, so `GET /work/{id}` is not keyed):
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
use std::sync::Mutex;
use std::time::Duration;

use actix_web::http::header::HeaderName;
use actix_web::{App, HttpRequest, HttpServer, web};
use bytes::Bytes;
use futures_util::future::join_all;
use http::{Method, StatusCode};
use redlock_actix::idempotency::{
    Idempotency, IdempotencyMiddleware, IdempotencyPolicy, RedisStore,
};
use redlock_examples::{
    Args, BoxError, Checks, Nodes, Reply, http_client, random_id, send, send_retrying_busy,
};

const DELIVERY_HEADER: &str = "x-delivery-id";
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

impl Webhooks {
    fn runs(&self, id: &str) -> u32 {
        let runs = self.work_runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.get(id).copied().unwrap_or(0)
    }
}

/// The work, at most once per delivery id: the middleware runs this handler
/// only for a delivery it has no record of, under the delivery's lock.
async fn receive(req: HttpRequest, hooks: web::Data<Webhooks>, payload: Bytes) -> String {
    // The middleware rejects requests without the header, so it is here.
    let id = req
        .headers()
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
    actix_web::rt::time::sleep(WORK_TIME).await;
    format!("processed delivery {id}: {} payload bytes\n", payload.len())
}

async fn work_runs(hooks: web::Data<Webhooks>, id: web::Path<String>) -> String {
    format!("{}\n", hooks.runs(&id))
}

#[actix_web::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let hooks = web::Data::new(Webhooks::default());

    let idempotency = Idempotency::new(redlock.clone())
        .store(RedisStore::new(redlock).record_ttl(RECORD_TTL))
        .policy(IdempotencyPolicy::default().lock(|l| l.namespace("webhook:")));
    let shared = hooks.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(shared.clone())
            .service(
                web::resource("/webhooks")
                    .wrap(
                        IdempotencyMiddleware::with_engine(idempotency.clone())
                            .key_header(HeaderName::from_static(DELIVERY_HEADER)),
                    )
                    .route(web::post().to(receive)),
            )
            .route("/work/{id}", web::get().to(work_runs))
    })
    .workers(2)
    .bind(("127.0.0.1", args.port_or(8080)?))?;
    let addr = server.addrs()[0];
    let server = server.run();
    println!("listening on http://{addr}");

    if args.flag("--self-test") {
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let code = self_test(&format!("http://{addr}"), &hooks).await;
        handle.stop(true).await;
        return Ok(code);
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
    // actix stops on Ctrl-C; returning then stops the local Redis nodes.
    server.await?;
    Ok(ExitCode::SUCCESS)
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

async fn self_test(base: &str, hooks: &Webhooks) -> ExitCode {
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
    let first = actix_web::rt::spawn({
        let (base, id) = (base.to_owned(), id.clone());
        async move { deliver(&base, Some(&id), PAYLOAD).await }
    });
    actix_web::rt::time::sleep(WORK_TIME / 3).await;
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
        actix_web::rt::spawn(async move { deliver(&base, Some(&id), PAYLOAD).await })
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
        actix_web::rt::time::sleep(Duration::from_millis(500)).await;
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
