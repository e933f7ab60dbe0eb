//! Fencing tokens through the actix middleware: the handler finds the lock's
//! token in the request extensions, the response carries it in the configured
//! header, and successive requests on one key get growing tokens.

use actix_web::{App, HttpMessage, HttpRequest, web};
use redlock_actix::{FencingToken, RedlockMiddleware};
use redlock_core::{FencingMode, Redlock};
use redlock_tests::Cluster;

use crate::common::*;

async fn token(req: HttpRequest) -> String {
    req.extensions()
        .get::<FencingToken>()
        .map_or_else(|| "none".to_owned(), |t| t.get().to_string())
}

#[actix_web::test]
async fn the_handler_and_the_response_carry_a_growing_fencing_token() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap();
    let server = serve!(move || {
        App::new()
            .app_data(redlock.clone())
            .wrap(RedlockMiddleware::by_path().fencing_header("x-fencing-token"))
            .route("/jobs/1", web::get().to(token))
    });
    let client = client();
    let mut last = 0u64;
    for _ in 0..5 {
        let reply = get(&client, &server.url("/jobs/1")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
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
