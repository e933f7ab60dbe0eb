//! Fencing tokens through the tower layer: the handler finds the lock's token
//! in the request (`Extension<FencingToken>`), the response carries it in the
//! configured header, and successive requests on one key get growing tokens.

use crate::common::*;
use axum::routing::get;
use axum::{Extension, Router};
use redlock_core::{FencingMode, Redlock};
use redlock_tests::Cluster;
use redlock_tower::{FencingToken, RedlockLayer};

async fn token(Extension(token): Extension<FencingToken>) -> String {
    token.get().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_and_the_response_carry_a_growing_fencing_token() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap();
    let app = Router::new().route("/jobs/1", get(token)).layer(
        RedlockLayer::by_path()
            .with_redlock(redlock)
            .fencing_header("x-fencing-token"),
    );
    let server = Server::start(app).await;
    let client = client();
    let mut last = 0u64;
    for _ in 0..5 {
        let reply = http_get(&client, &server.url("/jobs/1")).await;
        assert_eq!(reply.status, http::StatusCode::OK, "{}", reply.text());
        let seen: u64 = reply.text().parse().expect("the handler saw a token");
        let header: u64 = reply
            .header("x-fencing-token")
            .expect("the token header")
            .parse()
            .unwrap();
        assert_eq!(seen, header);
        assert!(seen > last, "token {seen} after {last}");
        last = seen;
    }
}
