//! Per-tenant mutual exclusion: one tenant's jobs run one at a time, different
//! tenants run in parallel, across every replica.
//!
//! ```sh
//! cargo run -p redlock-examples --bin axum_tenant                 # serve on 127.0.0.1:3000
//! cargo run -p redlock-examples --bin axum_tenant -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 3000).
//!
//! Two routes take the same per-tenant lock (`redlock:tenant=<id>`: the layer's
//! namespace `redlock:`, then `tenant=<id>`):
//!
//! - `POST /tenants/{tenant}/jobs`: the key is the `tenant` path parameter
//!   (`RedlockLayer::by_path_param`); a busy tenant's jobs **wait** (up to 30 s)
//!   for their turn, so they queue;
//! - `POST /jobs` with `X-Tenant-Id: <tenant>`: the key is the header, named
//!   like the path parameter (`RedlockLayer::by_header_as(.., "tenant")`, a
//!   request without it gets 400), so both routes exclude each other; a busy
//!   tenant answers **409** at once.
//!
//! `GET /stats` shows, per tenant, how many jobs ran and the most that ever ran
//! at once (always 1).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::future::join_all;
use http::{HeaderMap, HeaderName, Method, StatusCode};
use redlock_core::LockHandle;
use redlock_examples::{Args, BoxError, Checks, Gauge, HttpError, Nodes, http_client, send, serve};
use redlock_tower::{Held, MissingKeyPolicy, RedlockLayer};

const JOB_TIME: Duration = Duration::from_secs(1);
const TENANT_HEADER: HeaderName = HeaderName::from_static("x-tenant-id");

/// Per tenant: jobs run, and a gauge of the jobs inside at once.
#[derive(Default)]
struct Tenants {
    jobs: Mutex<BTreeMap<String, (u64, Arc<Gauge>)>>,
    /// Jobs of all tenants inside at once: above 1 shows tenants in parallel.
    all: Gauge,
}

impl Tenants {
    async fn run_job(&self, tenant: &str, lock: &LockHandle) -> String {
        let gauge = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let entry = jobs.entry(tenant.to_owned()).or_default();
            entry.0 += 1;
            entry.1.clone()
        };
        let _tenant = gauge.enter();
        let _all = self.all.enter();
        tokio::time::sleep(JOB_TIME).await; // the tenant's job
        format!("job done for tenant {tenant} (lock {})\n", lock.key())
    }

    fn max_inside(&self, tenant: &str) -> usize {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.get(tenant).map_or(0, |(_, g)| g.max())
    }
}

async fn job_by_path(
    State(tenants): State<Arc<Tenants>>,
    Path(tenant): Path<String>,
    Held(lock): Held,
) -> String {
    tenants.run_job(&tenant, &lock).await
}

async fn job_by_header(
    State(tenants): State<Arc<Tenants>>,
    headers: HeaderMap,
    Held(lock): Held,
) -> String {
    // The layer only lets requests with the header through.
    let tenant = headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    tenants.run_job(tenant, &lock).await
}

async fn stats(State(tenants): State<Arc<Tenants>>) -> Json<serde_json::Value> {
    let jobs = tenants.jobs.lock().unwrap_or_else(|e| e.into_inner());
    let per_tenant: serde_json::Map<_, _> = jobs
        .iter()
        .map(|(t, (n, g))| {
            (
                t.clone(),
                serde_json::json!({ "jobs": n, "max_at_once": g.max() }),
            )
        })
        .collect();
    Json(serde_json::json!({
        "tenants": per_tenant,
        "max_at_once_all_tenants": tenants.all.max(),
    }))
}

fn app(tenants: Arc<Tenants>, redlock: redlock_core::Redlock) -> Router {
    let by_path_param = Router::new()
        .route("/tenants/{tenant}/jobs", post(job_by_path))
        .route_layer(RedlockLayer::by_path_param("tenant").wait(Duration::from_secs(30)));
    let by_header = Router::new()
        .route("/jobs", post(job_by_header))
        .route_layer(
            RedlockLayer::by_header_as(TENANT_HEADER, "tenant")
                .on_missing_key(MissingKeyPolicy::Reject),
        );
    Router::new()
        .merge(by_path_param)
        .merge(by_header)
        .route("/stats", get(stats))
        .with_state(tenants)
        .layer(Extension(redlock))
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let tenants = Arc::new(Tenants::default());

    let addr = serve(app(tenants.clone(), redlock), args.port()?).await?;
    println!("listening on http://{addr}");
    if args.flag("--self-test") {
        return Ok(self_test(&format!("http://{addr}"), &tenants).await);
    }
    println!(
        "\ntry (jobs take {JOB_TIME:?}):\n  \
         # three jobs of acme queue (about 3 s), globex's job runs alongside:\n  \
         for i in 1 2 3; do curl -s -X POST http://{addr}/tenants/acme/jobs & done; \
         curl -s -X POST http://{addr}/tenants/globex/jobs; wait\n  \
         # the header route answers 409 while acme is busy, 400 without the header:\n  \
         curl -s -X POST http://{addr}/tenants/acme/jobs & sleep 0.3; \
         curl -i -X POST -H 'X-Tenant-Id: acme' http://{addr}/jobs; wait\n  \
         curl -i -X POST http://{addr}/jobs\n  \
         curl -s http://{addr}/stats\n\n\
         Ctrl-C to stop."
    );
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}

async fn self_test(base: &str, tenants: &Tenants) -> ExitCode {
    let client = http_client();
    let mut checks = Checks::default();
    let post = |path: &str, headers: Vec<(&'static str, &'static str)>| {
        let (client, url) = (client.clone(), format!("{base}{path}"));
        tokio::spawn(async move { send(&client, Method::POST, &url, &headers, "").await })
    };
    println!(
        "self-test, part 1: by_path_param in wait mode, 3 jobs of acme and 3 of globex at once"
    );
    let started = Instant::now();
    let jobs: Vec<_> = ["acme", "globex"]
        .iter()
        .flat_map(|t| (0..3).map(move |_| *t))
        .map(|t| post(&format!("/tenants/{t}/jobs"), vec![]))
        .collect();
    let replies = join_all(jobs).await;
    let elapsed = started.elapsed();
    let ok = replies
        .iter()
        .filter(|r| matches!(r, Ok(Ok(r)) if r.status == StatusCode::OK))
        .count();
    checks.check(
        ok == 6,
        format!("{ok} of 6 jobs answered 200 (busy tenants wait)"),
    );
    for t in ["acme", "globex"] {
        let max = tenants.max_inside(t);
        checks.check(max == 1, format!("{t}: at most {max} job at once"));
    }
    checks.check(
        tenants.all.max() >= 2,
        format!(
            "tenants ran in parallel: up to {} jobs at once across tenants",
            tenants.all.max()
        ),
    );
    checks.check(
        elapsed >= JOB_TIME * 3 && elapsed < JOB_TIME * 6,
        format!("took {elapsed:?}: one tenant's 3 jobs in a row, both tenants side by side"),
    );

    println!("self-test, part 2: by_header in fail-fast mode, sharing the tenant lock");
    let running = post("/tenants/acme/jobs", vec![]);
    tokio::time::sleep(JOB_TIME / 3).await;
    let same = post("/jobs", vec![("x-tenant-id", "acme")]).await;
    let other = post("/jobs", vec![("x-tenant-id", "globex")]);
    let missing = post("/jobs", vec![]).await;
    let status = |r: &Result<Result<redlock_examples::Reply, HttpError>, _>| match r {
        Ok(Ok(r)) => Some(r.status),
        _ => None,
    };
    checks.check(
        status(&same) == Some(StatusCode::CONFLICT),
        format!(
            "X-Tenant-Id: acme while an acme job runs: {:?}",
            status(&same)
        ),
    );
    let other = other.await;
    checks.check(
        status(&other) == Some(StatusCode::OK),
        format!("X-Tenant-Id: globex meanwhile: {:?}", status(&other)),
    );
    checks.check(
        status(&missing) == Some(StatusCode::BAD_REQUEST),
        format!("no X-Tenant-Id: {:?}", status(&missing)),
    );
    let running = running.await;
    checks.check(
        status(&running) == Some(StatusCode::OK),
        format!("the running acme job: {:?}", status(&running)),
    );
    checks.finish()
}
