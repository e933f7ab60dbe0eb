//! The `jobs.v1.Jobs` service the gRPC suites serve, a tonic server on a
//! loopback port behind a layer, and a client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::Stream;
use redlock_tower::Held;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tower::{Layer, Service};

use crate::pb::jobs_client::JobsClient;
use crate::pb::jobs_server::{Jobs, JobsServer};
use crate::pb::{Progress, RunReply, RunRequest};

pub(crate) use redlock_tests::http_timing::{Gate, answered};
pub(crate) use redlock_tests::timing::{PATIENT_NODE_TIMEOUT, liveness};
pub(crate) use redlock_tests::util::{eventually, within};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The service: counts the calls its handlers start, and reads the lock with
/// `Held::from_tonic`. A call whose `work_ms` is [`GATED`] holds until the
/// test opens the `gate` (a unary call before it answers, a stream before
/// each step after the first).
#[derive(Clone, Default)]
pub(crate) struct JobsService {
    pub(crate) runs: Arc<AtomicUsize>,
    pub(crate) gate: Arc<Gate>,
}

/// The `work_ms` of a call that holds at the service's gate.
pub(crate) const GATED: u32 = u32::MAX;

impl JobsService {
    /// Works `work_ms`, or with [`GATED`] waits for the gate.
    async fn work(&self, work_ms: u32) {
        if work_ms == GATED {
            self.gate.passed().await;
        } else {
            tokio::time::sleep(ms(work_ms.into())).await;
        }
    }
}

type ProgressStream = Pin<Box<dyn Stream<Item = Result<Progress, Status>> + Send>>;

#[tonic::async_trait]
impl Jobs for JobsService {
    async fn run(&self, request: Request<RunRequest>) -> Result<Response<RunReply>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let Held(lock) = Held::from_tonic(&request)?;
        let job = request.into_inner();
        self.work(job.work_ms).await;
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
        self.runs.fetch_add(1, Ordering::SeqCst);
        let Held(lock) = Held::from_tonic(&request)?;
        let job = request.into_inner();
        let locked = lock.key().to_owned();
        let service = self.clone();
        let stream = futures_util::stream::unfold(0, move |step| {
            let (locked, service) = (locked.clone(), service.clone());
            async move {
                if step >= job.steps {
                    return None;
                }
                if step > 0 || job.work_ms != GATED {
                    service.work(job.work_ms).await;
                }
                let progress = Progress {
                    step: step + 1,
                    locked,
                };
                Some((Ok(progress), step + 1))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A tonic server on 127.0.0.1:0 serving `service` behind `layer`; stopped on
/// drop.
pub(crate) struct GrpcServer {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcServer {
    pub(crate) async fn start<L, B>(layer: L, service: JobsService) -> Self
    where
        L: Layer<Routes> + Clone + Send + Sync + 'static,
        L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
            + Clone
            + Send
            + 'static,
        <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send,
        <L::Service as Service<http::Request<tonic::body::Body>>>::Error: Into<BoxError> + Send,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Server::builder()
            .layer(layer)
            .add_service(JobsServer::new(service));
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self { addr, task }
    }

    pub(crate) async fn client(&self) -> JobsClient<Channel> {
        let url = format!("http://{}", self.addr);
        within(
            answered(Duration::ZERO),
            "connect",
            JobsClient::connect(url),
        )
        .await
        .unwrap()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A call's request: `job`, working `work_ms` (per step), for `tenant`.
pub(crate) fn request(tenant: Option<&str>, work_ms: u32, steps: u32) -> Request<RunRequest> {
    let mut request = Request::new(RunRequest {
        job: "report".into(),
        work_ms,
        steps,
    });
    if let Some(tenant) = tenant {
        request
            .metadata_mut()
            .insert("x-tenant", tenant.parse().unwrap());
    }
    request
}

/// The status of a call that must fail, with what the test reads of it.
pub(crate) fn failed<T: std::fmt::Debug>(result: Result<T, Status>) -> Status {
    match result {
        Ok(ok) => panic!("the call succeeded: {ok:?}"),
        Err(status) => status,
    }
}

/// The pushback (ms) a status carries.
pub(crate) fn pushback_ms(status: &Status) -> Option<u64> {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Prints a status the way the notes quote it.
pub(crate) fn show(what: &str, status: &Status) {
    eprintln!(
        "{what}: grpc-status {} ({:?}), message {:?}, pushback {:?}",
        status.code() as i32,
        status.code(),
        status.message(),
        pushback_ms(status)
    );
}

/// Asserts the status's code.
pub(crate) fn assert_code(status: &Status, code: Code) {
    assert_eq!(status.code(), code, "{status:?}");
}
