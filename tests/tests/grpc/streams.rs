//! Server streams behind `RedlockLayer::by_header("x-tenant")`: the lock is
//! held while the stream runs and released when it ends cleanly (status OK)
//! or when the client drops it; a lock lost mid-stream ends the stream with
//! `grpc-status: UNAVAILABLE` in the trailers, not a reset.

use std::time::{Duration, Instant};

use http::HeaderName;
use redlock_tests::Cluster;
use redlock_tower::RedlockLayer;
use tonic::Code;

use crate::common::*;

const KEY: &str = "redlock:x-tenant=acme";

fn layer(cluster: &Cluster, ttl: Duration) -> RedlockLayer<redlock_tower::ByHeader> {
    RedlockLayer::by_header(HeaderName::from_static("x-tenant"))
        .ttl(ttl)
        .with_redlock(cluster.patient_redlock())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_its_lock_until_it_ends_cleanly() {
    let cluster = Cluster::start(3);
    let service = JobsService::default();
    let server = GrpcServer::start(layer(&cluster, ms(5000)), service.clone()).await;
    let mut client = server.client().await;
    // Steps after the first wait at the gate: the stream runs until the test
    // has seen the tenant busy.
    let mut stream = client
        .follow(request(Some("acme"), GATED, 4))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!((first.step, first.locked.as_str()), (1, KEY));
    assert_eq!(
        cluster.settled_count(KEY, cluster.len()).await,
        cluster.len(),
        "held mid-stream"
    );

    // The tenant is busy while its stream runs.
    let status = failed(server.client().await.run(request(Some("acme"), 0, 0)).await);
    assert_code(&status, Code::Aborted);
    service.gate.open();

    let mut steps = vec![first.step];
    while let Some(progress) = within(
        answered(Duration::ZERO),
        "the next message",
        stream.message(),
    )
    .await
    .expect("a clean end: grpc-status 0")
    {
        steps.push(progress.step);
    }
    assert_eq!(steps, [1, 2, 3, 4]);
    // Released at quorum before the end was reported: at most a minority key
    // is left (its delete on its way), and the tenant is free at once.
    assert!(
        cluster.count_with_key(KEY) <= 1,
        "a quorum released before the end"
    );
    assert_eq!(
        cluster.settled_count(KEY, 0).await,
        0,
        "released at the end"
    );
    let reply = client.run(request(Some("acme"), 0, 0)).await.unwrap();
    assert_eq!(reply.into_inner().locked, KEY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_drops_releases_its_lock() {
    let cluster = Cluster::start(3);
    let server = GrpcServer::start(layer(&cluster, ms(5000)), JobsService::default()).await;
    let mut client = server.client().await;
    let mut stream = client
        .follow(request(Some("acme"), 100, 1000))
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().unwrap();
    assert_eq!(
        cluster.settled_count(KEY, cluster.len()).await,
        cluster.len()
    );
    drop(stream);
    assert_eq!(
        cluster.settled_count(KEY, 0).await,
        0,
        "the lock outlived the stream the client dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_mid_stream_ends_it_with_unavailable_in_the_trailers() {
    let cluster = Cluster::start(3);
    // Long enough that the patient handle renews it (a renewal needs two node
    // timeouts of validity).
    let ttl = PATIENT_NODE_TIMEOUT * 4;
    let server = GrpcServer::start(layer(&cluster, ttl), JobsService::default()).await;
    let mut client = server.client().await;
    // Steps of 25 ms: far longer than the loss may take to be seen.
    let steps = 100_000;
    let mut stream = client
        .follow(request(Some("acme"), 25, steps))
        .await
        .unwrap()
        .into_inner();
    let mut received = 0;
    while received < 2 {
        stream.message().await.unwrap().unwrap();
        received += 1;
    }
    // Another party's deletion on nodes 0 and 1: a minority is left.
    for i in 0..2 {
        cluster.node(i).cmd(&["DEL", KEY]);
    }
    let stolen = Instant::now();
    let status = loop {
        match within(liveness(ttl), "the stream's end", stream.message()).await {
            Ok(Some(_)) => received += 1,
            Ok(None) => panic!("the stream ended with status OK after the loss"),
            Err(status) => break status,
        }
    };
    show("lost mid-stream", &status);
    eprintln!(
        "{received} messages, then the status {:?} after the deletion",
        stolen.elapsed()
    );
    assert_code(&status, Code::Unavailable);
    assert_eq!(
        status.message(),
        format!("Lock lost: {KEY}; the stream was stopped")
    );
    assert!(received < steps, "the stream was stopped");
    // The call is over: the tenant's next call runs.
    assert_eq!(
        cluster.settled_count(KEY, 0).await,
        0,
        "the holder's last node kept the key"
    );
    let reply = client.run(request(Some("acme"), 0, 0)).await.unwrap();
    assert_eq!(reply.into_inner().locked, KEY);
}
