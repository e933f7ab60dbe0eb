//! A gRPC service (tonic) behind `RedlockLayer`: one tenant's jobs run one at a
//! time across every replica, and a gRPC client gets gRPC statuses back.
//!
//! ```sh
//! cargo run -p redlock-examples --bin tonic_jobs                 # serve on 127.0.0.1:50051
//! cargo run -p redlock-examples --bin tonic_jobs -- --self-test  # call it, check, exit 0/1
//! ```
//!
//! Nodes: `REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379` (one URL
//! per independent master), or else three local `redis-server` processes started
//! for the run. Port: `--port N` or `$PORT` (default 50051).
//!
//! The service is `jobs.v1.Jobs` (`examples/proto/jobs.proto`, compiled by
//! `build.rs` with protox, no `protoc` needed): `Run` (unary) and `Follow` (a
//! server stream of progress messages). The key is the `x-tenant` metadata
//! (`RedlockLayer::by_metadata`, lock `redlock:x-tenant=<tenant>`); a call
//! without it is `INVALID_ARGUMENT`. A busy tenant's call is `ABORTED` with
//! `grpc-retry-pushback-ms`; a `Follow` stream holds its tenant's lock until it
//! ends or the client drops it. Handlers read the lock with `Held::from_tonic`.

use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures_util::Stream;
use http::HeaderName;
use redlock_examples::{Args, BoxError, Checks, Nodes};
use redlock_tower::{Held, MissingKeyPolicy, RedlockLayer};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};

#[allow(unreachable_pub, missing_debug_implementations, clippy::all)]
mod pb {
    tonic::include_proto!("jobs.v1");
}

use pb::jobs_client::JobsClient;
use pb::jobs_server::{Jobs, JobsServer};
use pb::{Progress, RunReply, RunRequest};

const TENANT: HeaderName = HeaderName::from_static("x-tenant");

struct JobsService;

type ProgressStream = Pin<Box<dyn Stream<Item = Result<Progress, Status>> + Send>>;

#[tonic::async_trait]
impl Jobs for JobsService {
    async fn run(&self, request: Request<RunRequest>) -> Result<Response<RunReply>, Status> {
        let Held(lock) = Held::from_tonic(&request)?;
        let job = request.into_inner();
        tokio::time::sleep(Duration::from_millis(job.work_ms.into())).await; // the job
        Ok(Response::new(RunReply {
            job: job.job,
            locked: lock.key().to_owned(),
            fence: lock.fencing_token().map_or(0, |t| t.get()),
        }))
    }

    type FollowStream = ProgressStream;

    async fn follow(
        &self,
        request: Request<RunRequest>,
    ) -> Result<Response<ProgressStream>, Status> {
        let Held(lock) = Held::from_tonic(&request)?;
        let job = request.into_inner();
        let locked = lock.key().to_owned();
        // The lock is held while this stream runs (it is the response body).
        let stream = futures_util::stream::unfold(0, move |step| {
            let locked = locked.clone();
            async move {
                if step >= job.steps {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(job.work_ms.into())).await;
                Some((
                    Ok(Progress {
                        step: step + 1,
                        locked,
                    }),
                    step + 1,
                ))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    redlock_examples::init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    println!("{}", nodes.describe());
    let redlock = nodes.redlock(Duration::from_millis(100))?;

    let layer = RedlockLayer::by_metadata(TENANT)
        .on_missing_key(MissingKeyPolicy::Reject)
        .with_redlock(redlock);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port_or(50051)?)).await?;
    let addr = listener.local_addr()?;
    let server = Server::builder()
        .layer(layer)
        .add_service(JobsServer::new(JobsService));
    tokio::spawn(async move {
        if let Err(e) = server
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
        {
            eprintln!("server error: {e}");
        }
    });
    println!("serving jobs.v1.Jobs on {addr}");
    if args.flag("--self-test") {
        return self_test(&format!("http://{addr}")).await;
    }
    println!(
        "\ntry (with grpcurl and examples/proto/jobs.proto):\n  \
         grpcurl -plaintext -import-path examples/proto -proto jobs.proto -H 'x-tenant: acme' \
         -d '{{\"job\":\"a\",\"work_ms\":3000}}' {addr} jobs.v1.Jobs/Run &\n  \
         # while it runs, the same tenant is ABORTED, another one runs:\n  \
         grpcurl -plaintext -import-path examples/proto -proto jobs.proto -H 'x-tenant: acme' \
         -d '{{\"job\":\"b\"}}' {addr} jobs.v1.Jobs/Run\n\n\
         Ctrl-C to stop."
    );
    redlock_examples::ctrl_c().await;
    Ok(ExitCode::SUCCESS)
}

fn call(tenant: Option<&str>, work_ms: u32, steps: u32) -> Request<RunRequest> {
    let mut request = Request::new(RunRequest {
        job: "report".into(),
        work_ms,
        steps,
    });
    if let Some(tenant) = tenant.and_then(|t| t.parse().ok()) {
        request.metadata_mut().insert("x-tenant", tenant);
    }
    request
}

fn describe(status: &Status) -> String {
    let pushback = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .map_or("no pushback".to_owned(), |ms| format!("pushback {ms} ms"));
    format!(
        "{:?} ({}) {:?}, {pushback}",
        status.code(),
        status.code() as i32,
        status.message()
    )
}

async fn self_test(url: &str) -> Result<ExitCode, BoxError> {
    let mut checks = Checks::default();
    let client = JobsClient::<Channel>::connect(url.to_owned()).await?;
    let job = Duration::from_millis(800);
    let job_ms = job.as_millis() as u32;

    println!("self-test, part 1: acme and globex at once, then acme again while it runs");
    let (mut a, mut b, mut c) = (client.clone(), client.clone(), client.clone());
    let started = Instant::now();
    let acme = tokio::spawn(async move { a.run(call(Some("acme"), job_ms, 0)).await });
    let globex = tokio::spawn(async move { b.run(call(Some("globex"), job_ms, 0)).await });
    tokio::time::sleep(job / 4).await;
    let busy = c.run(call(Some("acme"), 0, 0)).await;
    let (acme, globex) = (acme.await?, globex.await?);
    let elapsed = started.elapsed();
    checks.check(
        matches!(&acme, Ok(r) if r.get_ref().locked == "redlock:x-tenant=acme"),
        format!(
            "acme ran under its lock: {:?}",
            acme.as_ref().map(|r| &r.get_ref().locked)
        ),
    );
    checks.check(
        globex.is_ok(),
        format!("globex ran alongside ({elapsed:?} for both)"),
    );
    checks.check(
        matches!(&busy, Err(s) if s.code() == Code::Aborted
            && s.metadata().contains_key("grpc-retry-pushback-ms")),
        format!(
            "acme again while busy: {}",
            busy.as_ref().err().map_or("ran".into(), describe)
        ),
    );

    println!("self-test, part 2: a Follow stream holds acme's lock until it ends");
    let mut follower = client.clone();
    let mut stream = follower
        .follow(call(Some("acme"), 200, 3))
        .await?
        .into_inner();
    let first = stream.message().await?;
    let during = c.run(call(Some("acme"), 0, 0)).await;
    let mut steps = first.map(|p| vec![p.step]).unwrap_or_default();
    let end = loop {
        match stream.message().await {
            Ok(Some(p)) => steps.push(p.step),
            Ok(None) => break Ok(()),
            Err(status) => break Err(status),
        }
    };
    checks.check(
        end.is_ok() && steps == [1, 2, 3],
        format!(
            "progress {steps:?}, then {:?}",
            end.as_ref().map_err(describe)
        ),
    );
    checks.check(
        matches!(&during, Err(s) if s.code() == Code::Aborted),
        format!(
            "acme's Run during the stream: {}",
            during.as_ref().err().map_or("ran".into(), describe)
        ),
    );
    let after = c.run(call(Some("acme"), 0, 0)).await;
    checks.check(after.is_ok(), "acme's Run after the stream ended: ran");

    println!("self-test, part 3: a call without x-tenant");
    let missing = c.run(call(None, 0, 0)).await;
    checks.check(
        matches!(&missing, Err(s) if s.code() == Code::InvalidArgument),
        format!(
            "no x-tenant: {}",
            missing.as_ref().err().map_or("ran".into(), describe)
        ),
    );
    Ok(checks.finish())
}
