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

use std::process::ExitCode;
use std::time::Duration;

use actix_web::http::header::HeaderName;
use actix_web::{App, HttpRequest, HttpServer, web};
use bytes::Bytes;
use redlock_actix::idempotency::{
    Idempotency, IdempotencyMiddleware, IdempotencyPolicy, RedisStore,
};
use redlock_examples::webhooks::{self, DELIVERY_HEADER, RECORD_TTL, WORK_TIME, Webhooks};
use redlock_examples::{Args, BoxError, Nodes};

/// The work, at most once per delivery id: the middleware runs this handler
/// only for a delivery it has no record of, under the delivery's lock.
async fn receive(req: HttpRequest, hooks: web::Data<Webhooks>, payload: Bytes) -> String {
    // The middleware rejects requests without the header, so it is here.
    let id = req
        .headers()
        .get(DELIVERY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let done = hooks.record_run(id, payload.len());
    actix_web::rt::time::sleep(WORK_TIME).await;
    done
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
        let code = webhooks::self_test(&format!("http://{addr}"), &hooks).await;
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
