//! A streamed body of known length (`HttpResponse::no_chunking(n).streaming(..)`,
//! as `NamedFile` answers): its last chunk is the end of the response for the
//! client, so it goes out only once the release has completed. actix flushes
//! what it has whenever the body is pending, so a body that gave the last
//! chunk out and then released would let a client that has the whole response
//! find the lock still held. The release is made slow (every node's commands
//! delayed 300 ms by a proxy, once the lock is held), and the client asks
//! another replica, on the nodes directly, the moment it has the last byte.

use std::convert::Infallible;
use std::time::Duration;

use actix_web::{App, HttpResponse, web};
use bytes::Bytes;
use redlock_actix::{Redlock, RedlockMiddleware};
use redlock_tests::Cluster;
use redlock_tests::proxy::{Direction, FaultProxy};
use tokio::sync::Notify;

use crate::common::*;

/// A `Redlock` over the cluster whose node timeout leaves room for a loaded
/// machine: a 503 here would be the machine, not the case under test.
fn patient_redlock(cluster: &Cluster) -> Redlock {
    cluster.patient_redlock()
}

/// The delay the proxies add to every request, once the race is on.
const PROXY_DELAY: Duration = Duration::from_millis(300);

const FIRST: &str = "first chunk, ";
const LAST: &str = "last chunk";
const KEY: &str = "redlock:/sized";

/// Two chunks in a body of announced length; the last one once the test says go.
async fn sized(go: web::Data<Notify>) -> HttpResponse {
    let chunks = futures_util::stream::unfold(0u8, move |i| {
        let go = go.clone();
        async move {
            match i {
                0 => Some((Ok::<_, Infallible>(Bytes::from(FIRST)), 1)),
                1 => {
                    go.notified().await;
                    Some((Ok(Bytes::from(LAST)), 2))
                }
                _ => None,
            }
        }
    });
    HttpResponse::Ok()
        .no_chunking((FIRST.len() + LAST.len()) as u64)
        .streaming(chunks)
}

#[actix_web::test]
async fn the_last_chunk_of_a_sized_stream_goes_out_after_the_release() {
    let cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        proxies.push(FaultProxy::start(i, node.port(), None).await.unwrap());
    }
    // The replica under test reaches the nodes through the proxies (node
    // timeout the patient one on top of their delay); the other one directly.
    let behind_proxies = Redlock::builder()
        .urls(proxies.iter().map(FaultProxy::url))
        .node_timeout(PATIENT_NODE_TIMEOUT + PROXY_DELAY)
        .build()
        .unwrap();
    let go = web::Data::new(Notify::new());
    let slow = {
        let go = go.clone();
        serve!(1, move || {
            App::new()
                .app_data(behind_proxies.clone())
                .app_data(go.clone())
                .wrap(RedlockMiddleware::by_path().ttl(Duration::from_secs(30)))
                .route("/sized", web::get().to(sized))
        })
    };
    let direct = patient_redlock(&cluster);
    let other = serve!(1, move || {
        App::new()
            .app_data(direct.clone())
            .wrap(RedlockMiddleware::by_path().ttl(Duration::from_secs(30)))
            .route("/sized", web::get().to(|| async { "ok" }))
    });
    let other_client = client();
    // A connection to the other replica, open before the race.
    assert_eq!(get(&other_client, &other.url("/sized")).await.status, 200);
    assert!(
        on_no_node(&cluster, KEY).await,
        "the other replica released"
    );

    let response = open(&client(), &slow.url("/sized")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-length"],
        (FIRST.len() + LAST.len()).to_string()
    );
    assert!(cluster.count_with_key(KEY) >= 2, "held on a quorum");
    for proxy in &proxies {
        proxy.delay(Direction::Request, PROXY_DELAY, Duration::ZERO);
    }
    go.notify_one();
    let received = receive(response.into_body()).await;
    assert_eq!(received.error, None);
    assert_eq!(received.text, format!("{FIRST}{LAST}"));
    // The client has every byte of the response: the lock is its own no more.
    let next = get(&other_client, &other.url("/sized")).await;
    assert_eq!(
        next.status,
        200,
        "a client with the whole response was refused the lock: {} {:?}",
        next.status,
        next.text()
    );
}
