//! Wake-up on a cluster node: the release scripts announce by `SPUBLISH` on
//! the key's shard channel, and waiters listen by `SSUBSCRIBE` on the master
//! of the key's slot, also after that master fails over to its replica.

use std::time::{Duration, Instant};

use redlock_core::deadpool_redis::redis;
use redlock_core::{NativeCommands, Redlock, RetryPolicy};
use redlock_tests::RedisCluster;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Well under the waiters' poll interval (5 s): only a wake-up serves a
/// waiter this soon after the release.
const SOON: Duration = Duration::from_millis(1000);

/// A handle whose only node is `cluster`.
fn handle(cluster: &RedisCluster, wake: bool) -> Redlock {
    Redlock::builder()
        .cluster(cluster.seeds())
        .node_timeout(ms(1000))
        .wake_on_release(wake)
        .build()
        .unwrap()
}

/// Polling alone serves this waiter no sooner than 5 s after an attempt.
fn slow_poll() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(60))
        .with_delay(Duration::from_secs(5))
        .with_jitter(Duration::ZERO)
}

/// How many clients the master serving lock key `key`'s slot has on its
/// release channel (0 if no running master serves it).
fn shard_subscribers(cluster: &RedisCluster, key: &str) -> i64 {
    let channel = if key.starts_with('{') {
        format!("redlock:released:0:{key}")
    } else {
        format!("redlock:released:0:{{{key}}}")
    };
    let Some(owner) = cluster.owner(cluster.slot_of(key.as_bytes())) else {
        return 0;
    };
    match owner.raw::<Vec<redis::Value>>(&["PUBSUB", "SHARDNUMSUB", &channel]) {
        Ok(v) => match v.get(1) {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        Err(_) => 0,
    }
}

/// Bounded polling for `f`.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(ms(20));
    }
    f()
}

/// `holder` takes `key`, `waiter` starts waiting with [`slow_poll`]; once the
/// waiter is subscribed on the key's master (when it `wakes`), the holder
/// releases. How long after the release the waiter had the lock.
async fn release_to_acquire(
    cluster: &RedisCluster,
    holder: &Redlock,
    waiter: &Redlock,
    key: &str,
    wakes: bool,
) -> Duration {
    let lock_key = holder.key_for(key);
    let lock = holder
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.to_owned());
        tokio::spawn(async move {
            let lock = waiter
                .mutex(&key)
                .acquire_with(Duration::from_secs(10), &slow_poll())
                .await;
            (Instant::now(), lock)
        })
    };
    if wakes {
        assert!(
            wait_until(ms(10_000), || shard_subscribers(cluster, &lock_key) == 1),
            "the waiter never subscribed on the key's master"
        );
    } else {
        // Past its first attempt (no subscription to wait for).
        tokio::time::sleep(ms(300)).await;
    }
    holder.unlock(lock).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    waiter.unlock(lock.unwrap()).await.unwrap();
    acquired.saturating_duration_since(released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_cluster_wakes_the_waiter_long_before_its_poll() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (handle(&cluster, true), handle(&cluster, true));
    // Keys on different masters; one braced (its tag escaped).
    for key in ["wake:1", "wake:2", "wake:3", "a{b}c"] {
        let woken = release_to_acquire(&cluster, &a, &b, key, true).await;
        assert!(woken < SOON, "{key}: woken {woken:?} after the release");
        assert!(
            wait_until(ms(5000), || shard_subscribers(&cluster, &a.key_for(key))
                == 0),
            "{key}: the waiter's shard subscription was left behind"
        );
    }
    // A holder that releases by `DELIFEQ`/`DELEX` where the node has them
    // (Valkey 9), then announces by `SPUBLISH` itself.
    let native = Redlock::builder()
        .cluster(cluster.seeds())
        .node_timeout(ms(1000))
        .native_commands(NativeCommands::ReleaseAndExtend)
        .build()
        .unwrap();
    let woken = release_to_acquire(&cluster, &native, &b, "wake:native", true).await;
    assert!(woken < SOON, "native release: woken {woken:?} after it");
    // The control: with wake-ups off the same waiter waits for its poll.
    let polling = handle(&cluster, false);
    let polled = release_to_acquire(&cluster, &a, &polling, "wake:polled", false).await;
    assert!(
        polled > SOON,
        "a polling waiter was served {polled:?} after the release"
    );
}

/// The waiter subscribed on the slot's master; the master dies and its
/// replica takes over; the waiter, still waiting, subscribes on the new
/// master and is woken by the holder's release there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_still_wakes_after_the_slots_master_fails_over() {
    let cluster = RedisCluster::start(3, 1);
    let (a, b) = (handle(&cluster, true), handle(&cluster, true));
    let key = "wake:failover";
    let lock_key = a.key_for(key);
    let slot = cluster.slot_of(lock_key.as_bytes());
    let old = cluster.owner(slot).expect("an owner");
    let lock = a
        .mutex(key)
        .try_acquire(Duration::from_secs(60))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            let lock = b
                .mutex(key)
                .acquire_with(Duration::from_secs(10), &slow_poll())
                .await;
            (Instant::now(), lock)
        }
    });
    assert!(
        wait_until(ms(10_000), || shard_subscribers(&cluster, &lock_key) == 1),
        "the waiter never subscribed on the key's master"
    );
    // The holder's key reaches the replica before its master dies: the
    // master's replica has caught up with its offset read after the `SET`
    // (a `WAIT` on a fresh connection waits for nothing: it has written
    // nothing; once in 5 runs the promoted replica lacked the key).
    let offset = info_field(&old, "master_repl_offset");
    let port = old.port().to_string();
    assert!(
        wait_until(ms(5_000), || cluster.replicas().iter().any(|r| {
            info_field(r, "master_port") == port
                && info_field(r, "slave_repl_offset")
                    .parse::<u64>()
                    .unwrap_or(0)
                    >= offset.parse::<u64>().unwrap_or(u64::MAX)
        })),
        "the replica never caught up with the holder's key"
    );
    old.kill();
    assert!(
        wait_until(ms(20_000), || cluster
            .owner(slot)
            .is_some_and(|n| n.port() != old.port())),
        "no replica took over: {}",
        cluster.describe()
    );
    assert!(
        cluster.get(lock_key.as_bytes()).is_some(),
        "the key was lost"
    );
    assert!(
        wait_until(ms(20_000), || shard_subscribers(&cluster, &lock_key) == 1),
        "the waiter did not subscribe again on the new master"
    );
    // The holder's own connection finds the new master (bounded).
    let end = Instant::now() + ms(20_000);
    while a
        .inspect(key)
        .await
        .map_or(true, |i| i.nodes.iter().any(|n| n.state.is_err()))
    {
        assert!(
            Instant::now() < end,
            "the holder never reached the new master"
        );
        tokio::time::sleep(ms(50)).await;
    }
    if let Err(e) = a.unlock(lock).await {
        // The honest answer of a new master slower than the node timeout on a
        // loaded machine (seen: `ReleaseIncomplete`, a 1 s timeout): the key
        // then expires with its TTL, and there is no release to be woken by.
        assert!(
            matches!(e, redlock_core::Error::ReleaseIncomplete { .. }),
            "{e:?}"
        );
        eprintln!("a_waiter_still_wakes_after_the_slots_master_fails_over: {e}");
        waiting.abort();
        return;
    }
    let released = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    b.unlock(lock.unwrap()).await.unwrap();
    let woken = acquired.saturating_duration_since(released);
    assert!(woken < SOON, "woken {woken:?} after the release");
}

/// A node given as a deadpool cluster config (`cluster_config`) subscribes
/// through the config's seeds: its waiter is woken by the release. The
/// control: a node given as a bare pool (`cluster_pool`) cannot subscribe,
/// and its waiter waits for its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_config_nodes_waiter_is_woken_and_a_bare_pools_polls() {
    use redlock_core::deadpool_redis::{Runtime, cluster::Config};
    let cluster = RedisCluster::start(3, 0);
    let by_config = || {
        Redlock::builder()
            .cluster_config("configured", Config::from_urls(cluster.seeds()))
            .node_timeout(ms(1000))
            .build()
            .unwrap()
    };
    let (a, b) = (by_config(), by_config());
    let woken = release_to_acquire(&cluster, &a, &b, "wake:config", true).await;
    assert!(woken < SOON, "woken {woken:?} after the release");
    let pool = Config::from_urls(cluster.seeds())
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let bare = Redlock::builder()
        .cluster_pool("pooled", pool)
        .node_timeout(ms(1000))
        .build()
        .unwrap();
    let polled = release_to_acquire(&cluster, &a, &bare, "wake:pool", false).await;
    assert!(
        polled > SOON,
        "a bare pool's waiter was served {polled:?} after the release"
    );
}

/// The key's slot moves to another master while a waiter waits: the old
/// master drops the shard channel (`sunsubscribe`), the waiter subscribes on
/// the new one and is woken by the release there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_still_wakes_after_the_keys_slot_moves() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (handle(&cluster, true), handle(&cluster, true));
    let key = "wake:moved";
    let lock_key = a.key_for(key);
    let slot = cluster.slot_of(lock_key.as_bytes());
    let old = cluster.owner(slot).expect("an owner");
    let lock = a
        .mutex(key)
        .try_acquire(Duration::from_secs(60))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            let lock = b
                .mutex(key)
                .acquire_with(Duration::from_secs(10), &slow_poll())
                .await;
            (Instant::now(), lock)
        }
    });
    assert!(
        wait_until(ms(10_000), || shard_subscribers(&cluster, &lock_key) == 1),
        "the waiter never subscribed on the key's master"
    );
    let to = cluster
        .masters()
        .iter()
        .position(|m| m.port() != old.port())
        .expect("another master");
    cluster.move_slot(slot, to, 10, || ());
    assert_eq!(
        cluster.owner(slot).map(|n| n.port()),
        Some(cluster.masters()[to].port())
    );
    assert!(
        wait_until(ms(20_000), || shard_subscribers(&cluster, &lock_key) == 1),
        "the waiter did not subscribe again on the slot's new master"
    );
    a.unlock(lock).await.unwrap();
    let released = Instant::now();
    let (acquired, lock) = waiting.await.unwrap();
    b.unlock(lock.unwrap()).await.unwrap();
    let woken = acquired.saturating_duration_since(released);
    assert!(woken < SOON, "woken {woken:?} after the release");
}

/// A field of a node's `INFO replication`, empty when absent.
fn info_field(node: &redlock_tests::RedisNode, field: &str) -> String {
    let info: String = node.raw(&["INFO", "replication"]).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned()
}
