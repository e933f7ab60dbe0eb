//! A per-tenant limit of concurrent exports: at most 3 exports of one tenant
//! at once, across every replica (a quorum semaphore), different tenants
//! independent; and report reads that share a key while a rebuild of the
//! report runs alone.
//!
//! ```sh
//! cargo run -p redlock-examples --bin axum_exports                 # serve on 127.0.0.1:3000
//! cargo run -p redlock-examples --bin axum_exports -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379`, or
//! else three local `redis-server` processes started for the run.
//!
//! - `POST /exports` with `X-Tenant-Id`: `RedlockLayer::by_header(..).permits(3)`;
//!   a fourth export of a tenant gets `429 Too Many Requests` with
//!   `Retry-After` and a problem+json body;
//! - `GET /reports/{id}` and `POST /reports/{id}`:
//!   `RedlockLayer::by_path().shared_for_safe_methods()`: reads run together,
//!   a rebuild (`POST`) alone.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_util::future::join_all;
use http::{HeaderMap, HeaderName, Method, StatusCode};
use redlock_examples::{Args, BoxError, Checks, Gauge, Nodes, http_client, send, serve};
use redlock_tower::{Held, MissingKeyPolicy, RedlockLayer};

const EXPORT_TIME: Duration = Duration::from_secs(1);
const TENANT_HEADER: HeaderName = HeaderName::from_static("x-tenant-id");

/// Per tenant, the exports inside at once; and the report's readers.
#[derive(Default)]
struct Exports {
    tenants: Mutex<BTreeMap<String, Arc<Gauge>>>,
    readers: Gauge,
}

async fn export(State(s): State<Arc<Exports>>, headers: HeaderMap, Held(permit): Held) -> String {
    let tenant = headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let gauge = {
        let mut tenants = s.tenants.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(tenants.entry(tenant.clone()).or_default())
    };
    let _inside = gauge.enter();
    tokio::time::sleep(EXPORT_TIME).await;
    format!("export done for {tenant} (permit {})\n", permit.key())
}

async fn read_report(State(s): State<Arc<Exports>>) -> &'static str {
    let _reading = s.readers.enter();
    tokio::time::sleep(EXPORT_TIME / 2).await;
    "report\n"
}

async fn rebuild_report() -> &'static str {
    tokio::time::sleep(EXPORT_TIME / 2).await;
    "rebuilt\n"
}

fn app(state: Arc<Exports>, redlock: redlock_core::Redlock) -> Router {
    let exports = Router::new().route("/exports", post(export)).route_layer(
        RedlockLayer::by_header(TENANT_HEADER)
            .permits(3)
            .on_missing_key(MissingKeyPolicy::Reject),
    );
    let reports = Router::new()
        .route("/reports/{id}", get(read_report).post(rebuild_report))
        .route_layer(RedlockLayer::by_path().shared_for_safe_methods());
    Router::new()
        .merge(exports)
        .merge(reports)
        .with_state(state)
        .layer(Extension(redlock))
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let state = Arc::new(Exports::default());
    let addr = serve(app(state.clone(), redlock), args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(self_test(&format!("http://{addr}"), &state).await);
    }
    println!(
        "\ntry:\n  \
         for i in 1 2 3 4; do curl -s -i -X POST -H 'X-Tenant-Id: acme' http://{addr}/exports & done; wait\n  \
         for i in 1 2 3; do curl -s http://{addr}/reports/7 & done; wait\n\n\
         Ctrl-C to stop."
    );
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}

async fn self_test(base: &str, state: &Exports) -> ExitCode {
    let client = http_client();
    let mut checks = Checks::default();
    let call = |method: Method, path: &str, tenant: Option<&'static str>| {
        let (client, url) = (client.clone(), format!("{base}{path}"));
        let headers: Vec<(&'static str, &'static str)> =
            tenant.map(|t| ("x-tenant-id", t)).into_iter().collect();
        tokio::spawn(async move {
            send(&client, method, &url, &headers, "")
                .await
                .map(|r| r.status)
                .ok()
        })
    };
    println!("self-test, part 1: 5 exports of acme and 2 of globex at once, 3 permits per tenant");
    let mut jobs: Vec<_> = (0..5)
        .map(|_| call(Method::POST, "/exports", Some("acme")))
        .collect();
    jobs.extend((0..2).map(|_| call(Method::POST, "/exports", Some("globex"))));
    let statuses: Vec<_> = join_all(jobs)
        .await
        .into_iter()
        .map(|r| r.ok().flatten())
        .collect();
    let limited = statuses[..5]
        .iter()
        .filter(|s| **s == Some(StatusCode::TOO_MANY_REQUESTS))
        .count();
    let max = |t: &str| {
        let tenants = state.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants.get(t).map_or(0, |g| g.max())
    };
    checks.check(
        max("acme") <= 3,
        format!("acme: at most {} exports at once", max("acme")),
    );
    checks.check(limited >= 2, format!("acme: {limited} of 5 answered 429"));
    checks.check(
        statuses[5..].iter().all(|s| *s == Some(StatusCode::OK)),
        format!("globex, alongside: {:?}", &statuses[5..]),
    );
    println!("self-test, part 2: 3 reads of /reports/7 at once share it");
    let reads: Vec<_> = (0..3)
        .map(|_| call(Method::GET, "/reports/7", None))
        .collect();
    let reads: Vec<_> = join_all(reads)
        .await
        .into_iter()
        .map(|r| r.ok().flatten())
        .collect();
    checks.check(
        reads.iter().all(|s| *s == Some(StatusCode::OK)),
        format!("reads: {reads:?}"),
    );
    checks.check(
        state.readers.max() >= 2,
        format!("up to {} reads at once", state.readers.max()),
    );
    checks.finish()
}
