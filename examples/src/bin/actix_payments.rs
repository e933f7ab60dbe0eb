//! An `Idempotency-Key` API in actix-web, the twin of `axum_payments`: a
//! client may retry `POST /payments` as often as it likes, and the payment is
//! made once.
//!
//! ```sh
//! cargo run -p redlock-examples --bin actix_payments                 # serve on 127.0.0.1:8080
//! cargo run -p redlock-examples --bin actix_payments -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 8080).
//!
//! `POST /payments` with a JSON body `{"amount": 1250, "currency": "EUR"}`,
//! `Idempotency-Key: "<key>"` (an sf-string, or a bare token) and
//! `X-Client-Id: <client>`, under
//! `redlock_actix::idempotency::IdempotencyMiddleware`: the first request with
//! a key pays (`201`); a retry gets the same bytes with `Idempotent-Replayed:
//! true`; another body under the key gets `422`, no key `400`, a copy in
//! flight `409` with `Retry-After`; keys are scoped by client.
//!
//! As in `axum_payments`, the scope comes from `X-Client-Id` only so the
//! example runs with curl: in production it must come from authentication.

use std::process::ExitCode;
use std::time::Duration;

use actix_web::dev::{Service, ServiceRequest};
use actix_web::{App, HttpResponse, HttpServer, web};
use bytes::Bytes;
use futures_util::future::Either;
use redlock_actix::idempotency::IdempotencyMiddleware;
use redlock_examples::payments::{self, Answer, CLIENT_HEADER, Ledger};
use redlock_examples::{Args, BoxError, Nodes};

fn respond(answer: Answer) -> HttpResponse {
    let content_type = if answer.problem {
        "application/problem+json"
    } else {
        "application/json"
    };
    HttpResponse::build(
        actix_web::http::StatusCode::from_u16(answer.status.as_u16())
            .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR),
    )
    .content_type(content_type)
    .body(answer.body)
}

/// Makes one payment: the middleware runs this only for a key it has no
/// record of in the client's scope, under that key's lock.
async fn pay(ledger: web::Data<Ledger>, body: Bytes) -> HttpResponse {
    respond(ledger.pay(&body))
}

async fn count(ledger: web::Data<Ledger>) -> String {
    format!("{}\n", ledger.count())
}

#[actix_web::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let ledger = web::Data::new(Ledger::default());

    let shared = ledger.clone();
    let server = HttpServer::new(move || {
        let idempotency = IdempotencyMiddleware::new(redlock.clone()).scope(|req| {
            req.headers()
                .get(CLIENT_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
        App::new()
            .app_data(shared.clone())
            .service(
                web::resource("/payments")
                    .wrap(idempotency)
                    // Stands in for authentication: registered last, so it
                    // runs first, and every key the middleware sees has a scope.
                    .wrap_fn(|req: ServiceRequest, srv| {
                        if req.headers().contains_key(CLIENT_HEADER) {
                            Either::Left(srv.call(req))
                        } else {
                            let answer = req.into_response(respond(payments::unauthorized()));
                            Either::Right(std::future::ready(Ok(answer)))
                        }
                    })
                    .route(web::post().to(pay)),
            )
            .route("/payments/count", web::get().to(count))
    })
    .workers(2)
    .bind(("127.0.0.1", args.port_or(8080)?))?;
    let addr = server.addrs()[0];
    let server = server.run();
    println!("listening on http://{addr}");

    if args.flag("--self-test") {
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let code = payments::self_test(&format!("http://{addr}"), &ledger).await;
        handle.stop(true).await;
        return Ok(code);
    }
    println!("{}", payments::try_lines(&addr.to_string()));
    // actix stops on Ctrl-C; returning then stops the local Redis nodes.
    server.await?;
    Ok(ExitCode::SUCCESS)
}
