//! Several resources under one lock (issue 22) on real `redis-server`
//! processes: two clients locking {A, B} and {B, A} (and a third locking A
//! alone) never deadlock and never overlap; a node holding one of the keys
//! for someone else does not count; the quorum rule for every way of spreading
//! foreign keys over N = 3 and 5 nodes; a partial acquire released
//! everywhere; extend refused once one key was taken on a quorum; release
//! waking the waiters of either key; a guard renewing every key; one fencing
//! token per resource; deduplication, order and the limit on the number of
//! resources.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Error, FencingMode, LockOptions, MAX_RESOURCES, Redlock, RetryPolicy};
use redlock_tests::Cluster;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

const FOREIGN: &str = "held-by-someone-else";

/// Every node holds the foreign value at each key it was given one at, and
/// nothing at the others, within 3 s (a late answer's release runs in the
/// background).
fn eventually_only_foreign(
    cluster: &Cluster,
    foreign: &[(usize, &str)],
    keys: &[&str],
) -> Result<(), String> {
    let check = |c: &Cluster| -> Result<(), String> {
        for (i, node) in c.nodes().iter().enumerate() {
            for &key in keys {
                let expected = foreign
                    .iter()
                    .any(|&(n, k)| n == i && k == key)
                    .then(|| FOREIGN.to_owned());
                let value = node.get(key);
                if value != expected {
                    return Err(format!(
                        "node {i}, key {key}: {value:?}, expected {expected:?}"
                    ));
                }
            }
        }
        Ok(())
    };
    let mut last = Ok(());
    cluster.wait_until(Duration::from_secs(3), |c| {
        last = check(c);
        last.is_ok()
    });
    last
}

/// The overlap check: how many holders each key has right now.
#[derive(Default)]
struct Holders {
    a: AtomicUsize,
    b: AtomicUsize,
    overlaps: AtomicU64,
}

impl Holders {
    fn counter(&self, resource: &str) -> &AtomicUsize {
        match resource {
            "A" => &self.a,
            "B" => &self.b,
            other => panic!("unexpected resource {other}"),
        }
    }

    fn enter(&self, resources: &[&str]) {
        for r in resources {
            if self.counter(r).fetch_add(1, Ordering::SeqCst) != 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn leave(&self, resources: &[&str]) {
        for r in resources {
            self.counter(r).fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Two clients (each its own handle, as two processes would be) lock {A, B}
/// and {B, A} in a loop, and a third locks A alone: every acquire succeeds
/// within its deadline (no deadlock, no livelock), and no key ever has two
/// holders at once (checked inside each holder's validity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_nor_overlap() {
    const ITERATIONS: usize = 300;
    let bound = Duration::from_secs(60);
    let cluster = Cluster::start(3);
    let holders = Arc::new(Holders::default());
    let begin = Instant::now();
    let mut tasks = Vec::new();
    for (client, set) in [vec!["A", "B"], vec!["B", "A"], vec!["A"]]
        .into_iter()
        .enumerate()
    {
        let rl = redlock(&cluster, ms(200));
        rl.check_nodes().await.unwrap();
        let holders = Arc::clone(&holders);
        tasks.push(tokio::spawn(async move {
            let retry = RetryPolicy::deadline(Duration::from_secs(10));
            let mut done = 0;
            while done < ITERATIONS && begin.elapsed() < bound {
                let lock = rl
                    .lock_many_with(&set, Duration::from_secs(5), &retry)
                    .await
                    .unwrap_or_else(|e| panic!("client {client} ({set:?}), iteration {done}: {e}"));
                let held = lock.resources();
                assert_eq!(held.len(), set.len());
                holders.enter(&held);
                tokio::task::yield_now().await;
                // Only an overlap inside the validity would break the promise.
                assert!(
                    lock.is_valid(),
                    "client {client}: validity ran out while held"
                );
                holders.leave(&held);
                rl.unlock(lock).await.unwrap();
                done += 1;
            }
            done
        }));
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await.unwrap());
    }
    let overlaps = holders.overlaps.load(Ordering::SeqCst);
    println!(
        "many: {counts:?} iterations per client ({{A,B}}, {{B,A}}, {{A}}) in {:?}, {overlaps} overlaps",
        begin.elapsed()
    );
    assert_eq!(overlaps, 0);
    assert!(
        counts.iter().all(|&c| c == ITERATIONS),
        "not every client finished {ITERATIONS} iterations within {bound:?}: {counts:?}"
    );
}

/// A node where one of the keys is held by someone else does not count, even
/// though each key alone is free on a quorum: node 0 has a foreign A, node 1 a
/// foreign B, so only node 2 could set both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_one_key_for_another_does_not_count() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(500));
    rl.check_nodes().await.unwrap();
    cluster.node(0).cmd(&["SET", "fa", FOREIGN, "PX", "30000"]);
    cluster.node(1).cmd(&["SET", "fb", FOREIGN, "PX", "30000"]);
    let err = rl
        .try_lock_many(["fa", "fb"], Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // Node 2 set both and was released; nodes 0 and 1 set nothing.
    eventually_only_foreign(&cluster, &[(0, "fa"), (1, "fb")], &["fa", "fb"]).unwrap();
    // Each key alone is free on a quorum.
    for key in ["fa", "fb"] {
        let lock = rl.try_lock(key, Duration::from_secs(10)).await.unwrap();
        rl.unlock(lock).await.unwrap();
    }
}

/// For every way of putting a foreign value at A, at B, or at neither on each
/// node (3^N cases), locking {A, B} succeeds iff the nodes with neither form a
/// quorum; afterwards (unlocked, or failed) only the foreign values are left.
async fn check_every_spread(n: usize) {
    let cluster = Cluster::start(n);
    let rl = redlock(&cluster, ms(500));
    rl.check_nodes().await.unwrap();
    let quorum = n / 2 + 1;
    let (mut successes, mut failures) = (0, 0);
    for case in 0..3usize.pow(n as u32) {
        let (a, b) = (
            format!("spread:{n}:{case}:a"),
            format!("spread:{n}:{case}:b"),
        );
        let mut foreign: Vec<(usize, &str)> = Vec::new();
        let mut rest = case;
        for i in 0..n {
            match rest % 3 {
                1 => foreign.push((i, &a)),
                2 => foreign.push((i, &b)),
                _ => {}
            }
            rest /= 3;
        }
        for &(i, key) in &foreign {
            cluster.node(i).cmd(&["SET", key, FOREIGN, "PX", "30000"]);
        }
        let free = n - foreign.len();
        let what = format!("N={n}, foreign {foreign:?}");
        match rl.try_lock_many([&a, &b], Duration::from_secs(10)).await {
            Ok(lock) => {
                assert!(free >= quorum, "{what}: locked with {free} free nodes");
                successes += 1;
                let holding = cluster
                    .nodes()
                    .iter()
                    .filter(|node| {
                        node.get(&a).as_deref() == Some(lock.token())
                            && node.get(&b).as_deref() == Some(lock.token())
                    })
                    .count();
                assert!(
                    holding >= quorum && holding <= free,
                    "{what}: {holding} nodes hold both"
                );
                rl.unlock(lock).await.unwrap();
            }
            Err(e) => {
                assert!(free < quorum, "{what}: refused with {free} free nodes: {e}");
                assert!(matches!(e, Error::Busy { .. }), "{what}: {e:?}");
                failures += 1;
            }
        }
        eventually_only_foreign(&cluster, &foreign, &[&a, &b])
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    assert!(successes > 0 && failures > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_the_nodes_with_neither_key_are_a_quorum_three_nodes() {
    check_every_spread(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_the_nodes_with_neither_key_are_a_quorum_five_nodes() {
    check_every_spread(5).await;
}

/// An attempt that set both keys on a minority is released there: two of five
/// nodes are free, the other three hold one key or the other for someone
/// else; the two free nodes end with neither key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_acquire_is_released_everywhere() {
    let cluster = Cluster::start(5);
    let rl = redlock(&cluster, ms(500));
    rl.check_nodes().await.unwrap();
    let foreign = [(0, "pa"), (1, "pb"), (2, "pa"), (2, "pb")];
    for &(i, key) in &foreign {
        cluster.node(i).cmd(&["SET", key, FOREIGN, "PX", "30000"]);
    }
    let monitors: Vec<_> = [3, 4].iter().map(|&i| cluster.node(i).monitor()).collect();
    let err = rl
        .try_lock_many(["pa", "pb"], Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    eventually_only_foreign(&cluster, &foreign, &["pa", "pb"]).unwrap();
    // The free nodes did take both keys before the release.
    for m in &monitors {
        let set_both = |m: &redlock_tests::monitor::Monitor| {
            let lines = m.lines();
            ["pa", "pb"].iter().all(|k| {
                lines
                    .iter()
                    .any(|l| l.contains(&format!("\"SET\" \"{k}\"")))
            })
        };
        assert!(
            cluster.wait_until(Duration::from_secs(3), |_| set_both(m)),
            "a free node never set both keys: {:?}",
            m.lines()
        );
    }
}

/// Extend counts a node only if every key still holds the token there: with
/// B taken by someone else on two of three nodes, the extend is refused, and
/// it did not push A's expiry on those nodes either. With B taken on one node
/// only, it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_fails_when_one_key_was_stolen_on_a_quorum() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(500));
    rl.check_nodes().await.unwrap();
    let mut lock = rl.try_lock_many(["xa", "xb"], ms(5000)).await.unwrap();
    assert!(cluster.wait_until(
        Duration::from_secs(3),
        |c| c.count_holding("xb", lock.token()) == 3
    ));
    cluster.node(0).cmd(&["SET", "xb", FOREIGN, "PX", "30000"]);
    rl.extend(&mut lock, ms(5000)).await.unwrap();
    cluster.node(1).cmd(&["SET", "xb", FOREIGN, "PX", "30000"]);
    let err = rl.extend(&mut lock, ms(20_000)).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    // All or none on a node: A keeps its old expiry where B was taken.
    for i in [0, 1] {
        let pttl = cluster.node(i).pttl("xa");
        assert!(
            pttl <= 5000,
            "node {i}: xa pttl {pttl} after a refused extend"
        );
    }
    rl.unlock(lock).await.unwrap();
    eventually_only_foreign(&cluster, &[(0, "xb"), (1, "xb")], &["xa", "xb"]).unwrap();
}

/// A release deletes every key and announces each: a waiter on A alone and a
/// waiter on {B, C}, both polling every 5 s, are woken by the release of
/// {A, B} long before.
/// Two handles with checked nodes, and a policy whose 5 s poll is far too
/// slow for the wake-up tests: only a release heard can pass them.
async fn holder_waiter_and_slow_poll(cluster: &Cluster) -> (Redlock, Redlock, RetryPolicy) {
    let holder = redlock(cluster, ms(2000));
    let waiter = redlock(cluster, ms(2000));
    holder.check_nodes().await.unwrap();
    waiter.check_nodes().await.unwrap();
    let slow = RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(Duration::from_secs(5))
        .with_jitter(Duration::ZERO);
    (holder, waiter, slow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_the_waiters_of_every_key() {
    let cluster = Cluster::start(3);
    let (holder, waiter, slow) = holder_waiter_and_slow_poll(&cluster).await;
    let lock = holder
        .try_lock_many(["wa", "wb"], Duration::from_secs(15))
        .await
        .unwrap();
    let (w1, w2) = (waiter.clone(), waiter.clone());
    let (s1, s2) = (slow.clone(), slow.clone());
    let one = tokio::spawn(async move { w1.lock_with("wa", Duration::from_secs(5), &s1).await });
    let set = tokio::spawn(async move {
        w2.lock_many_with(["wc", "wb"], Duration::from_secs(5), &s2)
            .await
    });
    // Both waiters subscribed (after their first failed attempt) on every node.
    let subscribed = |key: &str| {
        cluster.nodes().iter().all(|n| {
            let v: Vec<redlock_core::deadpool_redis::redis::Value> = n
                .raw(&["PUBSUB", "NUMSUB", &format!("redlock:released:0:{key}")])
                .unwrap();
            matches!(
                v.get(1),
                Some(redlock_core::deadpool_redis::redis::Value::Int(1))
            )
        })
    };
    assert!(
        cluster.wait_until(Duration::from_secs(10), |_| subscribed("wa")
            && subscribed("wb"))
    );
    let released = Instant::now();
    holder.unlock(lock).await.unwrap();
    let a = one.await.unwrap().unwrap();
    let s = set.await.unwrap().unwrap();
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "woken {waited:?} after the release"
    );
    assert_eq!(s.resources(), ["wb", "wc"]);
    waiter.unlock(a).await.unwrap();
    waiter.unlock(s).await.unwrap();
}

/// A set's waiter flags its keys before each attempt once subscribed, so the
/// release of a single-key lock on one of them (which announces itself only
/// to flagged keys) wakes it long before its 5 s poll and the holder's 15 s
/// TTL; the waiter's own release deletes its flags wherever it held the set.
/// Where it did not (the holder's release of `fb` reached that node after the
/// waiter's winning attempt, which still took a quorum), the release deletes
/// nothing, so the flag of `fc` stays there until its TTL: another waiter may
/// rely on it, and a flag nobody needs costs a later release one `PUBLISH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_key_release_wakes_the_waiter_of_a_set() {
    let cluster = Cluster::start(3);
    let (holder, waiter, slow) = holder_waiter_and_slow_poll(&cluster).await;
    let lock = holder
        .try_lock("fb", Duration::from_secs(15))
        .await
        .unwrap();
    let set = tokio::spawn(async move {
        waiter
            .lock_many_with(["fc", "fb"], Duration::from_secs(5), &slow)
            .await
            .map(|l| (l, waiter))
    });
    // Subscribed, and its keys flagged on every node.
    assert!(
        cluster.wait_until(Duration::from_secs(10), |c| c.nodes().iter().all(|n| {
            n.pttl("fb:redlock-waiters") > 0 && n.pttl("fc:redlock-waiters") > 0
        })),
        "the waiter never flagged its keys"
    );
    let released = Instant::now();
    holder.unlock(lock).await.unwrap();
    let (s, waiter) = set.await.unwrap().unwrap();
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "woken {waited:?} after the release"
    );
    assert_eq!(s.resources(), ["fb", "fc"]);
    // The nodes where the set was taken: both keys hold its token there.
    let held: Vec<bool> = cluster
        .nodes()
        .iter()
        .map(|n| {
            n.get("fb").as_deref() == Some(s.token()) && n.get("fc").as_deref() == Some(s.token())
        })
        .collect();
    assert!(held.iter().filter(|h| **h).count() >= 2, "held on {held:?}");
    eprintln!("the set was taken on nodes {held:?}");
    waiter.unlock(s).await.unwrap();
    // Only the flag of `fc` may stay, and only on a node where the set was not
    // taken (with its TTL, so it goes by itself).
    let may_stay = |i: usize, k: &str| !held[i] && k == "fc:redlock-waiters";
    assert!(
        cluster.wait_until(Duration::from_secs(5), |c| c
            .nodes()
            .iter()
            .enumerate()
            .all(|(i, n)| n
                .keys()
                .iter()
                .all(|k| !k.starts_with('f') || (may_stay(i, k) && n.pttl(k) > 0)))),
        "keys left: {:?}, the set held on {held:?}",
        cluster.nodes().iter().map(|n| n.keys()).collect::<Vec<_>>()
    );
}

/// A guard on a set renews every key: held for three TTLs, not lost, and
/// both keys still hold the token; the release deletes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_renews_every_key() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(100));
    rl.check_nodes().await.unwrap();
    let guard = rl
        .lock_guard_many(["ga", "gb"], &LockOptions::new(ms(600)))
        .await
        .unwrap();
    tokio::time::sleep(ms(1800)).await;
    assert!(!guard.is_lost());
    let token_a = cluster.node(0).get("ga").unwrap();
    assert_eq!(cluster.node(0).get("gb"), Some(token_a.clone()));
    assert!(
        cluster.count_holding("ga", &token_a) >= 2 && cluster.count_holding("gb", &token_a) >= 2
    );
    guard.release().await.unwrap();
    eventually_only_foreign(&cluster, &[], &["ga", "gb"]).unwrap();
    let n = rl
        .with_lock_many(["ga", "gb"], &LockOptions::new(ms(600)), |h| async move {
            assert!(!h.is_lost());
            7
        })
        .await
        .unwrap();
    assert_eq!(n, 7);
}

/// With fencing on, a lock on a set carries one token per resource, each
/// larger than every earlier holder's token for that resource, whether that
/// holder locked the resource alone or in a set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_gives_one_monotone_token_per_resource() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(500))
        .fencing(FencingMode::Durable)
        .build()
        .unwrap();
    rl.check_nodes().await.unwrap();
    let first = rl
        .try_lock_many(["fb", "fa"], Duration::from_secs(5))
        .await
        .unwrap();
    let t1: Vec<(String, u64)> = first
        .fencing_tokens()
        .iter()
        .map(|(r, t)| (r.to_string(), t.get()))
        .collect();
    assert_eq!(
        t1.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["fa", "fb"]
    );
    rl.unlock(first).await.unwrap();
    // A alone three times: A's counter moves on, B's does not.
    let mut last_a = t1[0].1;
    for _ in 0..3 {
        let lock = rl.try_lock("fa", Duration::from_secs(5)).await.unwrap();
        let t = lock.fencing_token().unwrap().get();
        assert!(t > last_a, "fa: {t} after {last_a}");
        last_a = t;
        rl.unlock(lock).await.unwrap();
    }
    let second = rl
        .try_lock_many(["fa", "fb"], Duration::from_secs(5))
        .await
        .unwrap();
    let t2: Vec<u64> = second
        .fencing_tokens()
        .iter()
        .map(|(_, t)| t.get())
        .collect();
    assert!(t2[0] > last_a, "fa: {} after {last_a}", t2[0]);
    assert!(t2[1] > t1[1].1, "fb: {} after {}", t2[1], t1[1].1);
    rl.unlock(second).await.unwrap();
    // A guard's handle tells the code under the lock each resource's token.
    let guard = rl
        .lock_guard_many(["fb", "fa"], &LockOptions::new(ms(2000)))
        .await
        .unwrap();
    let h = guard.handle();
    let t3 = h.fencing_tokens();
    assert_eq!(t3.iter().map(|(r, _)| *r).collect::<Vec<_>>(), ["fa", "fb"]);
    assert!(
        t3[0].1.get() > t2[0] && t3[1].1.get() > t2[1],
        "{t3:?} after {t2:?}"
    );
    assert_eq!(h.fencing_token(), Some(t3[0].1));
    guard.release().await.unwrap();
}

/// The set is deduplicated and ordered by key; one distinct resource is an
/// ordinary lock; an empty set, an empty name and more than `MAX_RESOURCES`
/// are refused before any node is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_order_and_the_limit() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(500))
        .key_prefix("p:")
        .build()
        .unwrap();
    rl.check_nodes().await.unwrap();
    let lock = rl
        .try_lock_many(["d2", "d1", "d2", "d3", "d1"], Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lock.resources(), ["d1", "d2", "d3"]);
    assert_eq!(lock.keys(), ["p:d1", "p:d2", "p:d3"]);
    assert_eq!(lock.resource(), "{d1, d2, d3}");
    assert!(cluster.wait_until(Duration::from_secs(3), |c| {
        ["p:d1", "p:d2", "p:d3"]
            .iter()
            .all(|k| c.count_holding(k, lock.token()) == 3)
    }));
    rl.unlock(lock).await.unwrap();
    assert!(cluster.wait_until(Duration::from_secs(3), |c| {
        ["p:d1", "p:d2", "p:d3"]
            .iter()
            .all(|k| c.count_with_key(k) == 0)
    }));

    let one = rl
        .try_lock_many(["solo", "solo"], Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(one.resources(), ["solo"]);
    assert_eq!(one.resource(), "solo");
    rl.unlock(one).await.unwrap();

    let at_limit: Vec<String> = (0..MAX_RESOURCES).map(|i| format!("lim:{i}")).collect();
    let lock = rl
        .try_lock_many(&at_limit, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lock.resources().len(), MAX_RESOURCES);
    rl.unlock(lock).await.unwrap();
    let past: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("lim:{i}")).collect();
    let err = rl
        .try_lock_many(&past, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::TooManyResources { max } if max == MAX_RESOURCES),
        "{err:?}"
    );
    let none: [&str; 0] = [];
    assert!(matches!(
        rl.try_lock_many(none, Duration::from_secs(5)).await,
        Err(Error::NoResources)
    ));
    assert!(matches!(
        rl.try_lock_many(["x", ""], Duration::from_secs(5)).await,
        Err(Error::EmptyResource)
    ));
    // Nothing was sent for the refused sets.
    assert_eq!(cluster.count_with_key("p:lim:64"), 0);
    assert_eq!(cluster.count_with_key("p:x"), 0);
}

/// Guards renewed together by the handle's schedule (one batch script per
/// node over many locks) keep every key of a lock on several resources: the
/// batch script extends one key per lock, so such a lock is renewed by its
/// own script. (Merged as first written, the batch renewed only the set's
/// first key: its other keys expired while the guard said "held".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_renewed_in_one_batch_keep_every_key_of_a_set() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(500));
    let options = LockOptions::new(ms(600));
    let names: Vec<String> = (0..4).map(|i| format!("bs{i}")).collect();
    let (singles, set) = tokio::join!(
        futures_util::future::join_all(names.iter().map(|name| rl.lock_guard(name, &options))),
        rl.lock_guard_many(["bx", "by"], &options),
    );
    let singles: Vec<_> = singles.into_iter().map(Result::unwrap).collect();
    let set = set.unwrap();
    tokio::time::sleep(ms(2000)).await;
    assert!(!set.is_lost(), "the set's guard lost its lock");
    let token = cluster.node(0).get("bx").unwrap();
    for key in ["bx", "by"] {
        assert!(
            cluster.count_holding(key, &token) >= 2,
            "{key} is gone from a quorum while the guard says held (remaining {:?})",
            set.remaining()
        );
    }
    for guard in singles {
        assert!(!guard.is_lost());
        guard.release().await.unwrap();
    }
    set.release().await.unwrap();
}
