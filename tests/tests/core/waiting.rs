//! Waiting by wake-up (issue 13) on real `redis-server` processes: mutual
//! exclusion when most clients wait, a release waking a waiter long before its
//! poll would, the fallbacks for what no message announces (expiry, a silent
//! delete), a clean-up heard on too few nodes waking nobody, first come first
//! served among the waiters of one process, waiters that give up without
//! blocking the next, a node killed and restarted while a waiter waits, a
//! renewed local holder keeping its waiters queued, releases kept to their
//! database, and the pub/sub connection idle without waiters and replaced
//! when it dies without a word.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::deadpool_redis::redis::{self, AsyncCommands};
use redlock_core::{LockOptions, Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::proxy::{DirFault, Direction, FaultProxy, Flow};
use redlock_tests::util::eventually;

/// How soon a woken waiter must hold the lock. Where a test uses it, the
/// waiter could otherwise be served only by the holder's expiry or by its
/// poll, 10 s or more away, so the bound can be generous for a loaded 2-core
/// machine (it was 100 ms).
const SOON: Duration = Duration::from_secs(2);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(100))
        .build()
        .unwrap()
}

/// A policy whose polling alone would be far too slow for these tests: only a
/// wake-up (or the PTTL fallback) can make them pass.
fn slow_poll(deadline: Duration) -> RetryPolicy {
    RetryPolicy::deadline(deadline)
        .with_delay(Duration::from_secs(5))
        .with_jitter(Duration::ZERO)
}

/// A handle whose calls do not time out on a loaded machine: for tests whose
/// premise is that every node answered every call (a holder on all of them, a
/// waiter that found all of them busy, and subscriptions confirmed before the
/// waiter's second attempt, which waits for them up to the node timeout).
fn patient(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(2000))
        .build()
        .unwrap()
}

/// The channel of `key`'s releases in database 0.
fn channel(key: &str) -> String {
    format!("redlock:released:0:{key}")
}

/// How many connections of `node` are subscribed to `key`'s channel.
fn subscribers(cluster: &Cluster, node: usize, key: &str) -> i64 {
    let reply: Vec<redis::Value> = cluster
        .node(node)
        .raw(&["PUBSUB", "NUMSUB", &channel(key)])
        .unwrap_or_default();
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        _ => -1,
    }
}

/// Waits until `token` holds `key` on every node: an acquire returns once a
/// quorum answered, and the last node's `SET` may still be on its way (it
/// then joins the lock).
fn held_everywhere(cluster: &Cluster, key: &str, token: &str) {
    assert!(
        cluster.wait_until(ms(5000), |c| c
            .nodes()
            .iter()
            .all(|n| n.get(key).as_deref() == Some(token))),
        "the holder does not hold every node"
    );
}

/// How many acquire attempts (`SET NX` pipelines) `node` has run, counted by
/// their `TYPE`, which nothing else sends: on a node with `SET … IFEQ` the
/// renewals are `SET`s too.
fn set_calls(cluster: &Cluster, node: usize) -> u64 {
    calls(cluster, node, "type")
}

/// How many times `node` has run `command` (lower case), by `INFO commandstats`.
fn calls(cluster: &Cluster, node: usize, command: &str) -> u64 {
    let info: String = cluster
        .node(node)
        .raw(&["INFO", "commandstats"])
        .unwrap_or_default();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// 16 clients (two handles of 8, so both the local queue and the wake-ups
/// across handles are in play) take turns on one key, each doing a
/// read-modify-write of a counter in Redis with a pause in the middle: a
/// lost update or an overlap would show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_clients_wait_and_none_overlap() {
    let cluster = Cluster::start(3);
    let handles = [redlock(&cluster), redlock(&cluster)];
    let counter = redis::Client::open(cluster.node(0).url()).unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    const ROUNDS: u64 = 8;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let rl = handles[i % 2].clone();
        let inside = Arc::clone(&inside);
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = counter.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..ROUNDS {
                let lock = rl
                    .lock_with(
                        "waiting:counter",
                        ms(2000),
                        &RetryPolicy::deadline(ms(30_000)),
                    )
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                let n: u64 = conn
                    .get::<_, Option<u64>>("counter")
                    .await
                    .unwrap()
                    .unwrap_or(0);
                tokio::time::sleep(ms(1)).await;
                let _: () = conn.set("counter", n + 1).await.unwrap();
                inside.store(false, Ordering::SeqCst);
                rl.unlock(lock).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        cluster.node(0).get("counter"),
        Some((16 * ROUNDS).to_string())
    );
    // Every waiter unsubscribed when it stopped waiting.
    assert!(
        cluster.wait_until(ms(2000), |c| (0..3).all(|n| subscribers(
            c,
            n,
            "waiting:counter"
        ) == 0)),
        "subscriptions left behind"
    );
}

/// Holds `key` from `holder` for `hold`, releases it, and returns when the
/// release returned and how long after it `waiter` took the lock.
async fn release_to_acquire(
    holder: &Redlock,
    waiter: &Redlock,
    key: &str,
    retry: RetryPolicy,
    hold: Duration,
) -> Duration {
    let lock = holder.try_lock(key, Duration::from_secs(10)).await.unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.to_owned());
        tokio::spawn(async move {
            let lock = waiter
                .lock_with(&key, Duration::from_secs(10), &retry)
                .await;
            (Instant::now(), lock)
        })
    };
    tokio::time::sleep(hold).await;
    holder.unlock(lock).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    waiter.unlock(lock.unwrap()).await.unwrap();
    acquired.saturating_duration_since(released)
}

/// The holder's TTL is 10 s and the waiter polls every 5 s: only the release
/// message (from another handle) or the local release (same handle) can hand
/// the lock over within 100 ms. With wake-ups off, the same waiter is not
/// served before its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_long_before_its_poll() {
    let cluster = Cluster::start(3);
    let (a, b) = (redlock(&cluster), redlock(&cluster));
    let across = release_to_acquire(&a, &b, "waiting:across", slow_poll(ms(20_000)), ms(200)).await;
    assert!(
        across < SOON,
        "woken {across:?} after the release (other handle)"
    );
    let local = release_to_acquire(&a, &a, "waiting:local", slow_poll(ms(20_000)), ms(200)).await;
    assert!(
        local < SOON,
        "woken {local:?} after the release (same handle)"
    );

    let polling = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(100))
        .wake_on_release(false)
        .build()
        .unwrap();
    let retry = RetryPolicy::deadline(ms(20_000))
        .with_delay(ms(1500))
        .with_jitter(Duration::ZERO);
    let polled = release_to_acquire(&a, &polling, "waiting:polled", retry, ms(200)).await;
    assert!(
        polled > ms(1000),
        "a polling waiter was served {polled:?} after the release"
    );
}

/// A release announced on too few nodes to free a quorum (another waiter's
/// failed attempt cleaning up the one node it took) does not send the waiter
/// against a lock still held on the others: with three contending processes,
/// waking on every such message cost ten `SET`s per node per acquisition.
/// The holder's own release still wakes it at once.
///
/// The premise is a lock held on all three nodes and a waiter that found all
/// three busy. On a loaded machine the holder sometimes held two: `try_lock`
/// returns once a quorum answered, and its `SET` on the third node was late
/// (or, with a 100 ms node timeout on a cold connection, never sent). The
/// waiter then took the third node in each attempt (and released it), and
/// one more node's announcement rightly made a quorum with the node it took:
/// the failure seen on a fresh clone. Hence patient handles, and a waiter
/// that starts once the holder holds every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_up_on_one_node_does_not_wake_the_waiters_of_a_held_lock() {
    let cluster = Cluster::start(3);
    let (a, b) = (patient(&cluster), patient(&cluster));
    let key = "waiting:cleanup";
    let sets = || (0..3).map(|n| set_calls(&cluster, n)).sum::<u64>();
    let held = a.try_lock(key, Duration::from_secs(20)).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let base = sets();
    let waiter = tokio::spawn(async move {
        let lock = b
            .lock_with(key, Duration::from_secs(10), &slow_poll(ms(20_000)))
            .await;
        (Instant::now(), lock, b)
    });
    // Its first attempt, then its second once subscribed on every node: it
    // sleeps after that until news.
    assert!(
        cluster.wait_until(ms(10_000), |c| (0..3).all(|n| subscribers(c, n, key) == 1)
            && sets() >= base + 6),
        "the waiter never subscribed and tried again ({} SETs)",
        sets() - base
    );
    let before = sets();
    assert_eq!(before, base + 6, "more than two attempts before any news");
    cluster.node(0).cmd(&["PUBLISH", &channel(key), "1"]);
    // Time for a wrong wake-up to show (it would follow within a round trip).
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        sets(),
        before,
        "the waiter attempted after a release heard on one node of three"
    );
    let released = Instant::now();
    a.unlock(held).await.unwrap();
    let (acquired, lock, b) = waiter.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(after < SOON, "woken {after:?} after the holder's release");
    b.unlock(lock.unwrap()).await.unwrap();
}

/// What no message announces: a key that expires (the waiter wakes at the
/// holder's PTTL), and a key deleted without the release script (the waiter's
/// safety-net poll finds it free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_and_silent_deletes_are_found_by_the_fallbacks() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    for node in cluster.nodes() {
        node.cmd(&["SET", "waiting:expiry", "foreign", "PX", "700"]);
    }
    let start = Instant::now();
    let lock = rl
        .lock_with(
            "waiting:expiry",
            Duration::from_secs(10),
            &slow_poll(ms(20_000)),
        )
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(
        took >= ms(600) && took < ms(700) + SOON,
        "PTTL fallback: {took:?}"
    );
    rl.unlock(lock).await.unwrap();

    for node in cluster.nodes() {
        node.cmd(&["SET", "waiting:silent", "foreign", "PX", "20000"]);
    }
    let retry = RetryPolicy::deadline(ms(20_000))
        .with_delay(ms(300))
        .with_jitter(Duration::ZERO);
    let waiting = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl
                .lock_with("waiting:silent", Duration::from_secs(10), &retry)
                .await;
            (Instant::now(), lock)
        })
    };
    tokio::time::sleep(ms(400)).await;
    for node in cluster.nodes() {
        node.cmd(&["DEL", "waiting:silent"]);
    }
    let deleted = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(deleted);
    assert!(
        after < ms(300) + SOON,
        "safety-net poll: {after:?} after the delete"
    );
    rl.unlock(lock.unwrap()).await.unwrap();
}

/// Waiters of one process are served in the order they came, each making its
/// attempt as soon as the one before releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_are_served_first_come_first_served() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    let first = rl
        .try_lock("waiting:fifo", Duration::from_secs(10))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (rl, order) = (rl.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let lock = rl
                .lock_with(
                    "waiting:fifo",
                    Duration::from_secs(10),
                    &slow_poll(ms(20_000)),
                )
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(ms(5)).await;
            rl.unlock(lock).await.unwrap();
        }));
        // Each waiter has joined the queue before the next one starts.
        tokio::time::sleep(ms(30)).await;
    }
    let start = Instant::now();
    rl.unlock(first).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..6).collect::<Vec<_>>());
    // Six handovers, none of which waited for the 20 s poll or the 10 s TTL.
    assert!(start.elapsed() < 3 * SOON, "{:?}", start.elapsed());
}

/// A waiter dropped at the head of the queue and one that timed out behind it
/// leave without taking the turn along: the next is served at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_do_not_block_the_next() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    let holder = rl
        .try_lock("waiting:drop", Duration::from_secs(10))
        .await
        .unwrap();
    let head = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let _ = rl
                .lock_with(
                    "waiting:drop",
                    Duration::from_secs(10),
                    &slow_poll(ms(20_000)),
                )
                .await;
        })
    };
    tokio::time::sleep(ms(50)).await;
    let timed_out = {
        let rl = rl.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                ms(200),
                rl.lock_with(
                    "waiting:drop",
                    Duration::from_secs(10),
                    &slow_poll(ms(20_000)),
                ),
            )
            .await
            .is_err()
        })
    };
    tokio::time::sleep(ms(50)).await;
    let last = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl
                .lock_with(
                    "waiting:drop",
                    Duration::from_secs(10),
                    &slow_poll(ms(20_000)),
                )
                .await;
            (Instant::now(), lock)
        })
    };
    tokio::time::sleep(ms(50)).await;
    head.abort();
    assert!(
        timed_out.await.unwrap(),
        "the second waiter should have timed out"
    );
    rl.unlock(holder).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = last.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(after < SOON, "served {after:?} after the release");
    rl.unlock(lock.unwrap()).await.unwrap();
}

/// A node dies while a waiter waits: the waiter is woken by the lost
/// subscription (one more attempt, found busy), subscribes again when the
/// node is back, and is still woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_restarted_while_waiting() {
    let cluster = Cluster::start(3);
    let (holder, waiter) = (redlock(&cluster), redlock(&cluster));
    let lock = holder
        .try_lock("waiting:restart", Duration::from_secs(10))
        .await
        .unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let lock = waiter
                .lock_with(
                    "waiting:restart",
                    Duration::from_secs(10),
                    // The safety-net poll is far beyond every bound below,
                    // so each wake-up seen is a real one, on a loaded machine.
                    &RetryPolicy::deadline(ms(60_000))
                        .with_delay(Duration::from_secs(30))
                        .with_jitter(Duration::ZERO),
                )
                .await;
            (Instant::now(), lock)
        })
    };
    assert!(
        cluster.wait_until(ms(3000), |c| (0..3).all(|n| subscribers(
            c,
            n,
            "waiting:restart"
        ) == 1)),
        "the waiter never subscribed on every node"
    );
    tokio::time::sleep(ms(100)).await;
    let sets = set_calls(&cluster, 0);
    cluster.node(2).kill();
    // The lost subscription wakes the waiter for one more attempt, well
    // before its 30 s poll.
    assert!(
        cluster.wait_until(ms(5000), |c| set_calls(c, 0) > sets),
        "no attempt after the node's subscription was lost"
    );
    cluster.node(2).restart();
    assert!(
        cluster.wait_until(ms(5000), |c| subscribers(c, 2, "waiting:restart") == 1),
        "the waiter did not subscribe again on the restarted node"
    );
    holder.unlock(lock).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    // The holder's keys would expire in 10 s, the poll in 30 s: only the
    // release can serve it this soon.
    assert!(after < ms(2000), "served {after:?} after the release");
    waiter.unlock(lock.unwrap()).await.unwrap();
}

/// A guarded lock renewed for several of its TTLs keeps its local waiters
/// queued: they make no attempt while it is held (its turn used to end with
/// its first validity, and the next waiter then contended, trying again at
/// every PTTL), and its release hands the lock to the next waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_holder_keeps_its_local_waiters_queued_for_the_hand_over() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(250))
        .build()
        .unwrap();
    let key = "waiting:renewed";
    let ttl = ms(1000);
    let guard = rl
        .lock_guard(key, &LockOptions::new(ttl).retry(slow_poll(ms(20_000))))
        .await
        .unwrap();
    let handle = guard.handle();
    held_everywhere(&cluster, key, handle.token());
    let first = handle.valid_until();
    let sets = || (0..3).map(|n| set_calls(&cluster, n)).sum::<u64>();
    let before = sets();
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let lock = rl
                .lock_with(key, Duration::from_secs(10), &slow_poll(ms(20_000)))
                .await;
            (Instant::now(), lock)
        })
    };
    assert!(
        cluster.wait_until(ms(15_000), |_| handle.valid_until() > first + 3 * ttl),
        "the guard did not renew for three TTLs"
    );
    assert!(!handle.is_lost());
    assert_eq!(
        sets(),
        before,
        "the local waiter attempted while the holder renewed its lock"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let (acquired, lock) = waiter.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    // Without the hand-over the waiter would wait for the holder's last
    // validity (renewed when 0.4 to 0.6 of it is left), 0.4 s to 1 s after
    // the release: the bound stays below that.
    assert!(after < ms(300), "served {after:?} after the release");
    rl.unlock(lock.unwrap()).await.unwrap();
}

/// `PUBLISH` reaches every database of a server: the same key taken and
/// released in database 1, flagged there as if a waiter of database 1 waited
/// (so that its release announces itself, by the script for databases other
/// than 0), does not wake its waiter in database 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_another_database_wakes_no_waiter() {
    let cluster = Cluster::start(3);
    let (holder, waiter) = (patient(&cluster), patient(&cluster));
    let db1 = Redlock::builder()
        .urls(cluster.urls().iter().map(|u| format!("{u}/1")))
        .node_timeout(ms(2000))
        .build()
        .unwrap();
    let key = "waiting:db";
    let sets = || (0..3).map(|n| set_calls(&cluster, n)).sum::<u64>();
    let held = holder.try_lock(key, Duration::from_secs(20)).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let base = sets();
    let waiting = tokio::spawn(async move {
        let lock = waiter
            .lock_with(key, Duration::from_secs(10), &slow_poll(ms(20_000)))
            .await;
        (Instant::now(), lock, waiter)
    });
    assert!(
        cluster.wait_until(ms(10_000), |c| (0..3).all(|n| subscribers(c, n, key) == 1)
            && sets() >= base + 6),
        "the waiter never subscribed and tried again"
    );
    assert_eq!(sets(), base + 6, "more than two attempts before any news");
    let other = db1.try_lock(key, Duration::from_secs(10)).await.unwrap();
    for url in cluster.urls() {
        let mut conn = redis::Client::open(format!("{url}/1"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = conn
            .set_options(
                flag(key),
                1,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(60_000)),
            )
            .await
            .unwrap();
    }
    let announced: Vec<u64> = (0..3).map(|n| publishes(&cluster, n)).collect();
    db1.unlock(other).await.unwrap();
    assert!(
        cluster.wait_until(ms(5000), |c| (0..3)
            .all(|n| publishes(c, n) == announced[n] + 1)),
        "database 1's release did not announce itself on every node"
    );
    let before = base + 9;
    assert!(
        cluster.wait_until(ms(5000), |_| sets() >= before),
        "database 1's SETs never ran"
    );
    // Time for a wrong wake-up to show (it would follow within a round trip).
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        sets(),
        before,
        "a release in database 1 woke the waiter of database 0"
    );
    let released = Instant::now();
    holder.unlock(held).await.unwrap();
    let (acquired, lock, waiter) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(after < SOON, "woken {after:?} after the release");
    waiter.unlock(lock.unwrap()).await.unwrap();
}

/// `holder` holds `key` while `waiter` waits for it until subscribed on every
/// node, then releases; `waiter` takes the lock and releases it, and its
/// subscriptions are gone.
async fn one_wait(cluster: &Cluster, holder: &Redlock, waiter: &Redlock, key: &'static str) {
    let held = holder.try_lock(key, Duration::from_secs(20)).await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .lock_with(key, Duration::from_secs(10), &slow_poll(ms(20_000)))
                .await
        })
    };
    assert!(
        cluster.wait_until(ms(10_000), |c| (0..3).all(|n| subscribers(c, n, key) == 1)),
        "the waiter never subscribed on every node"
    );
    holder.unlock(held).await.unwrap();
    waiter
        .unlock(waiting.await.unwrap().unwrap())
        .await
        .unwrap();
    assert!(
        cluster.wait_until(ms(5000), |c| (0..3).all(|n| subscribers(c, n, key) == 0)),
        "subscriptions left behind"
    );
}

/// With no waiter, a node's pub/sub task makes no connection: a node that went
/// down is not tried again for nobody (it was, every 2 s at most, forever),
/// and the next waiter makes the task connect and subscribe again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_waiters_a_down_node_is_not_retried() {
    let cluster = Cluster::start(3);
    let proxy = FaultProxy::start(2, cluster.node(2).port(), None)
        .await
        .unwrap();
    let waiter = Redlock::builder()
        .urls([cluster.node(0).url(), cluster.node(1).url(), proxy.url()])
        .node_timeout(ms(2000))
        .build()
        .unwrap();
    let holder = patient(&cluster);
    one_wait(&cluster, &holder, &waiter, "waiting:idle").await;
    let accepted = proxy.stats().accepted;
    cluster.node(2).kill();
    // The subscription's connection closes with the node; nobody waits.
    assert!(
        !cluster.wait_until(ms(3000), |_| proxy.stats().accepted > accepted),
        "the pub/sub task connected again with no waiter ({} connections)",
        proxy.stats().accepted - accepted
    );
    cluster.node(2).restart();
    one_wait(&cluster, &holder, &waiter, "waiting:idle").await;
    assert!(proxy.stats().accepted > accepted);
}

/// A subscription whose connection died without a word (here the path drops
/// what the node sends on it, and, as TCP after a lost segment, never
/// delivers on it again) is found out by a `PING` and replaced: the waiter is
/// then woken by the holder's release, not by its 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_subscription_is_replaced() {
    let cluster = Cluster::start(1);
    let proxy = FaultProxy::start(0, cluster.node(0).port(), None)
        .await
        .unwrap();
    let waiter = Redlock::builder()
        .urls([proxy.url()])
        .node_timeout(ms(500))
        .build()
        .unwrap();
    let holder = patient(&cluster);
    let key = "waiting:dead-sub";
    let sets = || set_calls(&cluster, 0);
    let held = holder.try_lock(key, Duration::from_secs(30)).await.unwrap();
    let base = sets();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let lock = waiter
                .lock_with(key, Duration::from_secs(10), &slow_poll(ms(30_000)))
                .await;
            (Instant::now(), lock)
        })
    };
    assert!(
        cluster.wait_until(ms(10_000), |c| subscribers(c, 0, key) == 1
            && sets() >= base + 2),
        "the waiter never subscribed and tried again"
    );
    let accepted = proxy.stats().accepted;
    // What the node sends on the subscription from now on is lost: the
    // announcement below, and the connection's every later byte.
    proxy.set(
        Direction::Reply,
        DirFault {
            flow: Flow::Blackhole,
            ..DirFault::default()
        },
    );
    cluster.node(0).cmd(&["PUBLISH", &channel(key), "1"]);
    assert!(
        cluster.wait_until(ms(5000), |_| proxy.stats().dropped_chunks > 0),
        "the announcement was not dropped"
    );
    proxy.set(Direction::Reply, DirFault::default());
    assert!(
        cluster.wait_until(ms(10_000), |_| proxy.stats().accepted > accepted),
        "the dead subscription was never replaced"
    );
    // The new one answers its `PING`s, and is kept.
    let replaced = proxy.stats().accepted;
    assert!(
        !cluster.wait_until(ms(2500), |_| proxy.stats().accepted > replaced),
        "a live subscription was replaced"
    );
    let released = Instant::now();
    holder.unlock(held).await.unwrap();
    let (acquired, lock) = waiting.await.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < ms(1000),
        "served {after:?} after the release (the poll is 5 s)"
    );
    waiter.unlock(lock.unwrap()).await.unwrap();
}

/// How many `PUBLISH`es `node` has run (the release script's among them).
fn publishes(cluster: &Cluster, node: usize) -> u64 {
    calls(cluster, node, "publish")
}

/// The key of `key`'s waiters flag.
fn flag(key: &str) -> String {
    format!("{key}:redlock-waiters")
}

/// A release that nobody waits for announces nothing: the node runs no
/// `PUBLISH` (issue 21, server CPU). A waiter first leaves the waiters flag
/// on every node; the next release deletes it with the key and announces
/// itself, which wakes the waiter long before its 5 s poll and the holder's
/// 30 s TTL. The waiter's own release, nobody waiting any more, leaves no
/// flag behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_announces_itself_only_when_a_waiter_flagged_the_key() {
    let cluster = Cluster::start(3);
    let (a, b) = (patient(&cluster), patient(&cluster));
    let key = "waiting:flag";
    let all_publishes = |c: &Cluster| -> Vec<u64> { (0..3).map(|n| publishes(c, n)).collect() };

    // Nobody waits: the key is deleted everywhere, and nothing published.
    let before = all_publishes(&cluster);
    let lock = a.try_lock(key, Duration::from_secs(30)).await.unwrap();
    held_everywhere(&cluster, key, lock.token());
    a.unlock(lock).await.unwrap();
    assert!(
        cluster.wait_until(ms(5000), |c| c.count_with_key(key) == 0),
        "the release did not reach every node"
    );
    assert_eq!(
        all_publishes(&cluster),
        before,
        "a release nobody waited for published"
    );

    // A waiter flags the key on every node before its attempt after subscribing.
    let held = a.try_lock(key, Duration::from_secs(30)).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let waiter = tokio::spawn(async move {
        let lock = b
            .lock_with(key, Duration::from_secs(10), &slow_poll(ms(20_000)))
            .await;
        (Instant::now(), lock, b)
    });
    assert!(
        cluster.wait_until(ms(10_000), |c| (0..3)
            .all(|n| subscribers(c, n, key) == 1 && c.node(n).pttl(&flag(key)) > 0)),
        "the waiter never subscribed and flagged the key"
    );
    let before = all_publishes(&cluster);
    let released = Instant::now();
    a.unlock(held).await.unwrap();
    let (acquired, lock, b) = waiter.await.unwrap();
    let lock = lock.unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < ms(4000),
        "woken {after:?} after the release (the poll is 5 s)"
    );
    assert!(
        eventually(ms(5000), || all_publishes(&cluster)
            .iter()
            .zip(&before)
            .all(|(now, was)| *now == was + 1))
        .await,
        "one announcement per node expected: {:?} -> {:?}",
        before,
        all_publishes(&cluster)
    );

    // The waiter's release deletes its key and the flag its last attempt set.
    held_everywhere(&cluster, key, lock.token());
    b.unlock(lock).await.unwrap();
    assert!(
        cluster.wait_until(ms(5000), |c| c.nodes().iter().all(|n| n.keys().is_empty())),
        "keys left: {:?}",
        cluster.nodes().iter().map(|n| n.keys()).collect::<Vec<_>>()
    );
}

/// A user whose ACL allows the lock keys but not their waiters flags still
/// releases, one key or a set (the releases without the flags, after the
/// flagged script's `ERR`: by `EVAL` on the first release, which finds the
/// script not loaded, and by `EVALSHA` on the later ones), and a waiter of
/// that user is still woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_the_flag_key_still_releases_and_wakes() {
    let cluster = Cluster::start(3);
    let mut urls = Vec::new();
    for node in cluster.nodes() {
        // `acl:?` matches the lock key `acl:k`, not `acl:k:redlock-waiters`.
        node.cmd(&[
            "ACL", "SETUSER", "narrow", "on", ">secret", "~acl:?", "&*", "+@all",
        ]);
        urls.push(format!("redis://narrow:secret@127.0.0.1:{}", node.port()));
    }
    let handle = || {
        Redlock::builder()
            .urls(urls.clone())
            .node_timeout(ms(2000))
            .build()
            .unwrap()
    };
    let (a, b) = (handle(), handle());
    let key = "acl:k";
    let lock = a.try_lock(key, Duration::from_secs(30)).await.unwrap();
    held_everywhere(&cluster, key, lock.token());
    let released = a.unlock(lock).await.unwrap();
    assert!(released.deleted >= 2, "{}", released.report());
    assert!(
        cluster.wait_until(ms(5000), |c| c.count_with_key(key) == 0),
        "the release did not reach every node"
    );
    // A set's release, too.
    let set = a
        .try_lock_many(["acl:a", "acl:b"], Duration::from_secs(30))
        .await
        .unwrap();
    let released = a.unlock(set).await.unwrap();
    assert!(released.deleted >= 2, "{}", released.report());
    assert!(
        cluster.wait_until(ms(5000), |c| c.count_with_key("acl:a") == 0
            && c.count_with_key("acl:b") == 0),
        "the set's release did not reach every node"
    );

    let held = a.try_lock(key, Duration::from_secs(30)).await.unwrap();
    held_everywhere(&cluster, key, held.token());
    let waiter = tokio::spawn(async move {
        let lock = b
            .lock_with(key, Duration::from_secs(10), &slow_poll(ms(20_000)))
            .await;
        (Instant::now(), lock)
    });
    assert!(
        cluster.wait_until(ms(10_000), |c| (0..3).all(|n| subscribers(c, n, key) == 1)),
        "the waiter never subscribed"
    );
    let released = Instant::now();
    a.unlock(held).await.unwrap();
    let (acquired, lock) = waiter.await.unwrap();
    assert!(lock.is_ok(), "{lock:?}");
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < ms(4000),
        "woken {after:?} after the release (the poll is 5 s)"
    );
    for node in cluster.nodes() {
        assert_eq!(
            node.keys()
                .iter()
                .filter(|k| k.ends_with("waiters"))
                .count(),
            0
        );
    }
}
