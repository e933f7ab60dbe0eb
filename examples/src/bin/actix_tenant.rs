//! Per-tenant mutual exclusion in actix-web: one job per tenant at a time,
//! different tenants in parallel, across every replica.
//!
//! ```sh
//! cargo run -p redlock-examples --bin actix_tenant                 # serve on 127.0.0.1:8080
//! cargo run -p redlock-examples --bin actix_tenant -- --self-test  # fire requests, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 8080).
//!
//! `RedlockMiddleware::by_path_param("tenant")` wraps the scope
//! `/tenants/{tenant}` (wrapped on the `App`, the parameter would not be known
//! yet). `POST /tenants/{tenant}/jobs` takes 1 s under the lock
//! `redlock:tenant=<id>`; while it runs, another job of the same tenant gets
//! `409 Conflict` with `Retry-After` and a problem+json body, and other tenants'
//! jobs run alongside. `GET /stats` (outside the scope, unlocked) shows, per
//! tenant, how many jobs ran and the most that ever ran at once (always 1).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use futures_util::future::join_all;
use http::{Method, StatusCode};
use redlock_actix::{LockHandle, RedlockMiddleware};
use redlock_examples::{Args, BoxError, Checks, Gauge, Nodes, Reply, http_client, send};

const JOB_TIME: Duration = Duration::from_secs(1);

/// Per tenant: jobs run, and a gauge of its jobs inside at once.
#[derive(Default)]
struct Tenants {
    jobs: Mutex<BTreeMap<String, (u64, Arc<Gauge>)>>,
    /// Jobs of all tenants inside at once: above 1 shows tenants in parallel.
    all: Gauge,
}

impl Tenants {
    fn gauge(&self, tenant: &str) -> Arc<Gauge> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let entry = jobs.entry(tenant.to_owned()).or_default();
        entry.0 += 1;
        entry.1.clone()
    }

    fn max_inside(&self, tenant: &str) -> usize {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.get(tenant).map_or(0, |(_, g)| g.max())
    }
}

/// The tenant's job: runs only while this replica holds `redlock:tenant=<id>`.
async fn run_job(
    tenant: web::Path<String>,
    tenants: web::Data<Tenants>,
    lock: web::ReqData<LockHandle>,
) -> String {
    let gauge = tenants.gauge(&tenant);
    let _tenant = gauge.enter();
    let _all = tenants.all.enter();
    actix_web::rt::time::sleep(JOB_TIME).await;
    format!("job done for tenant {tenant} (lock {})\n", lock.key())
}

async fn stats(tenants: web::Data<Tenants>) -> HttpResponse {
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
    HttpResponse::Ok().json(serde_json::json!({
        "tenants": per_tenant,
        "max_at_once_all_tenants": tenants.all.max(),
    }))
}

#[actix_web::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;
    let tenants = web::Data::new(Tenants::default());

    let shared = tenants.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(redlock.clone())
            .app_data(shared.clone())
            .service(
                web::scope("/tenants/{tenant}")
                    .wrap(RedlockMiddleware::by_path_param("tenant"))
                    .route("/jobs", web::post().to(run_job)),
            )
            .route("/stats", web::get().to(stats))
    })
    .workers(2)
    .bind(("127.0.0.1", args.port_or(8080)?))?;
    let addr = server.addrs()[0];
    let server = server.run();
    println!("listening on http://{addr}");

    if args.flag("--self-test") {
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let code = self_test(&format!("http://{addr}"), &tenants).await;
        handle.stop(true).await;
        return Ok(code);
    }
    println!(
        "\ntry (jobs take {JOB_TIME:?}):\n  \
         # one acme job runs, the other two get 409 with Retry-After; globex runs alongside:\n  \
         for i in 1 2 3; do curl -s -X POST http://{addr}/tenants/acme/jobs & done; \
         curl -s -X POST http://{addr}/tenants/globex/jobs; wait\n  \
         # the full 409 answer:\n  \
         curl -s -X POST http://{addr}/tenants/acme/jobs & sleep 0.3; \
         curl -i -X POST http://{addr}/tenants/acme/jobs; wait\n  \
         curl -s http://{addr}/stats\n\n\
         Ctrl-C to stop."
    );
    // actix stops on Ctrl-C; returning then stops the local Redis nodes.
    server.await?;
    Ok(ExitCode::SUCCESS)
}

async fn self_test(base: &str, tenants: &Tenants) -> ExitCode {
    let client = http_client();
    let mut checks = Checks::default();
    let post = |tenant: &str| {
        let (client, url) = (client.clone(), format!("{base}/tenants/{tenant}/jobs"));
        async move { send(&client, Method::POST, &url, &[], "").await }
    };
    println!("self-test: 4 jobs of acme, 1 of globex and 1 of initech, all at once");
    let started = Instant::now();
    let all = ["acme", "acme", "acme", "acme", "globex", "initech"];
    let replies = join_all(all.iter().map(|t| post(t))).await;
    let elapsed = started.elapsed();

    let replies: Vec<(&str, Option<Reply>)> = all
        .iter()
        .copied()
        .zip(replies.into_iter().map(Result::ok))
        .collect();
    let of = |tenant: &str, status: StatusCode| {
        replies
            .iter()
            .filter(|(t, r)| *t == tenant && r.as_ref().is_some_and(|r| r.status == status))
            .count()
    };
    checks.check(
        of("acme", StatusCode::OK) == 1,
        format!("acme: {} job ran", of("acme", StatusCode::OK)),
    );
    checks.check(
        of("acme", StatusCode::CONFLICT) == 3,
        format!(
            "acme: {} jobs answered 409 while it ran",
            of("acme", StatusCode::CONFLICT)
        ),
    );
    let busy = replies
        .iter()
        .find_map(|(_, r)| r.as_ref().filter(|r| r.status == StatusCode::CONFLICT));
    checks.check(
        busy.is_some_and(|r| {
            r.header("retry-after").is_some()
                && r.header("content-type") == Some("application/problem+json")
        }),
        format!(
            "a 409 carries Retry-After and a problem document: {}",
            busy.map_or("-".to_owned(), Reply::text)
        ),
    );
    for t in ["globex", "initech"] {
        checks.check(
            of(t, StatusCode::OK) == 1,
            format!("{t}: its job ran alongside"),
        );
        checks.check(
            tenants.max_inside(t) <= 1,
            format!("{t}: at most {} job at once", tenants.max_inside(t)),
        );
    }
    checks.check(
        tenants.max_inside("acme") == 1,
        format!("acme: at most {} job at once", tenants.max_inside("acme")),
    );
    checks.check(
        tenants.all.max() >= 2 && elapsed < JOB_TIME * 2,
        format!(
            "tenants ran in parallel: up to {} jobs at once, all done in {elapsed:?}",
            tenants.all.max()
        ),
    );

    // The lock is released in the background once the response has been sent.
    let mut again = None;
    for _ in 0..20 {
        again = post("acme").await.ok();
        if again.as_ref().is_some_and(|r| r.status == StatusCode::OK) {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    checks.check(
        again.as_ref().is_some_and(|r| r.status == StatusCode::OK),
        format!(
            "acme again once free: {}",
            again.map_or("no answer".to_owned(), |r| r.status.to_string())
        ),
    );
    checks.finish()
}
