//! `fail_open()` runs a request unlocked only when the nodes do not answer
//! (issue 37 item 9). Nodes that answer with a refusal, here a wrong or missing
//! password after a credential rotation, are up: the request gets 503 and
//! never runs. Nodes that are down (killed, or never started) still let it
//! run unlocked.

use std::net::TcpListener;

use crate::common::*;
use axum::routing::get;
use axum::{Extension, Router};
use redlock_core::{LockHandle, Redlock};
use redlock_tests::Cluster;
use redlock_tower::RedlockLayer;

async fn job(lock: Option<Extension<LockHandle>>) -> String {
    lock.map_or_else(|| "unlocked".to_owned(), |l| l.key().to_owned())
}

/// A route `path` under a fail-open layer bound to `redlock`.
fn route(path: &str, redlock: Redlock) -> Router {
    Router::new()
        .route(path, get(job))
        .layer(RedlockLayer::by_path().fail_open().with_redlock(redlock))
}

fn redlock_over(urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .urls(urls)
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_answers_503_when_every_node_refuses_the_credentials() {
    let cluster = Cluster::start(3);
    for node in cluster.nodes() {
        node.cmd(&["CONFIG", "SET", "requirepass", "new-password"]);
    }
    let with = |password: &str| -> Vec<String> {
        cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://{password}127.0.0.1:{}", n.port()))
            .collect()
    };
    let app = route("/wrong", redlock_over(with(":old-password@")))
        .merge(route("/missing", redlock_over(with(""))));
    let server = Server::start(app).await;

    for (path, said) in [("/wrong", "WRONGPASS"), ("/missing", "NOAUTH")] {
        let reply = http_get(&client(), &server.url(path)).await;
        assert_eq!(
            reply.status,
            503,
            "{path} ({said} from every node): {}",
            reply.text()
        );
        let doc = reply.json();
        assert_eq!(doc["title"], "Lock service unavailable", "{doc}");
        assert_eq!(doc["refused"], "auth", "{doc}");
        assert!(reply.retry_after().is_some_and(|s| s >= 1), "{reply:?}");
        assert!(!reply.text().contains("password"), "{doc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_still_runs_unlocked_when_no_node_answers() {
    let cluster = Cluster::start(3);
    let killed = redlock_over(cluster.urls());
    for node in cluster.nodes() {
        node.kill();
    }
    // Ports nothing listens on: nodes that were never started.
    let never_started: Vec<String> = (0..3)
        .map(|_| {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            format!("redis://127.0.0.1:{port}")
        })
        .collect();
    let app = route("/killed", killed).merge(route("/never", redlock_over(never_started)));
    let server = Server::start(app).await;

    for path in ["/killed", "/never"] {
        let reply = http_get(&client(), &server.url(path)).await;
        assert_eq!(
            (reply.status.as_u16(), reply.text().as_str()),
            (200, "unlocked"),
            "{path}"
        );
    }
}
