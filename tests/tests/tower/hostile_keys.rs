//! Keys a client chooses (issue 37, items 2, 3, 6, 7 and 12), on real nodes:
//! a value in one key family never spells another family's key, keys joined
//! from parts stay apart, a 60 KB path puts a bounded key on the nodes (and
//! 10,000 of them a bounded amount of memory), a path ending in the waiters
//! flag's suffix is the client's mistake (400), and a lost lock's 503 names
//! the resource, not the Redis key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use axum::extract::State;
use axum::http::Uri;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::StreamExt;
use http::{HeaderName, StatusCode};
use redlock_core::LockHandle;
use redlock_core::request::MAX_KEY_BYTES;
use redlock_tests::http_timing::Inside;
use redlock_tests::{Cluster, RedisNode};
use redlock_tower::RedlockLayer;

/// The policy's default namespace, which every key below starts with.
const NAMESPACE: &str = "redlock:";

/// Inside the gauge for `?hold=<ms>`, or with `?gate` until the test opens the
/// gate; answers with the lock's key.
async fn hold(State(inside): State<Arc<Inside>>, uri: Uri, lock: Extension<LockHandle>) -> String {
    let _inside = inside.enter();
    if uri.query() == Some("gate") {
        inside.gate.passed().await;
    } else {
        tokio::time::sleep(hold_of(&uri)).await;
    }
    lock.key().to_owned()
}

/// Sends `first` (with its headers, holding until the second was answered),
/// waits until its handler is inside, then sends `second`; returns both
/// replies.
async fn while_the_first_holds(
    server: &Server,
    inside: &Inside,
    first: (&str, &[(&str, &str)]),
    second: (&str, &[(&str, &str)]),
) -> (Reply, Reply) {
    // Closed for this first request (an earlier one of the test opened it).
    inside.gate.close();
    let client = client();
    let first = tokio::spawn({
        let client = client.clone();
        let url = server.url(&format!("{}?gate", first.0));
        let headers: Vec<(String, String)> = first
            .1
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            http_get_with(&client, &url, &headers).await
        }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the first request never reached its handler"
    );
    let second = http_get_with(&client, &server.url(second.0), second.1).await;
    assert!(
        !first.is_finished(),
        "the first request must still hold its lock when the second is answered"
    );
    inside.gate.open();
    (first.await.unwrap(), second)
}

/// Item 7: `/transfers/{from}/{to}` under `by_path_params(["from", "to"])`
/// and `/tenant-jobs` under `by_header_as(x-tenant, "tenant")` on one handle.
/// A transfer from `tenant=acme` used to lock `redlock:tenant=acme`, tenant
/// acme's own lock, and acme's job got 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_value_cannot_take_another_family_s_lock() {
    let cluster = Cluster::start(3);
    let inside = Arc::new(Inside::default());
    let transfers = Router::new()
        .route("/transfers/{from}/{to}", get(hold))
        .route_layer(RedlockLayer::by_path_params(["from", "to"]));
    let jobs =
        Router::new()
            .route("/tenant-jobs", get(hold))
            .route_layer(RedlockLayer::by_header_as(
                HeaderName::from_static("x-tenant"),
                "tenant",
            ));
    let app = transfers
        .merge(jobs)
        .with_state(inside.clone())
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let (transfer, job) = while_the_first_holds(
        &server,
        &inside,
        ("/transfers/tenant=acme/x", &[]),
        ("/tenant-jobs", &[("x-tenant", "acme")]),
    )
    .await;
    assert_eq!(transfer.status, StatusCode::OK, "{}", transfer.text());
    assert_eq!(
        job.status,
        StatusCode::OK,
        "tenant acme's job must not wait for a transfer whose path says \
         `tenant=acme`: {}",
        job.text()
    );
    assert_eq!(job.text(), "redlock:tenant=acme");
    assert_ne!(transfer.text(), job.text());
}

/// Item 7, joins: a name and a value (`a` + `b=c` against `a=b` + `c`), and
/// the namespace and a key (`redlock:` + `jobs:job=7` against `redlock:jobs:`
/// + `job=7`), used to give one Redis key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_joined_from_parts_cannot_spell_each_other() {
    let cluster = Cluster::start(3);
    let inside = Arc::new(Inside::default());
    let header = HeaderName::from_static;
    let app = Router::new()
        .route("/one", get(hold))
        .route_layer(RedlockLayer::by_header_as(header("x-one"), "a"))
        .merge(
            Router::new()
                .route("/two", get(hold))
                .route_layer(RedlockLayer::by_header_as(header("x-two"), "a=b")),
        )
        .merge(
            Router::new()
                .route("/plain", get(hold))
                .route_layer(RedlockLayer::by_header(header("x-tenant"))),
        )
        .merge(Router::new().route("/jobs", get(hold)).route_layer(
            RedlockLayer::by_header_as(header("x-job"), "job").namespace("redlock:jobs:"),
        ))
        .with_state(inside.clone())
        .layer(Extension(cluster.patient_redlock()));
    let server = Server::start(app).await;

    let (one, two) = while_the_first_holds(
        &server,
        &inside,
        ("/one", &[("x-one", "b=c")]),
        ("/two", &[("x-two", "c")]),
    )
    .await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text());
    assert_eq!(
        two.status,
        StatusCode::OK,
        "`a` + `b=c` and `a=b` + `c` are two keys: {}",
        two.text()
    );
    assert_ne!(one.text(), two.text());

    let (plain, job) = while_the_first_holds(
        &server,
        &inside,
        ("/plain", &[("x-tenant", "jobs:job=7")]),
        ("/jobs", &[("x-job", "7")]),
    )
    .await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text());
    assert_eq!(
        job.status,
        StatusCode::OK,
        "a value under `redlock:` cannot reach into `redlock:jobs:`: {}",
        job.text()
    );
    assert_eq!(job.text(), "redlock:jobs:job=7");
    assert_ne!(plain.text(), job.text());
}

/// An app with `/o/{*rest}` under `by_path()`, a gauge of the handlers inside.
async fn wildcard_server(cluster: &Cluster, layer: RedlockLayer) -> (Server, Arc<Inside>) {
    let inside = Arc::new(Inside::default());
    let app = Router::new()
        .route("/o/{*rest}", get(hold).post(hold))
        .with_state(inside.clone())
        .layer(layer)
        .layer(Extension(cluster.patient_redlock()));
    (Server::start(app).await, inside)
}

/// Item 3: a path that ends with the waiters flag's suffix was answered 500
/// "misconfigured" (and logged at error level, see `hostile_keys_log.rs`).
/// It is the client's input: 400, problem+json, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_ending_in_the_reserved_suffix_is_a_bad_request() {
    let cluster = Cluster::start(3);
    let (server, _) = wildcard_server(&cluster, RedlockLayer::by_path()).await;
    let client = client();

    let reply = http_get(&client, &server.url("/o/x:redlock-waiters")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let doc = reply.json();
    assert_eq!(doc["status"], 400, "{doc}");
    assert_eq!(reply.retry_after(), None, "not worth retrying: {doc}");
    for node in cluster.nodes() {
        assert_eq!(node.keys(), Vec::<String>::new(), "nothing written");
    }
    let fine = http_get(&client, &server.url("/o/x:redlock-waiter")).await;
    assert_eq!(fine.status, StatusCode::OK, "{}", fine.text());
}

/// The longest key name on `node`, in bytes (`SCAN`, bounded).
fn longest_key(node: &RedisNode) -> usize {
    let mut cursor = "0".to_owned();
    let mut longest = 0;
    for _ in 0..10_000 {
        let (next, keys): (String, Vec<Vec<u8>>) =
            node.raw(&["SCAN", &cursor, "COUNT", "1000"]).expect("SCAN");
        longest = keys.iter().map(Vec::len).fold(longest, usize::max);
        if next == "0" {
            return longest;
        }
        cursor = next;
    }
    panic!("SCAN did not finish in 10,000 rounds");
}

/// The longest Redis key a request's lock may have here: the namespace and
/// the bounded key (no handle prefix, and no waiter sets a flag).
const KEY_BOUND: usize = NAMESPACE.len() + MAX_KEY_BYTES;

/// Item 2: `/o/` + 60,000 × `a` put a 60,011-byte key on every node. The key
/// is bounded, keeps a readable start, and still names one path: the same
/// path is busy, a path differing only in its last byte is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_60_kb_path_puts_a_bounded_key_on_every_node() {
    let cluster = Cluster::start(3);
    let (server, inside) = wildcard_server(&cluster, RedlockLayer::by_path()).await;
    let client = client();
    let long = format!("/o/{}", "a".repeat(60_000));
    let sibling = format!("/o/{}b", "a".repeat(59_999));

    let first = tokio::spawn({
        let (client, url) = (client.clone(), server.url(&format!("{long}?gate")));
        async move { http_get(&client, &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the first request never reached its handler"
    );
    assert!(
        eventually(timing::settled(), || cluster
            .nodes()
            .iter()
            .all(|n| !n.keys().is_empty()))
        .await,
        "the lock is on every node"
    );
    for (i, node) in cluster.nodes().iter().enumerate() {
        let longest = longest_key(node);
        assert!(
            longest <= KEY_BOUND,
            "node {i}: a key of {longest} bytes, over the bound of {KEY_BOUND}"
        );
    }
    let same = http_get(&client, &server.url(&long)).await;
    assert_eq!(same.status, StatusCode::CONFLICT, "{}", same.text());
    let other = http_get(&client, &server.url(&sibling)).await;
    assert_eq!(other.status, StatusCode::OK, "another path, another key");
    assert!(!first.is_finished(), "the first request still holds");
    inside.gate.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    let key = first.text();
    assert!(key.len() <= KEY_BOUND, "{key}");
    assert!(
        key.starts_with("redlock:/o/aaaa"),
        "a readable start: {key}"
    );
    assert_ne!(key, other.text());
}

/// `INFO memory`'s `name` field on `node`, in bytes.
fn memory(node: &RedisNode, name: &str) -> u64 {
    let info: String = node.raw(&["INFO", "memory"]).expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO memory"))
}

/// Item 6: 10,000 requests with distinct 60 KB paths, 32 at a time. While
/// they run, a node holds at most 32 locks, each at most `KEY_BOUND` bytes
/// of name (and a few hundred bytes of token, expiry and bookkeeping), and
/// receives at most 32 lock or release commands at once, each carrying the
/// name once: `used_memory_peak` stays within 32 × (2 × KEY_BOUND + 1 KiB)
/// of the baseline, plus 512 KiB for what Redis itself allocates meanwhile
/// (client buffers, the allocator's rounding); checked after every 1,000
/// requests. Unbounded, a node held 32 × 60 KB names and as much in its
/// query buffers. Once the lock TTL has passed, no key is left and
/// `used_memory` is back within 256 KiB of the baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_60_kb_paths_stay_within_a_memory_bound() {
    const REQUESTS: usize = 10_000;
    const BATCH: usize = 1_000;
    const CONCURRENCY: usize = 32;
    const TTL: Duration = Duration::from_secs(2);
    let per_request = 2 * KEY_BOUND as u64 + 1024;
    let bound = CONCURRENCY as u64 * per_request + 512 * 1024;

    let cluster = Cluster::start(3);
    let app = Router::new()
        .route("/o/{*rest}", get(|| async { "ok" }))
        .layer(RedlockLayer::by_path().ttl(TTL))
        .layer(Extension(redlock_with_timeout(&cluster, ms(500))));
    let server = Arc::new(Server::start(app).await);
    let client = client();
    let run = |paths: Vec<String>| {
        let (client, server) = (client.clone(), server.clone());
        async move {
            futures_util::stream::iter(paths)
                .map(|path| {
                    let (client, url) = (client.clone(), server.url(&path));
                    async move { http_get(&client, &url).await.status }
                })
                .buffer_unordered(CONCURRENCY)
                .collect::<Vec<StatusCode>>()
                .await
        }
    };
    // Warm up: connections, scripts and buffers at this concurrency.
    let warm = run((0..4 * CONCURRENCY)
        .map(|i| format!("/o/warm-{i}"))
        .collect())
    .await;
    assert!(warm.iter().all(|s| *s == StatusCode::OK), "{warm:?}");
    let baseline: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|n| memory(n, "used_memory"))
        .collect();

    let filler = "a".repeat(60_000);
    let started = Instant::now();
    let mut statuses = Vec::with_capacity(REQUESTS);
    for batch in 0..REQUESTS / BATCH {
        let paths = (batch * BATCH..(batch + 1) * BATCH)
            .map(|i| format!("/o/{i}-{filler}"))
            .collect();
        statuses.extend(within(Duration::from_secs(300), "1,000 requests", run(paths)).await);
        for (i, node) in cluster.nodes().iter().enumerate() {
            let peak = memory(node, "used_memory_peak");
            let grew = peak.saturating_sub(baseline[i]);
            assert!(
                grew <= bound,
                "node {i}, after {} requests: used_memory_peak grew by {grew} B over the \
                 baseline of {} B; bound {bound} B",
                statuses.len(),
                baseline[i]
            );
        }
    }
    let took = started.elapsed();
    let peaks: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|n| memory(n, "used_memory_peak"))
        .collect();
    eprintln!(
        "{REQUESTS} requests in {took:?}; baseline {baseline:?} B, peak {peaks:?} B, bound +{bound} B"
    );
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!(
        !statuses.contains(&StatusCode::CONFLICT),
        "distinct paths never share a lock"
    );
    // A loaded machine may time a node out now and then (503); the bound
    // above is only worth something if most requests took their lock.
    assert!(ok >= REQUESTS * 9 / 10, "only {ok} of {REQUESTS} locked");
    // The keys expire within the TTL; the last releases within a node timeout.
    let settled = eventually(liveness(TTL + ms(500)), || {
        cluster.nodes().iter().enumerate().all(|(i, n)| {
            n.raw::<u64>(&["DBSIZE"]).expect("DBSIZE") == 0
                && memory(n, "used_memory") <= baseline[i] + 256 * 1024
        })
    })
    .await;
    let now: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|n| memory(n, "used_memory"))
        .collect();
    assert!(
        settled,
        "nodes not back near the baseline {baseline:?} within {:?}: {now:?}",
        liveness(TTL + ms(500))
    );
}

/// Item 12: the 503 of a lost lock named the Redis key, with the handle's
/// key prefix; the busy and unavailable answers name the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_s_503_names_the_resource() {
    let cluster = Cluster::start(3);
    let redlock = redlock_core::Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(200))
        .key_prefix("app1:")
        .build()
        .unwrap();
    let inside = Arc::new(Inside::default());
    let app = Router::new()
        .route("/o/{*rest}", get(hold))
        .with_state(inside.clone())
        .layer(RedlockLayer::by_path().ttl(Duration::from_secs(2)))
        .layer(Extension(redlock));
    let server = Server::start(app).await;
    let client = client();

    let request = tokio::spawn({
        // Held until the loss drops the handler (the gate never opens).
        let (client, url) = (client.clone(), server.url("/o/work?gate"));
        async move { http_get(&client, &url).await }
    });
    assert!(
        eventually(answered(Duration::ZERO), || inside.now() == 1).await,
        "the handler never ran"
    );
    let key = "app1:redlock:/o/work";
    assert!(
        on_every_node(&cluster, key).await,
        "the lock is on every node"
    );
    let busy = http_get(&client, &server.url("/o/work")).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(busy.json()["key"], "redlock:/o/work", "{}", busy.text());
    for i in 0..2 {
        cluster.node(i).cmd(&["DEL", key]);
    }
    let reply = within(liveness(Duration::from_secs(2)), "the 503", request)
        .await
        .unwrap();
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    let doc = reply.json();
    assert_eq!(doc["title"], "Lock lost", "{doc}");
    assert_eq!(
        doc["key"], "redlock:/o/work",
        "the resource, as busy answers it: {doc}"
    );
}
