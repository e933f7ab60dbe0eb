//! The Redlock algorithm requirements of `redlock-core`, proven on real
//! `redis-server` processes: fresh 128-bit tokens, fan-out with early return,
//! validity arithmetic, retry bounds, compare-and-delete release (with the
//! `NOSCRIPT` fallback), extension, and the "busy" information.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redlock_core::{Error, Lock, Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::monitor::{Monitor, parse_monitor_line};

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

/// Connects to every node (`check_nodes` caches one connection per node), then
/// locks and unlocks another resource to load the scripts. After this, every call
/// is one `EVALSHA` on one connection per node, so a late acquire answer can never
/// be overtaken by the release of the same lock.
async fn warm_up(cluster: &Cluster, redlock: &Redlock) {
    let infos = redlock.check_nodes().await.unwrap();
    assert!(infos.iter().all(|i| i.error.is_none()), "{infos:?}");
    let lock = held_everywhere(cluster, redlock, "warm-up", Duration::from_secs(5)).await;
    redlock_tests::util::assert_released(
        &redlock.unlock(lock).await.unwrap(),
        redlock.node_count(),
    );
}

/// A built and warmed-up handle.
async fn ready(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    let rl = redlock(cluster, node_timeout);
    warm_up(cluster, &rl).await;
    rl
}

/// Takes the lock with every node holding the token, so that the exact counts
/// asserted afterwards do not depend on answer timing. A node that answers after
/// the quorum still joins the lock, so this waits (bounded) for it; on a loaded
/// machine its answer may even time out and be released, and then the lock is
/// taken again (at most 5 times).
async fn held_everywhere(cluster: &Cluster, redlock: &Redlock, key: &str, ttl: Duration) -> Lock {
    for _ in 0..5 {
        let lock = redlock.try_lock(key, ttl).await.unwrap();
        let token = lock.token().to_owned();
        if cluster.wait_until(Duration::from_secs(2), |c| {
            c.count_holding(key, &token) == c.len()
        }) {
            // The late answers have landed; give their background handler a
            // moment to see them, so it does not race the test's own release.
            tokio::time::sleep(ms(200)).await;
            return lock;
        }
        let _ = redlock.unlock(lock).await;
        assert!(cluster.wait_until(Duration::from_secs(3), |c| c.count_with_key(key) == 0));
    }
    panic!("5 locks in a row did not reach every node");
}

/// Puts a value this library did not write at `key` on node `i`.
fn occupy(cluster: &Cluster, i: usize, key: &str, value: &str) {
    cluster.node(i).cmd(&["SET", key, value, "PX", "10000"]);
}

/// Stops the recorder and returns the commands clients sent (not Lua's).
fn stop_commands(monitor: Monitor) -> Vec<Vec<String>> {
    monitor
        .stop()
        .iter()
        .filter(|l| !l.contains(" lua]"))
        .filter_map(|l| parse_monitor_line(l))
        .collect()
}

fn is_script_call(c: &[String]) -> bool {
    c[0].eq_ignore_ascii_case("EVALSHA") || c[0].eq_ignore_ascii_case("EVAL")
}

/// Acquire calls on `key`, as `(token, ttl_ms)`: `SET key token NX PX ttl_ms`.
fn acquire_calls(cmds: &[Vec<String>], key: &str) -> Vec<(String, String)> {
    cmds.iter()
        .filter(|c| c.len() == 6)
        .filter_map(|c| {
            if c[0].eq_ignore_ascii_case("SET")
                && c[1] == key
                && c[3].eq_ignore_ascii_case("NX")
                && c[4].eq_ignore_ascii_case("PX")
            {
                Some((c[2].clone(), c[5].clone()))
            } else {
                None
            }
        })
        .collect()
}

/// Release calls on `key`: `EVALSHA sha 1 key token` with the release
/// script's SHA, or `EVAL` of its body (the script deletes the key's waiters
/// flag with it, by a name it builds). Returns the tokens.
fn release_calls(cmds: &[Vec<String>], key: &str) -> Vec<String> {
    let release = redlock_core::__RELEASE_LUA;
    let sha = redlock_core::deadpool_redis::redis::Script::new(release)
        .get_hash()
        .to_owned();
    cmds.iter()
        .filter(|c| c.len() == 5 && is_script_call(c) && c[2] == "1" && c[3] == key)
        .filter(|c| c[1] == sha || c[1] == release)
        .map(|c| c[4].clone())
        .collect()
}

fn is_token(t: &str) -> bool {
    t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())
}

// ---------------------------------------------------------------- 1. token

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_stored_at_key_is_128_bit_hex_and_fresh_per_lock() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "token-stored";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    let first = lock.token().to_owned();
    assert!(is_token(&first), "token {first:?} is not 32 hex chars");
    for node in cluster.nodes() {
        assert_eq!(node.get(key).as_deref(), Some(first.as_str()));
    }
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    assert!(is_token(lock.token()));
    assert_ne!(lock.token(), first, "a new lock must get a new token");
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_retry_attempt_uses_a_fresh_token() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "token-per-attempt";
    occupy(&cluster, 0, key, "other");
    occupy(&cluster, 1, key, "other");
    let monitor = cluster.node(2).monitor();
    let policy = RetryPolicy::attempts(3)
        .with_delay(ms(20))
        .with_jitter(Duration::ZERO);
    let err = rl
        .lock_with(key, Duration::from_secs(5), &policy)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // Every attempt's key on the free node is released (maybe in the background).
    assert!(cluster.wait_until(Duration::from_secs(3), |c| c.node(2).get(key).is_none()));
    let cmds = stop_commands(monitor);
    let acquires = acquire_calls(&cmds, key);
    assert_eq!(acquires.len(), 3, "one acquire per attempt: {cmds:?}");
    let tokens: HashSet<&str> = acquires.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tokens.len(),
        3,
        "tokens reused across attempts: {acquires:?}"
    );
    for (token, ttl) in &acquires {
        assert!(is_token(token), "token {token:?} is not 32 hex chars");
        assert_eq!(ttl, "5000");
    }
    // Each failed attempt was released on the node where it landed.
    let released: HashSet<String> = release_calls(&cmds, key).into_iter().collect();
    for (token, _) in &acquires {
        assert!(released.contains(token), "attempt {token} not released");
    }
}

// ---------------------------------------------------------------- 2. fan-out

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_returns_at_quorum_and_late_sets_join_the_lock() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, Duration::from_secs(2)).await;
    let key = "fan-out-ok";
    cluster.node(3).pause();
    cluster.node(4).pause();
    let t0 = Instant::now();
    let result = rl.try_lock(key, Duration::from_secs(10)).await;
    let took = t0.elapsed();
    cluster.node(3).resume();
    cluster.node(4).resume();
    let lock = result.unwrap();
    assert!(
        took < Duration::from_secs(1),
        "acquire waited for paused nodes: {took:?}"
    );
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(Duration::from_secs(3), |c| {
            c.node(3).get(key).as_deref() == Some(token.as_str())
                && c.node(4).get(key).as_deref() == Some(token.as_str())
        }),
        "late SETs did not land on the resumed nodes"
    );
    assert_eq!(cluster.count_holding(key, &token), 5);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 5);
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key(key) == 0));
}

/// On a fresh handle the connections are still being made when the two fastest
/// nodes decide the outcome; the slowest node's `SET` must still go out and land,
/// so the lock ends up on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_answers_on_a_fresh_handle_still_join_the_lock() {
    let cluster = Cluster::start(3);
    for round in 0..10 {
        let rl = redlock(&cluster, ms(300));
        let key = format!("fresh-handle:{round}");
        let lock = rl.try_lock(&key, Duration::from_secs(30)).await.unwrap();
        let token = lock.token().to_owned();
        assert!(
            cluster.wait_until(Duration::from_secs(3), |c| c.count_holding(&key, &token)
                == 3),
            "round {round}: the lock never reached the third node: {:?}",
            cluster
                .nodes()
                .iter()
                .map(|n| n.get(&key))
                .collect::<Vec<_>>()
        );
        rl.unlock(lock).await.unwrap();
        assert!(cluster.wait_until(Duration::from_secs(3), |c| c.count_with_key(&key) == 0));
    }
}

/// A handle on pools whose connections carry at most `limit` commands at a
/// time (redis' `concurrency_limit`: a command waits for room until an
/// earlier one is answered), with no response timeout of redis' own.
fn with_concurrency_limit(cluster: &Cluster, limit: usize, node_timeout: Duration) -> Redlock {
    use deadpool_redis::redis::{AsyncConnectionConfig, IntoConnectionInfo};
    cluster
        .urls()
        .iter()
        .fold(Redlock::builder(), |b, url| {
            let info = url.as_str().into_connection_info().unwrap();
            let config = AsyncConnectionConfig::new()
                .set_concurrency_limit(limit)
                .set_response_timeout(None);
            let manager = deadpool_redis::Manager::new_with_config(info, config).unwrap();
            let pool = deadpool_redis::Pool::builder(manager)
                .runtime(deadpool_redis::Runtime::Tokio1)
                .build()
                .unwrap();
            b.pool(pool)
        })
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// An acquire's `SET` that waits for room on its connection when the quorum
/// decides (redis' queue of 50 commands full under load, or a concurrency
/// limit) goes out later, and the release of the same lock, sent meanwhile
/// on that connection, can get the room first: it runs on the node before
/// the `SET`, finds nothing, and the late `SET` lands after it. That key must
/// still be released when its answer comes, not left to block the resource
/// for its whole TTL (seen in `bench concurrent`: dozens of such keys per run
/// with the default queue).
///
/// Node 4's connection carries one command at a time, and node 4 is paused
/// while the first lock's `SET` is in flight there: the second lock's `SET`
/// and then its release both wait for that room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_overtaken_by_its_release_is_released_again() {
    let cluster = Cluster::start(5);
    let rl = with_concurrency_limit(&cluster, 1, Duration::from_secs(2));
    warm_up(&cluster, &rl).await;
    let ttl = Duration::from_secs(120);
    let mut left = Vec::new();
    for round in 0..5 {
        let (first, second) = (
            format!("overtaken:{round}:a"),
            format!("overtaken:{round}:b"),
        );
        cluster.node(4).pause();
        let a = rl.try_lock(&first, ttl).await.unwrap();
        let b = rl.try_lock(&second, ttl).await.unwrap();
        let release = tokio::spawn({
            let rl = rl.clone();
            async move { rl.unlock(b).await }
        });
        // The release's own calls are out (nodes 0-3 answer) before node 4
        // gives the room back.
        assert!(
            cluster.wait_until(Duration::from_secs(5), |c| (0..4)
                .all(|i| c.node(i).get(&second).is_none())),
            "round {round}: the release did not reach nodes 0-3"
        );
        cluster.node(4).resume();
        release.await.unwrap().unwrap();
        rl.unlock(a).await.unwrap();
        let clean = cluster.wait_until(Duration::from_secs(10), |c| c.node(4).keys().is_empty());
        if !clean {
            left.push((round, cluster.node(4).keys()));
        }
    }
    assert!(
        left.is_empty(),
        "keys left on node 4 after their release: {left:?}"
    );
}

/// Nodes 0–2 hold `key` for someone else and node 4 is paused: a `try_lock` is
/// decided "busy" by the first answers. Returns how long it took, once node 4,
/// resumed, has had its late `SET` (if it ran) released in the background.
async fn busy_with_a_paused_node(node_timeout: Duration, key: &str) -> Duration {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, node_timeout).await;
    for i in 0..3 {
        occupy(&cluster, i, key, "other");
    }
    cluster.node(4).pause();
    let t0 = Instant::now();
    let result = rl.try_lock(key, Duration::from_secs(10)).await;
    let took = t0.elapsed();
    cluster.node(4).resume();
    let err = result.unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // Node 3 stored the token and is released with the failure's release
    // round, node 4 (late) in the background: wait for both, as the release
    // of node 3 may still be on its way when node 4's has landed (seen on
    // Valkey 9).
    let released = cluster.wait_until(Duration::from_secs(3), |c| {
        c.node(4).keys().is_empty() && c.node(3).get(key).is_none()
    });
    assert!(
        released,
        "node 3 kept {:?}, node 4 kept {:?}",
        cluster.node(3).get(key),
        cluster.node(4).get(key)
    );
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempt_returns_early_and_late_set_is_released() {
    let took = busy_with_a_paused_node(Duration::from_secs(2), "fan-out-busy").await;
    assert!(
        took < Duration::from_secs(1),
        "a decided failure waited for the paused node: {took:?}"
    );
}

/// The same failure with a node timeout below the 500 ms response timeout that
/// redis-rs applies on its own (see `core_faults::node_timeout_above_500ms_is_honoured`),
/// so that cap does not hide how long the failed attempt waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempt_does_not_wait_for_unanswered_nodes() {
    let took = busy_with_a_paused_node(ms(450), "fan-out-busy-pending").await;
    assert!(
        took < ms(300),
        "Busy was decided by 3 fast answers, yet try_lock took {took:?} (node_timeout 450 ms)"
    );
}

// ---------------------------------------------------------------- 3. validity

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_subtracts_drift_and_elapsed_time() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let ttl = Duration::from_secs(10);
    let lock = rl.try_lock("validity", ttl).await.unwrap();
    let remaining = lock.remaining();
    let drift = ttl.mul_f64(0.01) + ms(2);
    assert!(remaining <= ttl - drift, "{remaining:?} ignores the drift");
    assert!(remaining > ttl - ms(500), "{remaining:?} is far too short");
    assert!(lock.valid_until() <= lock.started_at() + (ttl - drift));
    assert!(lock.is_valid());
    let token = lock.token().to_owned();
    assert!(cluster.wait_until(
        Duration::from_secs(2),
        |c| c.count_holding("validity", &token) == 3
    ));
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_validity_left_fails_and_releases_every_key() {
    let cluster = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(200))
        .fixed_drift(ttl)
        .build()
        .unwrap();
    warm_up(&cluster, &rl).await;
    let key = "no-validity";
    let monitor = cluster.node(0).monitor();
    let err = rl.try_lock(key, ttl).await.unwrap_err();
    assert!(
        matches!(&err, Error::NoValidity { ttl: t, .. } if *t == ttl),
        "{err:?}"
    );
    assert!(
        cluster.wait_until(Duration::from_secs(3), |c| c.count_with_key(key) == 0),
        "the failed attempt left keys"
    );
    // The keys were really set, then released with the same token.
    let cmds = stop_commands(monitor);
    let acquires = acquire_calls(&cmds, key);
    assert_eq!(acquires.len(), 1, "{cmds:?}");
    // (A node still pending at the decision is released twice: by the failed
    // attempt and by the late-answer handler. Both carry the attempt's token.)
    let releases = release_calls(&cmds, key);
    assert!(
        !releases.is_empty() && releases.iter().all(|t| *t == acquires[0].0),
        "{cmds:?}"
    );
}

// ---------------------------------------------------------------- 4. retries

/// Every attempt counts against `max_attempts`, in both ways of waiting. Polling
/// spaces the attempts by the delay. Waking on release makes the second attempt
/// at once, once subscribed (so that a release in between is not missed); the
/// delay then only spaces the safety-net polls of a holder that never releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_attempts_are_counted_and_spaced() {
    let cluster = Cluster::start(3);
    let holder = ready(&cluster, ms(200)).await;
    for (wake, min_took) in [(false, ms(150)), (true, ms(100))] {
        let rl = Redlock::builder()
            .urls(cluster.urls())
            .node_timeout(ms(200))
            .wake_on_release(wake)
            .build()
            .unwrap();
        warm_up(&cluster, &rl).await;
        let key = format!("retry-attempts-{wake}");
        let held = held_everywhere(&cluster, &holder, &key, Duration::from_secs(10)).await;
        let monitor = cluster.node(0).monitor();
        let policy = RetryPolicy::attempts(4)
            .with_delay(ms(50))
            .with_jitter(Duration::ZERO);
        let t0 = Instant::now();
        let err = rl
            .lock_with(&key, Duration::from_secs(5), &policy)
            .await
            .unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(err, Error::Busy { .. }), "{err:?}");
        assert!(took >= min_took, "wake={wake}: took {took:?}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
        let cmds = stop_commands(monitor);
        let ours: Vec<_> = acquire_calls(&cmds, &key)
            .into_iter()
            .filter(|(t, _)| t != held.token())
            .collect();
        assert_eq!(ours.len(), 4, "wake={wake}: {cmds:?}");
        assert_eq!(cluster.count_holding(&key, held.token()), 3);
        redlock_tests::util::assert_released(&holder.unlock(held).await.unwrap(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_deadline_bounds_the_total_time() {
    let cluster = Cluster::start(3);
    let holder = ready(&cluster, ms(100)).await;
    let rl = ready(&cluster, ms(100)).await;
    let key = "retry-deadline";
    let held = held_everywhere(&cluster, &holder, key, Duration::from_secs(10)).await;
    let t0 = Instant::now();
    let err = rl
        .lock_with(key, Duration::from_secs(5), &RetryPolicy::deadline(ms(400)))
        .await
        .unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    // The last attempt starts no later than the deadline less two node
    // timeouts (its acquire round and the release of a failed attempt).
    assert!(took >= ms(200), "gave up before the deadline: {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "overran the deadline: {took:?}"
    );
    redlock_tests::util::assert_released(&holder.unlock(held).await.unwrap(), 3);
}

// ---------------------------------------------------------------- 5. release

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_falls_back_to_eval_after_script_flush() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "release-noscript";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    for node in cluster.nodes() {
        node.cmd(&["SCRIPT", "FLUSH"]);
    }
    let monitor = cluster.node(1).monitor();
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    // Decided at quorum: the last node may finish in the background.
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key(key) == 0));
    let cmds = stop_commands(monitor);
    assert!(
        cmds.iter()
            .any(|c| c[0].eq_ignore_ascii_case("EVAL") && c.get(3).map(String::as_str) == Some(key)),
        "no EVAL fallback seen: {cmds:?}"
    );
}

/// Unlocks `lock` (of `key`, held on all five nodes) while nodes 3 and 4 are
/// paused, then asserts that it was decided by the other three, in under
/// 2 s, and that the paused nodes' compare-and-deletes ran once they
/// resumed (within 5 s).
async fn release_with_two_late(cluster: &Cluster, rl: &Redlock, lock: Lock, key: &str) {
    cluster.node(3).pause();
    cluster.node(4).pause();
    let t0 = Instant::now();
    let released = rl.unlock(lock).await;
    let took = t0.elapsed();
    cluster.node(3).resume();
    cluster.node(4).resume();
    redlock_tests::util::assert_released(&released.unwrap(), 3);
    assert!(took < Duration::from_secs(2), "{key}: waited {took:?}");
    assert!(
        cluster.wait_until(Duration::from_secs(5), |c| c.count_with_key(key) == 0),
        "{key}: a late node kept the key: {:?}",
        cluster
            .nodes()
            .iter()
            .map(|n| n.get(key))
            .collect::<Vec<_>>()
    );
}

/// A release returns at quorum, its caller not waiting for the calls still
/// out (the handle's background task drives them). The paused nodes'
/// compare-and-deletes must still run when they resume, whatever drives, or
/// stops driving, their calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_left_unawaited_still_runs_on_its_nodes() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, Duration::from_secs(2)).await;
    for round in 0..3 {
        let key = format!("unawaited:{round}");
        let lock = held_everywhere(&cluster, &rl, &key, Duration::from_secs(60)).await;
        release_with_two_late(&cluster, &rl, lock, &key).await;
    }
}

/// Two nodes restarted (their scripts gone, new connections), the others
/// as before: the restarted nodes' first release is late, and must be
/// awaited all the same, since it answers `NOSCRIPT` and only an awaited
/// call sends the `EVAL` after it (the answered nodes needed no fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_release_after_a_restart_still_falls_back_to_eval() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, Duration::from_secs(2)).await;
    cluster.node(3).restart();
    cluster.node(4).restart();
    let key = "first-release-late";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(60)).await;
    release_with_two_late(&cluster, &rl, lock, key).await;
}

/// After `SCRIPT FLUSH` on every node, a release's calls still out when it
/// is decided are awaited: the answered nodes needed the `EVAL` fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_after_a_script_flush_still_falls_back() {
    let cluster = Cluster::start(5);
    let rl = ready(&cluster, Duration::from_secs(2)).await;
    let key = "flushed-release-late";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(60)).await;
    for node in cluster.nodes() {
        node.cmd(&["SCRIPT", "FLUSH"]);
    }
    release_with_two_late(&cluster, &rl, lock, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_counts_only_keys_actually_deleted() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "release-count";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    cluster.node(1).cmd(&["DEL", key]);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 2);
    // Decided at quorum: the last node may finish in the background.
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key(key) == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_a_script_never_a_bare_del() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "release-no-del";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    let token = lock.token().to_owned();
    let monitors: Vec<Monitor> = cluster.nodes().iter().map(|n| n.monitor()).collect();
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    // Decided at quorum: wait until every node's MONITOR shows its release
    // (reading the nodes instead would add this test's own commands there).
    let deadline = Instant::now() + Duration::from_secs(3);
    while !monitors
        .iter()
        .all(|m| !release_calls(&m.client_commands(), key).is_empty())
    {
        assert!(Instant::now() < deadline, "a node never showed the release");
        tokio::time::sleep(ms(10)).await;
    }
    for (i, monitor) in monitors.into_iter().enumerate() {
        let cmds = stop_commands(monitor);
        assert!(
            !cmds.is_empty() && cmds.iter().all(|c| is_script_call(c)),
            "node {i}: client sent something other than EVAL/EVALSHA: {cmds:?}"
        );
        assert!(
            !cmds.iter().any(|c| c[0].eq_ignore_ascii_case("DEL")),
            "node {i}: bare DEL: {cmds:?}"
        );
        let releases = release_calls(&cmds, key);
        assert!(
            !releases.is_empty() && releases.iter().all(|t| *t == token),
            "node {i}: {releases:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_never_deletes_another_holders_key() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "release-foreign";
    let lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(10)).await;
    let other = "0123456789abcdef0123456789abcdef";
    cluster.node(2).cmd(&["SET", key, other, "PX", "10000"]);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 2);
    assert_eq!(cluster.node(2).get(key).as_deref(), Some(other));
    assert_eq!(cluster.node(0).get(key), None);
    assert_eq!(cluster.node(1).get(key), None);
}

// ---------------------------------------------------------------- 6. extend

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_pushes_the_pttl_on_every_node() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "extend-grows";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(1)).await;
    for node in cluster.nodes() {
        assert!(node.pttl(key) <= 1000);
    }
    rl.extend(&mut lock, Duration::from_secs(10)).await.unwrap();
    // extend returns at quorum; the last node's PEXPIRE may land a moment later.
    assert!(
        cluster.wait_until(Duration::from_secs(2), |c| c
            .nodes()
            .iter()
            .all(|n| n.pttl(key) > 5000)),
        "pttls: {:?}",
        cluster
            .nodes()
            .iter()
            .map(|n| n.pttl(key))
            .collect::<Vec<_>>()
    );
    assert_eq!(lock.extensions(), 1);
    assert_eq!(lock.ttl(), Duration::from_secs(10));
    assert!(lock.remaining() > Duration::from_secs(5));
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

/// `extend` returns at quorum, but the other nodes must still be extended. Here
/// node 0 lost the library's connection, so its next call has to reconnect
/// first and is the last to answer: the extend is decided by nodes 1 and 2
/// before node 0's `PEXPIRE` is even written. That call used to be dropped with
/// the extend (and the redis connection skips a request nobody waits for), so
/// node 0's key kept its old TTL and would expire first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_decided_at_quorum_still_reaches_the_slow_node() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(500)).await;
    let key = "extend-everywhere";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(20)).await;

    // Cut node 0's connection; once its driver has seen the close, the next call
    // there fails at once and the library drops the connection.
    cluster.node(0).cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    tokio::time::sleep(ms(200)).await;
    rl.extend(&mut lock, Duration::from_secs(30)).await.unwrap();

    // Now node 0 must reconnect before it can run the extend.
    rl.extend(&mut lock, Duration::from_secs(60)).await.unwrap();
    assert!(
        cluster.wait_until(Duration::from_secs(3), |c| c
            .nodes()
            .iter()
            .all(|n| n.pttl(key) > 50_000)),
        "pttls {:?}: a node missed the extend to 60 s",
        cluster
            .nodes()
            .iter()
            .map(|n| n.pttl(key))
            .collect::<Vec<_>>()
    );
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_with_zero_ttl_is_refused_and_changes_nothing() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "extend-zero";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    let before: Vec<i64> = cluster.nodes().iter().map(|n| n.pttl(key)).collect();
    let err = rl.extend(&mut lock, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
    for (i, node) in cluster.nodes().iter().enumerate() {
        let pttl = node.pttl(key);
        assert!(
            pttl <= before[i] && pttl > before[i] - 2000,
            "node {i}: pttl {pttl} vs {}",
            before[i]
        );
    }
    assert_eq!(cluster.count_holding(key, lock.token()), 3);
    assert_eq!(lock.extensions(), 0);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_after_keys_lost_on_a_majority_is_not_held() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    let key = "extend-not-held";
    let mut lock = held_everywhere(&cluster, &rl, key, Duration::from_secs(5)).await;
    cluster.node(0).cmd(&["DEL", key]);
    cluster.node(1).cmd(&["DEL", key]);
    let err = rl
        .extend(&mut lock, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    // A minority extension does not count.
    assert_eq!(lock.extensions(), 0);
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_after_validity_ran_out_is_expired() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(50)).await;
    let key = "extend-expired";
    let mut lock = rl.try_lock(key, ms(200)).await.unwrap();
    tokio::time::sleep(ms(400)).await;
    assert!(!lock.is_valid());
    let err = rl
        .extend(&mut lock, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");
    assert_eq!(cluster.count_with_key(key), 0, "expired keys came back");
}

// ---------------------------------------------------------------- 7. busy

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_tells_when_to_retry() {
    let cluster = Cluster::start(3);
    let a = ready(&cluster, ms(200)).await;
    let b = ready(&cluster, ms(200)).await;
    let key = "busy-info";
    let ttl = Duration::from_secs(3);
    let held = held_everywhere(&cluster, &a, key, ttl).await;
    let err = b.try_lock(key, ttl).await.unwrap_err();
    match &err {
        Error::Busy {
            retry_after: Some(d),
            report,
            ..
        } => {
            assert!(
                *d > Duration::from_secs(1) && *d <= ttl,
                "retry_after {d:?}"
            );
            assert_eq!(report.ok_count(), 0);
        }
        other => panic!("expected Busy with retry_after, got {other:?}"),
    }
    assert!(err.retry_after().is_some());
    assert!(err.is_retryable());
    assert_eq!(cluster.count_holding(key, held.token()), 3);
    redlock_tests::util::assert_released(&a.unlock(held).await.unwrap(), 3);
}

/// Node 0's holder key expires in 2 s, node 1's in 8 s, node 2 is free: after
/// 2 s, nodes 0 and 2 make a quorum, so `retry_after` is about 2 s, whichever
/// answer came first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_retry_after_is_the_earliest_expiry_that_frees_a_quorum() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, ms(200)).await;
    for round in 0..20 {
        let key = format!("busy-retry-after:{round}");
        cluster.node(0).cmd(&["SET", &key, "other", "PX", "2000"]);
        cluster.node(1).cmd(&["SET", &key, "other", "PX", "8000"]);
        let err = rl
            .try_lock(&key, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err:?}");
        let after = err.retry_after().expect("busy nodes report their pttl");
        assert!(
            after <= Duration::from_secs(2),
            "round {round}: retry_after {after:?}: {err}"
        );
    }
}
