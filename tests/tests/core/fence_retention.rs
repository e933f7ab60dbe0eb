//! Durable fencing counters of per-request resources (issue 37, item 6) on
//! real `redis-server` processes: an idempotency key's counter is gone a
//! bounded time after its record, a request lock's counter after the
//! retention its policy names, a named resource's counter still never
//! expires, and a per-request resource's tokens still grow while a record
//! of it lives.

use std::time::{Duration, Instant};

use redlock_core::idempotency::{Idempotency, IdempotencyPolicy, RedisStore};
use redlock_core::request::{self, LockPolicy};
use redlock_core::{FencingMode, LockOptions, Redlock};
use redlock_tests::timing;
use redlock_tests::util::eventually;
use redlock_tests::{Cluster, RedisNode};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const RECORD_TTL: Duration = Duration::from_secs(1);
const LOCK_TTL: Duration = Duration::from_secs(1);
const MAX_HOLD: Duration = Duration::from_secs(2);

/// The bound the docs state: a retained counter expires `span + span/100 +
/// 1 s` after its last fence, `span` the hold cap, the lock's TTL and the
/// retention together.
fn counter_bound(keep: Duration) -> Duration {
    let span = MAX_HOLD + LOCK_TTL + keep;
    span + span / 100 + Duration::from_secs(1)
}

/// Asserts that every fence counter on every node expires, within `bound`
/// from now: the exact check of the retention (the wait for the keys to be
/// gone is liveness, bounded by [`timing::liveness`]).
fn every_counter_expires_within(cluster: &Cluster, bound: Duration) {
    for (i, node) in cluster.nodes().iter().enumerate() {
        for (key, pttl) in counters(node) {
            assert!(
                pttl > 0 && pttl <= bound.as_millis() as i64,
                "node {i}: {key} has PTTL {pttl} ms, the bound {bound:?}"
            );
        }
    }
}

/// A Durable fencing handle over `cluster`, its connections up.
async fn durable(cluster: &Cluster) -> Redlock {
    // As patient as the locks' 1 s TTL allows (a node timeout must be
    // shorter than it): the subject is the counters' expiry, not a slow node.
    let redlock = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(LOCK_TTL / 2)
        .fencing(FencingMode::Durable)
        .build()
        .unwrap();
    let infos = redlock.check_nodes().await.unwrap();
    assert!(infos.iter().all(|i| i.error.is_none()), "{infos:?}");
    redlock
}

/// Every fence counter on `node`, with its `PTTL` (`-1`: no expiry).
fn counters(node: &RedisNode) -> Vec<(String, i64)> {
    let keys: Vec<Vec<u8>> = node.raw_bytes(&[b"KEYS", b"\xfffence:*"]).unwrap();
    keys.into_iter()
        .map(|k| {
            let pttl: i64 = node.raw_bytes(&[b"PTTL", &k]).unwrap();
            (String::from_utf8_lossy(&k).into_owned(), pttl)
        })
        .collect()
}

/// The counter of lock key `key` on `node`: its value and `PTTL`.
fn counter_of(node: &RedisNode, key: &str) -> (Option<u64>, i64) {
    // The counter is named by the key's tag: `{key}` for a plain key.
    let mut k = b"\xfffence:{".to_vec();
    k.extend_from_slice(key.as_bytes());
    k.push(b'}');
    let v: Option<String> = node.raw_bytes(&[b"GET", &k]).unwrap();
    let pttl: i64 = node.raw_bytes(&[b"PTTL", &k]).unwrap();
    (v.map(|s| s.parse().unwrap()), pttl)
}

/// Polls every node until no fence counter is left, up to `deadline`;
/// panics with what is left.
async fn no_counter_left_by(cluster: &Cluster, deadline: Instant, what: &str) {
    let left = deadline.saturating_duration_since(Instant::now());
    let gone = eventually(left, || {
        cluster.nodes().iter().all(|n| counters(n).is_empty())
    })
    .await;
    if !gone {
        let left: Vec<_> = cluster.nodes().iter().map(|n| counters(n)).collect();
        let sample: Vec<_> = left[0].iter().take(3).collect();
        panic!(
            "{what}: {} counters left on node 0 ({} / {} on nodes 1 / 2), e.g. {sample:?}",
            left[0].len(),
            left[1].len(),
            left[2].len(),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_counters_of_idempotency_keys_go_with_their_records() {
    let cluster = Cluster::start(3);
    let redlock = durable(&cluster).await;
    let idem = Idempotency::new(redlock.clone())
        .store(RedisStore::new(redlock.clone()).record_ttl(RECORD_TTL))
        .policy(IdempotencyPolicy::default().lock(|l| l.ttl(LOCK_TTL).max_hold(MAX_HOLD)));
    for i in 0..50 {
        let ran = super::idempotency::request(&idem, None, &format!("key-{i}"), "{}").await;
        assert_eq!(ran.unwrap(), None, "request {i} ran");
    }
    let done = Instant::now();
    let made = counters(cluster.node(0)).len();
    assert!(made >= 1, "the requests fenced nothing on node 0");
    // Every record was written before `done`, so all are gone by
    // `done + RECORD_TTL`: the counters may outlive them by the bound less
    // the retention (the record's TTL).
    // A counter expires at most `counter_bound` after its fence, which came
    // before `done`: checked exactly on every counter there now.
    every_counter_expires_within(&cluster, counter_bound(RECORD_TTL));
    let records_gone = done + RECORD_TTL;
    let bound = counter_bound(RECORD_TTL) - RECORD_TTL;
    no_counter_left_by(
        &cluster,
        records_gone + timing::liveness(bound),
        &format!("{bound:?} (liveness) after the records expired"),
    )
    .await;
    let records: Vec<String> = cluster.node(0).raw(&["KEYS", "*:record"]).unwrap();
    assert!(records.is_empty(), "{records:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lock_s_counter_expires_after_the_policy_s_retention() {
    let cluster = Cluster::start(3);
    let redlock = durable(&cluster).await;
    let keep = Duration::from_secs(1);
    let policy = LockPolicy::default()
        .ttl(LOCK_TTL)
        .max_hold(MAX_HOLD)
        .fence_retention(keep);
    for i in 0..10 {
        let held = request::acquire(Some(&redlock), Some(format!("/orders/{i}")), &policy)
            .await
            .unwrap()
            .expect("locked");
        held.release().await;
    }
    let fenced = Instant::now();
    // The last key was fenced at a quorum a moment ago (the third node's
    // counter may be late or lost), far less than its retention: a quorum
    // holds its counter, each within the bound. An earlier key's counter may
    // already be gone on a loaded machine, so the last one is read.
    let bound = counter_bound(keep);
    let read: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| counter_of(n, "redlock:/orders/9"))
        .collect();
    let held = read.iter().filter(|(v, _)| v.is_some()).count();
    assert!(
        held >= 2,
        "the last key's counter on {held} nodes: {read:?}"
    );
    for &(value, pttl) in &read {
        assert!(
            value.is_none() || (pttl > 0 && pttl <= bound.as_millis() as i64),
            "PTTL {pttl} ms, the bound {bound:?}: {read:?}"
        );
    }
    every_counter_expires_within(&cluster, bound);
    no_counter_left_by(&cluster, fenced + timing::liveness(bound), "request locks").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lock_s_counter_keeps_a_day_by_default() {
    let cluster = Cluster::start(3);
    let redlock = durable(&cluster).await;
    let held = request::acquire(
        Some(&redlock),
        Some("/orders/7".into()),
        &LockPolicy::default(),
    )
    .await
    .unwrap()
    .expect("locked");
    held.release().await;
    let day = Duration::from_secs(24 * 3600);
    // The default: a day's retention, the request policy's hold cap
    // (`LockPolicy::DEFAULT_MAX_HOLD`), the 5 s TTL.
    let span = day + LockPolicy::DEFAULT_MAX_HOLD + Duration::from_secs(5);
    let most = span + span / 100 + Duration::from_secs(1);
    // The fence is decided at a quorum; the third node's may still be on
    // its way.
    let counters: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| counter_of(n, "redlock:/orders/7"))
        .collect();
    let fenced = counters.iter().filter(|(v, _)| *v == Some(1)).count();
    assert!(fenced >= 2, "{counters:?}");
    for &(value, pttl) in &counters {
        assert!(
            value.is_none()
                || (pttl > (most - Duration::from_secs(60)).as_millis() as i64
                    && pttl <= most.as_millis() as i64),
            "PTTL {pttl} ms, expected just under {most:?}: {counters:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_resource_s_durable_counter_still_never_expires() {
    let cluster = Cluster::start(3);
    let redlock = durable(&cluster).await;
    let lock = redlock
        .mutex("invoice:42")
        .try_acquire(LOCK_TTL)
        .await
        .unwrap();
    redlock.unlock(lock).await.unwrap();
    let guard = redlock
        .mutex("invoice:43")
        .guard(&LockOptions::new(LOCK_TTL).max_hold(MAX_HOLD))
        .await
        .unwrap();
    guard.release().await.unwrap();
    // A named lock after a per-request one on the same key makes the
    // counter permanent again.
    let per_request = LockOptions::new(LOCK_TTL)
        .max_hold(MAX_HOLD)
        .fence_retention(RECORD_TTL);
    let guard = redlock
        .mutex("invoice:44")
        .guard(&per_request)
        .await
        .unwrap();
    guard.release().await.unwrap();
    let lock = redlock
        .mutex("invoice:44")
        .try_acquire(LOCK_TTL)
        .await
        .unwrap();
    redlock.unlock(lock).await.unwrap();
    // Each fence is decided at a quorum: a quorum of nodes holds the last
    // token without expiry (the third node's fence may still be on its way).
    for (key, token) in [("invoice:42", 1), ("invoice:43", 1), ("invoice:44", 2)] {
        let counters: Vec<_> = cluster.nodes().iter().map(|n| counter_of(n, key)).collect();
        let permanent = counters.iter().filter(|&&c| c == (Some(token), -1)).count();
        assert!(permanent >= 2, "{key}: {counters:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_a_per_request_resource_grow_while_its_record_lives() {
    let cluster = Cluster::start(3);
    let redlock = durable(&cluster).await;
    let record_ttl = Duration::from_secs(3);
    let store = RedisStore::new(redlock.clone()).record_ttl(record_ttl);
    let idem = Idempotency::new(redlock.clone())
        .store(store.clone())
        .policy(IdempotencyPolicy::default().lock(|l| l.ttl(LOCK_TTL).max_hold(MAX_HOLD)));
    let ran = super::idempotency::request(&idem, None, "grow-1", "{}").await;
    assert_eq!(ran.unwrap(), None);
    let written = Instant::now();
    let lookup = idem.lookup_key(
        None,
        &redlock_core::idempotency::IdempotencyKey::parse(b"grow-1").unwrap(),
    );
    let recorded = redlock_core::idempotency::IdempotencyStore::get(&store, &lookup)
        .await
        .unwrap()
        .expect("the record")
        .fencing_token
        .expect("a fenced record");
    // Later holders of the key's lock, as the layer takes it, 400 ms apart:
    // at least three, and on until the record's last half second. Each token
    // is above the last.
    let options = LockOptions::new(LOCK_TTL)
        .max_hold(MAX_HOLD)
        .fence_retention(record_ttl);
    let mut last = recorded;
    let mut tokens = vec![recorded.get()];
    let last_fence = loop {
        let asked = Instant::now();
        let guard = redlock
            .mutex(lookup.resource())
            .guard(&options)
            .await
            .unwrap();
        let token = guard.handle().fencing_token().expect("fenced");
        guard.release().await.unwrap();
        tokens.push(token.get());
        assert!(token > last, "tokens {tokens:?}");
        last = token;
        if tokens.len() >= 4 && written.elapsed() >= record_ttl - ms(500) {
            break asked;
        }
        tokio::time::sleep(ms(400)).await;
    };
    let key = redlock.key_for(lookup.resource());
    let counters: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| counter_of(n, &key))
        .collect();
    // The last fence ran after it was asked for, and set the counter's
    // expiry to the bound of the record's retention: its PTTL now is at
    // least the bound less the time since, as the node's wall clock counts it
    // (within a thousandth of this process's clock: NTP slews by at most
    // half that), less a millisecond of rounding.
    let since = last_fence.elapsed();
    let since = since + since / 1000 + ms(1);
    let at_last: Vec<i64> = counters
        .iter()
        .filter(|(v, _)| *v == Some(last.get()))
        .map(|&(_, pttl)| pttl)
        .collect();
    assert!(at_last.len() >= 2, "{counters:?}");
    let floor = counter_bound(record_ttl).saturating_sub(since).as_millis() as i64;
    assert!(
        at_last.iter().all(|&pttl| pttl >= floor),
        "each fence refreshes the expiry (to at least {floor} ms, {since:?} after the last \
         was asked for): {counters:?}"
    );
}
