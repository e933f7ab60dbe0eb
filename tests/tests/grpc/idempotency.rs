//! `IdempotencyLayer` in front of a tonic server: it refuses gRPC calls,
//! unary and streaming, with `INTERNAL` and a message that says why, before
//! the handler runs. Its records keep no trailers, where a gRPC status is, so
//! a replay could not be the response it replays.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use redlock_tests::Cluster;
use redlock_tower::idempotency::IdempotencyLayer;
use tonic::Code;
use tower::ServiceBuilder;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_are_refused_by_the_idempotency_layer_before_they_run() {
    let cluster = Cluster::start(3);
    let service = JobsService::default();
    // The layer hands the handler a buffered body; tonic's router takes its own.
    let layer = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(cluster.patient_redlock()))
        .map_request(|request: http::Request<Full<Bytes>>| request.map(tonic::body::Body::new));
    let server = GrpcServer::start(layer, service.clone()).await;
    let mut client = server.client().await;

    let mut unary = request(Some("acme"), 0, 0);
    unary
        .metadata_mut()
        .insert("idempotency-key", "order-7".parse().unwrap());
    let status = failed(client.run(unary).await);
    show("idempotency layer, unary", &status);
    assert_code(&status, Code::Internal);
    assert!(
        status
            .message()
            .starts_with("the idempotency layer does not serve gRPC"),
        "{status:?}"
    );

    let mut streaming = request(Some("acme"), 0, 2);
    streaming
        .metadata_mut()
        .insert("idempotency-key", "order-8".parse().unwrap());
    let status = failed(client.follow(streaming).await);
    show("idempotency layer, streaming", &status);
    assert_code(&status, Code::Internal);
    assert_eq!(service.runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert!(cluster.nodes().iter().all(|n| n.keys().is_empty()));
}
