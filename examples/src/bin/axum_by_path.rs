//! The smallest setup: one lock per request path, across every replica.
//!
//! ```sh
//! cargo run -p redlock-examples --bin axum_by_path                 # serve on 127.0.0.1:3000
//! cargo run -p redlock-examples --bin axum_by_path -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 3000).
//!
//! `POST /reports/{id}/rebuild` takes 2 s. While one rebuild of a report runs, any
//! other request for the same path gets `409 Conflict` with `Retry-After`; other
//! reports rebuild in parallel.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::routing::post;
use axum::{Extension, Router};
use http::{Method, StatusCode};
use redlock_core::LockHandle;
use redlock_examples::{
    Args, BoxError, Checks, Nodes, http_client, send, send_retrying_busy, serve,
};
use redlock_tower::RedlockLayer;

const REBUILD_TIME: Duration = Duration::from_secs(2);

async fn rebuild(Path(id): Path<String>, Extension(lock): Extension<LockHandle>) -> String {
    // The work this lock protects: only one rebuild of a report at a time.
    tokio::time::sleep(REBUILD_TIME).await;
    format!("report {id} rebuilt (lock {})\n", lock.key())
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;

    let app = Router::new()
        .route("/reports/{id}/rebuild", post(rebuild))
        .layer(RedlockLayer::by_path())
        .layer(Extension(redlock));

    let addr = serve(app, args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(self_test(&format!("http://{addr}")).await);
    }
    println!(
        "\ntry (the second call answers 409 while the first one runs):\n  \
         curl -i -X POST http://{addr}/reports/42/rebuild &\n  \
         sleep 0.5; curl -i -X POST http://{addr}/reports/42/rebuild\n  \
         curl -i -X POST http://{addr}/reports/7/rebuild    # another report: not blocked\n\n\
         Ctrl-C to stop."
    );
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}

async fn self_test(base: &str) -> ExitCode {
    let client = http_client();
    let mut checks = Checks::default();
    let post = |path: &str| {
        let (client, url) = (client.clone(), format!("{base}{path}"));
        tokio::spawn(async move { send(&client, Method::POST, &url, &[], "").await })
    };
    println!("self-test:");

    let started = Instant::now();
    let first = post("/reports/42/rebuild");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let duplicate = post("/reports/42/rebuild");
    let other = post("/reports/7/rebuild");

    match duplicate.await {
        Ok(Ok(r)) => checks.check(
            r.status == StatusCode::CONFLICT && r.header("retry-after").is_some(),
            format!(
                "same path while it runs: {} (Retry-After: {})",
                r.status,
                r.header("retry-after").unwrap_or("-")
            ),
        ),
        other => checks.check(false, format!("same path while it runs: {other:?}")),
    }
    for (what, task) in [
        ("first rebuild of 42", first),
        ("rebuild of 7 meanwhile", other),
    ] {
        match task.await {
            Ok(Ok(r)) => checks.check(
                r.status == StatusCode::OK,
                format!("{what}: {} {}", r.status, r.text().trim()),
            ),
            other => checks.check(false, format!("{what}: {other:?}")),
        }
    }
    checks.check(
        started.elapsed() < REBUILD_TIME * 2,
        format!(
            "42 and 7 ran in parallel: both done after {:?}",
            started.elapsed()
        ),
    );
    // Retried on 409 for up to 1 s: the first rebuild's release may reach Redis a
    // moment after its response reached us.
    let again = send_retrying_busy(
        &client,
        Method::POST,
        &format!("{base}/reports/42/rebuild"),
        &[],
        "",
        20,
        Duration::from_millis(50),
    )
    .await;
    match again {
        Ok((r, retries)) => checks.check(
            r.status == StatusCode::OK,
            format!(
                "42 again once free: {} (after {retries} retries on 409)",
                r.status
            ),
        ),
        Err(e) => checks.check(false, format!("42 again once free: {e}")),
    }
    checks.finish()
}
