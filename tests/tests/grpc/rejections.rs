//! The rejections a gRPC client gets from `RedlockLayer::by_header("x-tenant")`
//! in front of a tonic server: a busy tenant (`ABORTED`, or
//! `RESOURCE_EXHAUSTED` when chosen, with the holder's remaining TTL as the
//! pushback), no quorum (`UNAVAILABLE`), no key under the reject policy
//! (`INVALID_ARGUMENT`); and a call alone, and two tenants at once, run.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::HeaderName;
use redlock_tests::Cluster;
use redlock_tower::{GrpcBusyCode, MissingKeyPolicy, RedlockLayer};
use tonic::Code;

use crate::common::*;

const TTL: Duration = Duration::from_secs(5);

fn tenant_layer(cluster: &Cluster) -> RedlockLayer<redlock_tower::ByHeader> {
    RedlockLayer::by_header(HeaderName::from_static("x-tenant"))
        .ttl(TTL)
        .with_redlock(cluster.patient_redlock())
}

/// Starts a call that holds `tenant`'s lock for `work_ms`, and waits until the
/// lock is on every node.
async fn hold(
    server: &GrpcServer,
    cluster: &Cluster,
    tenant: &'static str,
    work_ms: u32,
) -> tokio::task::JoinHandle<Result<tonic::Response<crate::pb::RunReply>, tonic::Status>> {
    let mut client = server.client().await;
    let call = tokio::spawn(async move { client.run(request(Some(tenant), work_ms, 0)).await });
    let key = format!("redlock:x-tenant={tenant}");
    assert!(
        eventually(answered(Duration::ZERO), || cluster.count_with_key(&key)
            == cluster.len())
        .await,
        "the first call never held {key}"
    );
    call
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_alone_and_two_tenants_at_once_run_under_their_locks() {
    let cluster = Cluster::start(3);
    let service = JobsService::default();
    let server = GrpcServer::start(tenant_layer(&cluster), service.clone()).await;

    let mut client = server.client().await;
    let reply = client
        .run(request(Some("acme"), 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.locked, "redlock:x-tenant=acme", "Held::from_tonic");

    let (mut a, mut b) = (server.client().await, server.client().await);
    let (ra, rb) = tokio::join!(
        a.run(request(Some("acme"), 300, 0)),
        b.run(request(Some("globex"), 300, 0))
    );
    assert_eq!(ra.unwrap().into_inner().locked, "redlock:x-tenant=acme");
    assert_eq!(rb.unwrap().into_inner().locked, "redlock:x-tenant=globex");
    assert_eq!(service.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tenant_is_aborted_with_the_holders_ttl_as_pushback() {
    let cluster = Cluster::start(3);
    let service = JobsService::default();
    let server = GrpcServer::start(tenant_layer(&cluster), service.clone()).await;
    let first = hold(&server, &cluster, "acme", GATED).await;

    let mut client = server.client().await;
    let status = failed(client.run(request(Some("acme"), 0, 0)).await);
    show("busy (default)", &status);
    assert_code(&status, Code::Aborted);
    assert_eq!(
        status.message(),
        "Resource is locked: redlock:x-tenant=acme"
    );
    let pushback = pushback_ms(&status).expect("grpc-retry-pushback-ms");
    assert!(
        pushback > 0 && pushback <= TTL.as_millis() as u64,
        "pushback {pushback} ms is the holder's remaining TTL"
    );
    // A streaming call of the busy tenant gets the same answer.
    let status = failed(client.follow(request(Some("acme"), 0, 1)).await);
    assert_code(&status, Code::Aborted);
    assert_eq!(
        service.runs.load(Ordering::SeqCst),
        1,
        "only the holder ran"
    );

    service.gate.open();
    let reply = within(answered(Duration::ZERO), "the holder's call", first).await;
    assert_eq!(
        reply.unwrap().unwrap().into_inner().locked,
        "redlock:x-tenant=acme"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tenant_can_be_resource_exhausted() {
    let cluster = Cluster::start(3);
    let layer = tenant_layer(&cluster).grpc_busy_code(GrpcBusyCode::ResourceExhausted);
    let service = JobsService::default();
    let server = GrpcServer::start(layer, service.clone()).await;
    let first = hold(&server, &cluster, "acme", GATED).await;

    let status = failed(server.client().await.run(request(Some("acme"), 0, 0)).await);
    show("busy (ResourceExhausted)", &status);
    assert_code(&status, Code::ResourceExhausted);
    assert!(pushback_ms(&status).is_some_and(|ms| ms > 0));
    service.gate.open();
    within(answered(Duration::ZERO), "the holder's call", first)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_quorum_is_unavailable_and_the_handler_never_runs() {
    let cluster = Cluster::start(3);
    let service = JobsService::default();
    let server = GrpcServer::start(tenant_layer(&cluster), service.clone()).await;
    cluster.node(0).kill();
    cluster.node(1).kill();

    let mut client = server.client().await;
    let status = failed(client.run(request(Some("acme"), 0, 0)).await);
    show("no quorum", &status);
    assert_code(&status, Code::Unavailable);
    assert_eq!(
        status.message(),
        "Lock service unavailable: redlock:x-tenant=acme"
    );
    assert_eq!(pushback_ms(&status), Some(1000));
    let status = failed(client.follow(request(Some("acme"), 0, 1)).await);
    assert_code(&status, Code::Unavailable);
    assert_eq!(service.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_its_key_is_an_invalid_argument_under_the_reject_policy() {
    let cluster = Cluster::start(3);
    let service = JobsService::default();
    let layer = tenant_layer(&cluster).on_missing_key(MissingKeyPolicy::Reject);
    let server = GrpcServer::start(layer, service.clone()).await;

    let status = failed(server.client().await.run(request(None, 0, 0)).await);
    show("missing key", &status);
    assert_code(&status, Code::InvalidArgument);
    assert_eq!(status.message(), "Missing lock key");
    assert_eq!(pushback_ms(&status), None);
    assert_eq!(service.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_by_method_lock_one_method_and_leave_the_others_free() {
    let cluster = Cluster::start(3);
    let layer = RedlockLayer::by_grpc_method()
        .ttl(TTL)
        .with_redlock(cluster.patient_redlock());
    let service = JobsService::default();
    let server = GrpcServer::start(layer, service.clone()).await;
    let mut client = server.client().await;
    let first = tokio::spawn(async move { client.run(request(None, GATED, 0)).await });
    let key = "redlock:/jobs.v1.Jobs/Run";
    assert!(
        eventually(answered(Duration::ZERO), || cluster.count_with_key(key)
            == cluster.len())
        .await,
        "the first call never held {key}"
    );

    let mut client = server.client().await;
    // Another tenant, same method: busy.
    let status = failed(client.run(request(Some("other"), 0, 0)).await);
    assert_code(&status, Code::Aborted);
    assert_eq!(status.message(), format!("Resource is locked: {key}"));
    // Another method: its own lock.
    let mut stream = client
        .follow(request(None, 0, 1))
        .await
        .unwrap()
        .into_inner();
    let progress = stream.message().await.unwrap().unwrap();
    assert_eq!(progress.locked, "redlock:/jobs.v1.Jobs/Follow");
    assert!(stream.message().await.unwrap().is_none());
    service.gate.open();
    within(answered(Duration::ZERO), "the first call", first)
        .await
        .unwrap()
        .unwrap();
}
