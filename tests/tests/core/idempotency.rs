//! The idempotency layer's core on real `redis-server` processes: key
//! validation, the record write refused to a stale holder on the nodes, the
//! quorum read, expiry, a node down, and scopes.

use std::time::Duration;

use bytes::Bytes;
use redlock_core::idempotency::{
    Begin, Fingerprint, Idempotency, IdempotencyKey, IdempotencyRejection, IdempotencyStore,
    KeyError, LookupKey, Outcome, Record, RedisStore, RequestParts, StoreError,
};
use redlock_core::{LockOptions, NodeStatus, Redlock};
use redlock_tests::Cluster;
use redlock_tests::util::eventually;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A handle over `cluster` whose connection to every node is up: on a cold
/// connection, two calls queued for it (a late `SET` and the record's write)
/// may go out in either order once it opens, and a node that gets the write
/// first rightly refuses it. The tests count records per node.
async fn redlock(cluster: &Cluster) -> Redlock {
    // The tests count calls and records per node: every call answered.
    let redlock = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap();
    let infos = redlock.check_nodes().await.unwrap();
    assert!(infos.iter().all(|i| i.error.is_none()), "{infos:?}");
    redlock
}

/// Three nodes, a handle over them, its Redis store and engine, and the
/// lookup key of the client key `raw`.
async fn three_nodes(raw: &str) -> (Cluster, Redlock, RedisStore, Idempotency, LookupKey) {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let store = RedisStore::new(redlock.clone());
    let idem = Idempotency::new(redlock.clone());
    let lookup = idem.lookup_key(None, &key(raw));
    (cluster, redlock, store, idem, lookup)
}

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::parse(s.as_bytes()).unwrap()
}

fn record(body: &'static str) -> Record {
    Record {
        order: 1,
        fencing_token: None,
        fingerprint: Fingerprint::of_fields([body.as_bytes()]),
        status: 201,
        outcome: Outcome::Replayable {
            headers: vec![("content-type".into(), Bytes::from_static(b"text/plain"))],
            body: Bytes::from_static(body.as_bytes()),
        },
    }
}

/// `POST /pay` with `body`.
fn post_pay<'a>(headers: &'a http::HeaderMap, body: &'a [u8]) -> RequestParts<'a> {
    RequestParts {
        method: "POST",
        path: "/pay",
        query: None,
        headers,
        body,
    }
}

/// Runs one request through the flow: `Ok(Some(status, body))` for a replay,
/// `Ok(None)` when it ran (and recorded `201 ran:<body>`).
pub(crate) async fn request(
    idem: &Idempotency,
    scope: Option<&str>,
    raw_key: &str,
    body: &str,
) -> Result<Option<(u16, Bytes)>, IdempotencyRejection> {
    let headers = http::HeaderMap::new();
    let parts = post_pay(&headers, body.as_bytes());
    match idem
        .begin(
            Some(IdempotencyKey::parse(raw_key.as_bytes())),
            scope,
            &parts,
        )
        .await?
    {
        Begin::Replay(r) => Ok(Some((r.status, r.body))),
        Begin::Run(running) => {
            let out = Bytes::from(format!("ran:{body}"));
            running
                .finish(
                    201,
                    [("content-type", &b"text/plain"[..])].into_iter(),
                    Some(out),
                )
                .await?;
            Ok(None)
        }
        Begin::PassThrough => panic!("a keyed request passed through"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_256_characters_is_refused_with_400() {
    let cluster = Cluster::start(3);
    let idem = Idempotency::new(redlock(&cluster).await);
    let long = "k".repeat(256);
    let err = request(&idem, None, &long, "{}").await.unwrap_err();
    assert!(
        matches!(
            err,
            IdempotencyRejection::InvalidKey(KeyError::TooLong { len: 256 })
        ),
        "{err:?}"
    );
    assert_eq!(err.status(), 400);
    let doc: serde_json::Value = serde_json::from_str(&err.problem_json()).unwrap();
    assert_eq!(doc["status"], 400);
    // 255 is fine, and so is a quoted form with a space.
    assert!(request(&idem, None, &"k".repeat(255), "{}").await.is_ok());
    assert!(request(&idem, None, "\"a b\"", "{}").await.is_ok());
    let err = request(&idem, None, "a b", "{}").await.unwrap_err();
    assert!(matches!(
        err,
        IdempotencyRejection::InvalidKey(KeyError::BadChar { at: 1 })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_s_record_is_refused_on_every_node() {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let store = RedisStore::new(redlock.clone());
    let lookup = LookupKey::new("idempotency:", None, &key("stale-1"));
    let options = LockOptions::new(Duration::from_secs(10));
    let stale = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    let stale_handle = stale.handle();
    // The acquire returns at a quorum; its third SET must have landed before
    // the keys are deleted, or it would land after and hold the stale token.
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .count_holding(stale_handle.key(), stale_handle.token())
            == 3)
        .await
    );
    // The stale holder's keys expire (deleted here, so the holder does not
    // know yet), and another holder takes the lock.
    for node in cluster.nodes() {
        node.cmd(&["DEL", stale_handle.key()]);
    }
    let next = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    assert!(
        !stale_handle.is_lost(),
        "the stale holder must not know yet"
    );
    let err = store
        .put(&lookup, &stale_handle, &record("stale"))
        .await
        .unwrap_err();
    let StoreError::NotHeld { report } = &err else {
        panic!("expected NotHeld, got {err:?}");
    };
    assert!(
        report
            .nodes
            .iter()
            .filter(|n| n.status == NodeStatus::NotHeld)
            .count()
            >= 2,
        "{report}"
    );
    let record_key = store.record_key(&lookup);
    assert_eq!(
        cluster.count_with_key(&record_key),
        0,
        "a node took the stale record"
    );
    // The current holder writes, on every node.
    store
        .put(&lookup, &next.handle(), &record("next"))
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .count_with_key(&record_key)
            == 3)
        .await
    );
    assert_eq!(store.get(&lookup).await.unwrap(), Some(record("next")));
    drop(stale);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_a_minority_does_not_answer_without_the_lock() {
    let (cluster, redlock, store, idem, lookup) = three_nodes("minority-1").await;
    assert_eq!(request(&idem, None, "minority-1", "a").await.unwrap(), None);
    let record_key = store.record_key(&lookup);
    // A quorum has it (a third copy is not promised: the lock's release may
    // reach that node first, and then the node refuses the record).
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .count_with_key(&record_key)
            >= 2)
        .await
    );
    let recorded = store.get(&lookup).await.unwrap().expect("a quorum has it");
    // All but one node lose it: one node's record alone never answers.
    let keep = (0..3)
        .find(|&i| cluster.node(i).pttl(&record_key) > 0)
        .unwrap();
    for i in (0..3).filter(|&i| i != keep) {
        cluster.node(i).cmd(&["DEL", &record_key]);
    }
    assert_eq!(store.get(&lookup).await.unwrap(), None);
    // Under the lock the record is found, not durable; the flow replays it
    // and writes it again, after which the fast path answers.
    let guard = redlock
        .mutex(lookup.resource())
        .guard(&LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    let found = store
        .get_held(&lookup, &guard.handle())
        .await
        .unwrap()
        .expect("found under the lock");
    assert!(!found.durable);
    assert_eq!(found.record, recorded);
    guard.release().await.unwrap();
    let replay = request(&idem, None, "minority-1", "a").await.unwrap();
    assert_eq!(replay, Some((201, Bytes::from_static(b"ran:a"))));
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .count_with_key(&record_key)
            >= 2)
        .await
    );
    // The same response, written again with the repairer's order (its
    // generation), so no copy elsewhere outranks it.
    let repaired = store.get(&lookup).await.unwrap().expect("repaired");
    assert!(repaired.order > recorded.order, "{repaired:?}");
    assert_eq!(
        Record {
            order: recorded.order,
            ..repaired
        },
        recorded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_after_their_ttl() {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let store = RedisStore::new(redlock.clone()).record_ttl(ms(1500));
    let idem = Idempotency::new(redlock.clone()).store(store.clone());
    let lookup = idem.lookup_key(None, &key("expire-1"));
    assert_eq!(request(&idem, None, "expire-1", "a").await.unwrap(), None);
    let record_key = store.record_key(&lookup);
    // The write counts at a quorum: read the PTTL where the record is.
    let pttl = cluster
        .nodes()
        .iter()
        .map(|n| n.pttl(&record_key))
        .max()
        .unwrap_or(-2);
    assert!((1..=1500).contains(&pttl), "record PTTL {pttl}");
    assert!(
        store.get(&lookup).await.unwrap().is_some(),
        "replayable before the TTL"
    );
    assert!(
        eventually(Duration::from_secs(10), || cluster
            .count_with_key(&record_key)
            == 0)
        .await
    );
    assert_eq!(store.get(&lookup).await.unwrap(), None);
    // Expired: the next copy runs again.
    assert_eq!(request(&idem, None, "expire-1", "a").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_of_three_down_still_records_and_replays() {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let idem = Idempotency::new(redlock.clone());
    cluster.node(2).kill();
    assert_eq!(request(&idem, None, "down-1", "a").await.unwrap(), None);
    let replay = request(&idem, None, "down-1", "a").await.unwrap();
    assert_eq!(replay, Some((201, Bytes::from_static(b"ran:a"))));
    let err = request(&idem, None, "down-1", "b").await.unwrap_err();
    assert_eq!(err.status(), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_scopes_with_one_key_do_not_see_each_other() {
    let cluster = Cluster::start(3);
    let idem = Idempotency::new(redlock(&cluster).await);
    assert_eq!(
        request(&idem, Some("tenant-a"), "same", "a").await.unwrap(),
        None
    );
    // Another scope, same client key, even another body: it runs.
    assert_eq!(
        request(&idem, Some("tenant-b"), "same", "b").await.unwrap(),
        None
    );
    assert_eq!(request(&idem, None, "same", "c").await.unwrap(), None);
    assert_eq!(
        request(&idem, Some("tenant-a"), "same", "a").await.unwrap(),
        Some((201, Bytes::from_static(b"ran:a")))
    );
    assert_eq!(
        request(&idem, Some("tenant-b"), "same", "b").await.unwrap(),
        Some((201, Bytes::from_static(b"ran:b")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_lock_the_newest_record_wins_by_fencing_token() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(200))
        .fencing(redlock_core::FencingMode::Hybrid)
        .build()
        .unwrap();
    // The flow's record carries the writer's fencing token as its order.
    let idem = Idempotency::new(redlock.clone());
    assert_eq!(request(&idem, None, "fenced-0", "a").await.unwrap(), None);
    let store = RedisStore::new(redlock.clone());
    let written = store
        .get(&idem.lookup_key(None, &key("fenced-0")))
        .await
        .unwrap()
        .expect("recorded");
    let token = written.fencing_token.expect("fenced record");
    assert_eq!(written.order, token.get());

    // Two holders' records on one node each: the older on node 0, the newer
    // on node 1, none on node 2.
    let lookup = LookupKey::new("idempotency:", None, &key("fenced-1"));
    let record_key = store.record_key(&lookup);
    let options = LockOptions::new(Duration::from_secs(5));
    let write = |guard: &redlock_core::LockGuard, body: &'static str| {
        let handle = guard.handle();
        let order = handle.fencing_token().unwrap().get();
        let store = store.clone();
        let lookup = lookup.clone();
        async move {
            let r = Record {
                order,
                fencing_token: handle.fencing_token(),
                ..record(body)
            };
            store.put(&lookup, &handle, &r).await.unwrap();
            r
        }
    };
    let first = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    let lock_key = first.handle().key().to_owned();
    let older = write(&first, "older").await;
    first.release().await.unwrap();
    let second = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    let newer = write(&second, "newer").await;
    second.release().await.unwrap();
    assert!(newer.order > older.order);
    // Each write is promised on a quorum only: on a node where a release
    // overtook the write, or the `SET` came after it, the node refuses it.
    // Once the lock key is gone everywhere no write of either holder can
    // still apply; then each node gets the record the scenario needs.
    assert!(
        eventually(Duration::from_secs(5), || cluster.count_with_key(&lock_key)
            == 0)
        .await,
        "the lock key is left on {} nodes",
        cluster.count_with_key(&lock_key)
    );
    for (node, record) in [(0, &older), (1, &newer)] {
        let set = [
            b"SET",
            record_key.as_bytes(),
            &record.encode(),
            b"PX",
            b"60000",
        ];
        let () = cluster.node(node).raw_bytes(&set).unwrap();
    }
    cluster.node(2).cmd(&["DEL", &record_key]);
    assert_eq!(store.get(&lookup).await.unwrap(), None, "no quorum agrees");
    let third = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    let found = store
        .get_held(&lookup, &third.handle())
        .await
        .unwrap()
        .expect("found under the lock");
    assert_eq!(found.record, newer);
    assert!(!found.durable);
    third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_ttl_of_duration_max_is_accepted() {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let store = RedisStore::new(redlock.clone()).record_ttl(Duration::MAX);
    let idem = Idempotency::new(redlock).store(store.clone());
    assert_eq!(request(&idem, None, "forever-1", "a").await.unwrap(), None);
    let record_key = store.record_key(&idem.lookup_key(None, &key("forever-1")));
    // On a quorum of nodes, with an expiry: a century, not "no TTL" (-1). A
    // node whose lock key the acquire had not reached when the record came
    // refuses it (the token check), so the third copy is not promised.
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .nodes()
            .iter()
            .filter(|n| n.pttl(&record_key) > 0)
            .count()
            >= 2)
        .await,
        "PTTLs {:?}",
        cluster
            .nodes()
            .iter()
            .map(|n| n.pttl(&record_key))
            .collect::<Vec<_>>()
    );
    assert!(
        cluster.nodes().iter().all(|n| n.pttl(&record_key) != -1),
        "a record without an expiry"
    );
}

/// The script calls of `monitor`'s clients that name `key` as their first
/// key of `nkeys` (`EVALSHA sha nkeys key ..`; an `EVAL` after a `NOSCRIPT`
/// is the same call again, so only `EVALSHA`s count).
fn scripts_on(monitor: &redlock_tests::monitor::Monitor, nkeys: &str, key: &str) -> usize {
    monitor
        .client_commands()
        .iter()
        .filter(|c| c.len() > 3 && c[0].eq_ignore_ascii_case("EVALSHA"))
        .filter(|c| c[2] == nkeys && c[3] == key)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_reads_the_record_with_its_acquire_not_again() {
    let (cluster, _redlock, store, idem, lookup) = three_nodes("one-read-1").await;
    let record_key = store.record_key(&lookup);
    let monitors: Vec<_> = cluster.nodes().iter().map(|n| n.monitor()).collect();
    assert_eq!(request(&idem, None, "one-read-1", "a").await.unwrap(), None);
    // The record's write and the lock's release finish in the background.
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .count_with_key(&record_key)
            >= 2
            && cluster.count_with_key(lookup.resource()) == 0)
        .await
    );
    // The request returned at quorum: the last node's peek, and what its
    // monitor says of it, may still be on their way.
    eventually(redlock_tests::timing::settled(), || {
        monitors
            .iter()
            .all(|m| scripts_on(m, "2", &record_key) >= 1)
    })
    .await;
    for (i, monitor) in monitors.iter().enumerate() {
        // One read of the record with the lock key (the peek, sent after the
        // `SET`), and no read of the record alone (the read under the lock).
        assert_eq!(scripts_on(monitor, "2", &record_key), 1, "node {i}");
        assert_eq!(scripts_on(monitor, "1", &record_key), 0, "node {i}");
    }
    // The replay too: one peek per node, no read under the lock.
    assert_eq!(
        request(&idem, None, "one-read-1", "a").await.unwrap(),
        Some((201, Bytes::from_static(b"ran:a")))
    );
    assert!(
        eventually(Duration::from_secs(5), || monitors
            .iter()
            .filter(|m| scripts_on(m, "2", &record_key) == 2)
            .count()
            >= 2)
        .await
    );
    for (i, monitor) in monitors.iter().enumerate() {
        assert_eq!(scripts_on(monitor, "1", &record_key), 0, "node {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_waited_for_the_lock_replays_the_record_not_runs() {
    // The second copy's fast read runs while the first holds the lock, so it
    // finds no record, and its acquire is answered only after the first
    // wrote its record and released: that read is not a read under the
    // second copy's lock, and must not decide for it.
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let store = RedisStore::new(redlock.clone());
    let idem = Idempotency::new(redlock.clone()).policy(
        redlock_core::idempotency::IdempotencyPolicy::default()
            .lock(|l| l.wait(Duration::from_secs(20))),
    );
    let lookup = idem.lookup_key(None, &key("waited-1"));
    let record_key = store.record_key(&lookup);
    let monitor = cluster.node(0).monitor();
    let headers = http::HeaderMap::new();
    let parts = post_pay(&headers, b"a");
    let Begin::Run(first) = idem
        .begin(Some(IdempotencyKey::parse(b"waited-1")), None, &parts)
        .await
        .unwrap()
    else {
        panic!("the first copy must run");
    };
    let second = {
        let idem = idem.clone();
        tokio::spawn(async move { request(&idem, None, "waited-1", "a").await })
    };
    // The second copy's peek has run on node 0 (the first copy's is one).
    assert!(
        eventually(Duration::from_secs(10), || scripts_on(
            &monitor,
            "2",
            &record_key
        ) >= 2)
        .await
    );
    assert!(
        !second.is_finished(),
        "the second copy must wait for the lock"
    );
    first
        .finish(
            201,
            [("content-type", &b"text/plain"[..])].into_iter(),
            Some(Bytes::from_static(b"first")),
        )
        .await
        .unwrap();
    let replay = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second copy finishes")
        .unwrap()
        .unwrap();
    assert_eq!(
        replay,
        Some((201, Bytes::from_static(b"first"))),
        "the second copy ran the work again"
    );
}
