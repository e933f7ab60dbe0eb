//! `fail_open()` runs a request unlocked only when the nodes do not answer
//! (issue 37 item 9). Nodes that answer with a refusal, here a wrong or missing
//! password after a credential rotation, are up: the request gets 503 and
//! never runs. Nodes that are down (killed, or never started) still let it
//! run unlocked.

use std::net::TcpListener;

use crate::common::*;
use actix_web::{App, test, web};
use redlock_actix::{LockHandle, Redlock, RedlockMiddleware};
use redlock_tests::Cluster;

async fn job(lock: Option<web::ReqData<LockHandle>>) -> String {
    lock.map_or_else(|| "unlocked".to_owned(), |l| l.key().to_owned())
}

fn redlock_over(urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .urls(urls)
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// A resource `path` under a fail-open middleware bound to `redlock`.
fn resource(path: &str, redlock: Redlock) -> impl actix_web::dev::HttpServiceFactory + 'static {
    web::resource(path)
        .wrap(
            RedlockMiddleware::by_path()
                .fail_open()
                .with_redlock(redlock),
        )
        .route(web::get().to(job))
}

#[actix_web::test]
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
    let app = test::init_service(
        App::new()
            .service(resource("/wrong", redlock_over(with(":old-password@"))))
            .service(resource("/missing", redlock_over(with("")))),
    )
    .await;

    for (path, said) in [("/wrong", "WRONGPASS"), ("/missing", "NOAUTH")] {
        let answer = call!(&app, path).await;
        assert_eq!(
            answer.status, 503,
            "{path} ({said} from every node): {answer:?}"
        );
        let doc = answer.json();
        assert_eq!(doc["title"], "Lock service unavailable", "{doc}");
        assert_eq!(doc["refused"], "auth", "{doc}");
        assert!(answer.retry_after.is_some_and(|s| s >= 1), "{answer:?}");
        assert!(!answer.body.contains("password"), "{doc}");
    }
}

#[actix_web::test]
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
    let app = test::init_service(
        App::new()
            .service(resource("/killed", killed))
            .service(resource("/never", redlock_over(never_started))),
    )
    .await;

    for path in ["/killed", "/never"] {
        let answer = call!(&app, path).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, "unlocked"),
            "{path}"
        );
    }
}
