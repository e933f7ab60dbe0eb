//! Node faults on real `redis-server` processes: every fault shows up as the
//! exact per-node [`NodeError`] in the error's report (seen on a one-node
//! Redlock, where the fault decides the outcome), and a three-node Redlock still
//! acquires while only one node is faulty. Also whole-node failures on five nodes:
//! a minority down is tolerated, a majority down is `NoQuorum`, and a paused node
//! does not slow an acquire down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::{Error, NodeError, Redlock, RetryPolicy};
use redlock_tests::{Cluster, RedisNode};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn build(urls: Vec<String>, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(urls)
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// Polls `f` every 10 ms until it holds or `timeout` passes.
fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(ms(10));
    }
}

/// A three-node Redlock over `urls` (one of them faulty) still takes the lock:
/// both healthy nodes hold the token. The lock is then released from them.
async fn quorum_survives(urls: Vec<String>, healthy: [&RedisNode; 2], key: &str) {
    let rl = build(urls, ms(300));
    let lock = rl
        .try_lock(key, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("one faulty node of three must not fail the lock: {e}"));
    let token = lock.token().to_owned();
    assert!(
        wait_for(Duration::from_secs(2), || healthy
            .iter()
            .all(|n| n.get(key).as_deref() == Some(token.as_str()))),
        "the healthy nodes do not hold the token"
    );
    // Decided at quorum: one faulty node of three does not fail the release,
    // and the healthy nodes' keys are all deleted (in the background for the
    // one not yet answered then).
    match rl.unlock(lock).await {
        Ok(r) => assert!(r.deleted + r.report().pending_count() >= 2, "{r:?}"),
        Err(e) => panic!("unexpected release error {e:?}"),
    }
    assert!(wait_for(Duration::from_secs(2), || healthy
        .iter()
        .all(|n| n.get(key).is_none())));
    for n in healthy {
        assert_eq!(n.get(key), None);
    }
}

/// What a one-node Redlock reports when its only node is faulty: the operation
/// error and the node's error.
async fn single_node_fault(url: String, key: &str, node_timeout: Duration) -> (Error, NodeError) {
    let rl = build(vec![url], node_timeout);
    let err = rl
        .try_lock(key, Duration::from_secs(10))
        .await
        .expect_err("a faulty single node cannot grant the lock");
    let report = err
        .report()
        .unwrap_or_else(|| panic!("no report in {err:?}"));
    let errors: Vec<NodeError> = report.errors().map(|(_, e)| e.clone()).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(report.ok_count(), 0);
    (err.clone(), errors[0].clone())
}

// ------------------------------------------------------------ per-node faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_a_connect_error() {
    let cluster = Cluster::start(3);
    let key = "fault-refused";
    cluster.node(2).kill();
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (err, node_err) = single_node_fault(cluster.node(2).url(), key, ms(300)).await;
    assert!(matches!(err, Error::NoQuorum { .. }), "{err:?}");
    assert!(matches!(node_err, NodeError::Connect(_)), "{node_err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_reset_is_an_io_error() {
    let cluster = Cluster::start(3);
    let key = "fault-reset";
    let three = build(cluster.urls(), ms(300));
    let one = build(vec![cluster.node(2).url()], ms(300));
    // Use every connection once. The release is decided at a quorum, so the
    // next handle waits until the key is gone from every node.
    for rl in [&three, &one] {
        let lock = rl
            .try_lock("use-once", Duration::from_secs(5))
            .await
            .unwrap();
        rl.unlock(lock).await.unwrap();
        assert!(
            cluster.wait_until(Duration::from_secs(5), |c| c.count_with_key("use-once")
                == 0)
        );
    }
    cluster.node(2).kill();
    let lock = three.try_lock(key, Duration::from_secs(5)).await.unwrap();
    assert!(cluster.wait_until(
        Duration::from_secs(2),
        |c| c.count_holding(key, lock.token()) == 2
    ));
    drop(lock);
    let err = one.try_lock(key, Duration::from_secs(5)).await.unwrap_err();
    let report = err.report().unwrap_or_else(|| panic!("{err:?}"));
    let errors: Vec<&NodeError> = report.errors().map(|(_, e)| e).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        matches!(errors[0], NodeError::Io(_) | NodeError::Connect(_)),
        "{:?}",
        errors[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_node_is_a_timeout() {
    let cluster = Cluster::start(3);
    let key = "fault-timeout";
    cluster.node(2).pause();
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, ms(100)).await;
    cluster.node(2).resume();
    assert_eq!(node_err, NodeError::Timeout(ms(100)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hash_is_wrongtype_with_its_type_and_pttl() {
    let cluster = Cluster::start(3);
    let key = "fault-wrongtype";
    cluster.node(2).cmd(&["HSET", key, "field", "value"]);
    cluster.node(2).cmd(&["PEXPIRE", key, "5000"]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, ms(300)).await;
    match node_err {
        NodeError::WrongType { found, pttl_ms } => {
            assert_eq!(found, "hash");
            assert!(pttl_ms > 0 && pttl_ms <= 5000, "pttl {pttl_ms}");
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    // The foreign value is never touched.
    assert_eq!(
        cluster.node(2).raw::<String>(&["TYPE", key]).unwrap(),
        "hash"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_leaves_a_foreign_typed_value_alone_without_error() {
    let cluster = Cluster::start(3);
    let key = "fault-wrongtype-unlock";
    cluster.node(2).cmd(&["HSET", key, "field", "value"]);
    cluster.node(2).cmd(&["PEXPIRE", key, "5000"]);
    let rl = build(cluster.urls(), ms(300));
    let lock = rl.try_lock(key, Duration::from_secs(10)).await.unwrap();
    let token = lock.token().to_owned();
    assert!(cluster.wait_until(Duration::from_secs(2), |c| {
        c.node(0).get(key).as_deref() == Some(token.as_str())
            && c.node(1).get(key).as_deref() == Some(token.as_str())
    }));
    let result = rl.unlock(lock).await;
    assert_eq!(
        cluster.node(2).raw::<String>(&["TYPE", key]).unwrap(),
        "hash"
    );
    // Both keys this lock owned are deleted (the one not yet answered when the
    // release was decided, in the background) and no node failed to answer.
    redlock_tests::util::assert_released(&result.unwrap(), 2);
    assert!(
        cluster.wait_until(Duration::from_secs(2), |c| c.node(0).get(key).is_none()
            && c.node(1).get(key).is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_eval_is_noscript() {
    let a = RedisNode::start();
    let b = RedisNode::start();
    let c = RedisNode::start_with(&["--rename-command", "EVAL", ""]);
    let key = "fault-noscript";
    quorum_survives(vec![a.url(), b.url(), c.url()], [&a, &b], key).await;
    // On one node: the first operation that runs a script (the acquire, if it is
    // a script; else the release) fails with NoScript, as EVALSHA finds no script
    // and the EVAL fallback does not exist.
    let rl = build(vec![c.url()], ms(300));
    let err = match rl
        .try_lock("fault-noscript-1", Duration::from_secs(10))
        .await
    {
        Err(e) => e,
        Ok(lock) => rl
            .unlock(lock)
            .await
            .expect_err("the release needs a script"),
    };
    assert!(
        matches!(
            err,
            Error::NoQuorum { .. } | Error::ReleaseIncomplete { .. }
        ),
        "{err:?}"
    );
    let report = err.report().unwrap_or_else(|| panic!("{err:?}"));
    let errors: Vec<&NodeError> = report.errors().map(|(_, e)| e).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        matches!(errors[0], NodeError::NoScript(_)),
        "{:?}",
        errors[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_is_readonly() {
    let cluster = Cluster::start(3);
    let master = RedisNode::start();
    let key = "fault-readonly";
    let port = master.port().to_string();
    cluster.node(2).cmd(&["REPLICAOF", "127.0.0.1", &port]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, ms(300)).await;
    assert_eq!(node_err, NodeError::ReadOnly);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxmemory_is_out_of_memory() {
    let cluster = Cluster::start(3);
    let key = "fault-oom";
    cluster
        .node(2)
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    cluster.node(2).cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, ms(300)).await;
    assert_eq!(node_err, NodeError::OutOfMemory);
    assert!(cluster.node(2).keys().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_password_is_auth() {
    let cluster = Cluster::start(3);
    let key = "fault-noauth";
    // Before any client of this test connects.
    cluster.node(2).cmd(&["CONFIG", "SET", "requirepass", "x"]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, ms(300)).await;
    match &node_err {
        NodeError::Auth(m) => assert!(m.contains("NOAUTH"), "{m}"),
        other => panic!("expected Auth, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_auth() {
    let cluster = Cluster::start(3);
    let key = "fault-wrongpass";
    cluster
        .node(2)
        .cmd(&["CONFIG", "SET", "requirepass", "right"]);
    let wrong = format!("redis://:wrong@127.0.0.1:{}", cluster.node(2).port());
    let urls = vec![cluster.node(0).url(), cluster.node(1).url(), wrong.clone()];
    quorum_survives(urls, [cluster.node(0), cluster.node(1)], key).await;
    let (err, node_err) = single_node_fault(wrong, key, ms(300)).await;
    assert!(matches!(node_err, NodeError::Auth(_)), "{node_err:?}");
    assert!(!err.to_string().contains(":wrong@"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_script_is_script_busy() {
    let cluster = Cluster::start(3);
    let key = "fault-busy";
    let node = Arc::clone(cluster.node(2));
    node.cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"]);
    let runner = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || {
            // Times out client side after 2 s, or fails once killed.
            let _ = node.raw::<redis::Value>(&["EVAL", "local i=0 while true do i=i+1 end", "0"]);
        })
    };
    std::thread::sleep(ms(200));
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(node.url(), key, ms(300)).await;
    let killed = wait_for(Duration::from_secs(3), || {
        node.raw::<redis::Value>(&["SCRIPT", "KILL"]).is_ok()
    });
    runner.join().unwrap();
    assert!(killed, "the endless script could not be killed");
    assert_eq!(node_err, NodeError::ScriptBusy);
    // The node answers again once the script is gone.
    assert!(node.keys().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_dataset_is_loading() {
    let a = RedisNode::start();
    let b = RedisNode::start();
    // `key-load-delay` (µs per key) makes loading slow; processing events every
    // 1 KiB of RDB lets the node answer (with LOADING) while it loads.
    let slow = RedisNode::start_with(&[
        "--key-load-delay",
        "1000",
        "--loading-process-events-interval-bytes",
        "1024",
    ]);
    let filled: i64 = slow
        .raw(&[
            "EVAL",
            "for i=1,4000 do redis.call('SET','filler:'..i,'v') end return 4000",
            "0",
        ])
        .unwrap();
    assert_eq!(filled, 4000);
    slow.cmd(&["SAVE"]);
    assert!(slow.dir().join("dump.rdb").is_file());
    // restart() returns once INFO answers, which it does while loading.
    let restarted = Instant::now();
    slow.restart();
    let key = "fault-loading";
    quorum_survives(vec![a.url(), b.url(), slow.url()], [&a, &b], key).await;
    let (_, node_err) = single_node_fault(slow.url(), key, ms(400)).await;
    let loading_for = restarted.elapsed();
    assert_eq!(
        node_err,
        NodeError::Loading,
        "(measured {loading_for:?} after the restart; loading takes about 4 s)"
    );
}

/// A node that answers after 800 ms, well inside a 2 s node timeout, must count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_timeout_above_500ms_is_honoured() {
    let node = Arc::new(RedisNode::start());
    let rl = build(vec![node.url()], Duration::from_secs(2));
    // Connect and load the scripts first.
    let lock = rl
        .try_lock("warm-up", Duration::from_secs(5))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    node.pause();
    let resumer = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || {
            std::thread::sleep(ms(800));
            node.resume();
        })
    };
    let t0 = Instant::now();
    let result = rl.try_lock("slow-node", Duration::from_secs(10)).await;
    let took = t0.elapsed();
    resumer.join().unwrap();
    let lock = result.unwrap_or_else(|e| {
        panic!("a node answering after ~800 ms failed a 2 s node timeout after {took:?}: {e}")
    });
    assert!(took >= ms(700), "{took:?}");
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 1);
}

// ------------------------------------------------------- whole-node failures

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_nodes_down_still_locks() {
    let cluster = Cluster::start(5);
    let rl = build(cluster.urls(), ms(200));
    cluster.node(3).kill();
    cluster.node(4).kill();
    let key = "down-2-of-5";
    let lock = rl.try_lock(key, Duration::from_secs(10)).await.unwrap();
    assert!(cluster.wait_until(
        Duration::from_secs(2),
        |c| c.count_holding(key, lock.token()) == 3
    ));
    // The release is confirmed on the three live nodes: `Ok`, with the two
    // dead ones in the report, not an error.
    match rl.unlock(lock).await {
        Ok(r) => {
            redlock_tests::util::assert_released(&r, 3);
            assert!(r.report().failed_count() <= 2, "{r:?}");
        }
        other => panic!("expected Ok with 2 dead nodes, got {other:?}"),
    }
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key(key) == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_nodes_down_is_no_quorum() {
    let cluster = Cluster::start(5);
    let node_timeout = ms(200);
    let rl = build(cluster.urls(), node_timeout);
    for i in 2..5 {
        cluster.node(i).kill();
    }
    let key = "down-3-of-5";
    let policy = RetryPolicy::attempts(3)
        .with_delay(ms(50))
        .with_jitter(Duration::ZERO);
    let t0 = Instant::now();
    let err = rl
        .lock_with(key, Duration::from_secs(10), &policy)
        .await
        .unwrap_err();
    let took = t0.elapsed();
    match &err {
        Error::NoQuorum {
            ok, quorum, report, ..
        } => {
            assert!(*ok <= 2, "{ok}");
            assert_eq!(*quorum, 3);
            assert!(report.failed_count() >= 1, "{report}");
            for (_, e) in report.errors() {
                assert!(matches!(e, NodeError::Connect(_)), "{e:?}");
            }
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // Each attempt: at most one node timeout to acquire and one to release.
    let budget = 3 * 2 * node_timeout + 2 * ms(50);
    assert!(
        took < budget + Duration::from_secs(1),
        "took {took:?}, budget {budget:?}"
    );
    // Answers still in flight when the failure was decided are released as they
    // arrive, in the background.
    assert!(
        cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key(key) == 0),
        "a failed attempt left keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_paused_node_does_not_slow_the_acquire() {
    let cluster = Cluster::start(5);
    let rl = build(cluster.urls(), ms(500));
    let lock = rl
        .try_lock("warm-up", Duration::from_secs(5))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    cluster.node(4).pause();
    let key = "paused-1-of-5";
    let t0 = Instant::now();
    let result = rl.try_lock(key, Duration::from_secs(10)).await;
    let took = t0.elapsed();
    let lock = result.unwrap();
    // Waiting for the paused node would take its 500 ms node timeout.
    assert!(
        took < ms(400),
        "acquire waited for the paused node: {took:?}"
    );
    assert!(lock.remaining() > Duration::from_secs(9));
    cluster.node(4).resume();
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(Duration::from_secs(2), |c| c.count_holding(key, &token)
            >= 3)
    );
    drop(lock);
    assert!(cluster.wait_until(Duration::from_secs(3), |c| c.count_with_key(key) == 0));
}

// ------------------------------------------------- reconnects (issue 10, A)

/// Through three proxies adding `one_way` each direction, a long-lived handle
/// with a 200 ms node timeout makes 20 `try_lock` + `unlock` attempts 100 ms
/// apart. Returns whether the first attempt acquired and how many of the
/// 19 others did.
async fn acquired_through_latency(one_way: Duration) -> (bool, usize) {
    use redlock_tests::proxy::{Direction, FaultProxy};
    let cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        let proxy = FaultProxy::start(i, node.port(), None).await.unwrap();
        proxy.delay(Direction::Request, one_way, Duration::ZERO);
        proxy.delay(Direction::Reply, one_way, Duration::ZERO);
        proxies.push(proxy);
    }
    let rl = Redlock::builder()
        .urls(proxies.iter().map(|p| p.url()))
        .node_timeout(ms(200))
        .build()
        .unwrap();
    let mut outcomes = Vec::new();
    for i in 0..20 {
        let acquired = match rl
            .try_lock(&format!("rtt-{i}"), Duration::from_secs(2))
            .await
        {
            Ok(lock) => {
                let _ = rl.unlock(lock).await;
                true
            }
            Err(e) => {
                eprintln!("{one_way:?} each way, attempt {i}: {e}");
                false
            }
        };
        outcomes.push(acquired);
        tokio::time::sleep(ms(100)).await;
    }
    let rest = outcomes[1..].iter().filter(|a| **a).count();
    (outcomes[0], rest)
}

/// A connect + handshake (one round trip) plus the `SET` (another) take 240 ms
/// at 120 ms RTT, longer than the 200 ms node timeout: the first call times
/// out, but the connection it waited for must stay, so every later call
/// (120 ms) succeeds. (Scaled up from 30 ms RTT against 50 ms, whose 20 ms of
/// slack a loaded 2-core machine sometimes ate.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_survives_a_handshake_longer_than_the_node_timeout() {
    let (first_80, rest_80) = acquired_through_latency(ms(40)).await;
    let (first_120, rest_120) = acquired_through_latency(ms(60)).await;
    eprintln!(
        "80 ms RTT: first {first_80}, {rest_80}/19 after; 120 ms RTT: first {first_120}, {rest_120}/19 after"
    );
    assert!(rest_80 >= 18, "80 ms RTT: {rest_80} of 19 acquired");
    assert!(rest_120 >= 18, "120 ms RTT: {rest_120} of 19 acquired");
}

/// `total_connections_received` on the node (the connection that asks counts).
fn connections_received(node: &RedisNode) -> i64 {
    let info: String = node.raw(&["INFO", "stats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .expect("total_connections_received in INFO stats")
}

/// Concurrent callers on a cold node wait for one connection attempt instead of
/// each opening its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_on_a_cold_node_open_one_connection() {
    let node = RedisNode::start();
    let rl = build(vec![node.url()], ms(500));
    let before = connections_received(&node);
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (rl, barrier) = (rl.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let lock = rl
                    .try_lock(&format!("cold-{i}"), Duration::from_secs(5))
                    .await
                    .unwrap();
                rl.unlock(lock).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Less the connection that asked the second time.
    let opened = connections_received(&node) - before - 1;
    assert_eq!(
        opened, 1,
        "16 concurrent callers opened {opened} connections"
    );
}

/// A call that fails on an old connection after a newer one replaced it must
/// not drop the newer one. X and Y are sent on connection 1 into a blackhole;
/// X times out first and forgets connection 1; X's release opens connection 2
/// (new connections pass again); then Y times out on connection 1. The next
/// calls must still use connection 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_failure_on_an_old_connection_keeps_the_new_one() {
    use redlock_tests::proxy::{DirFault, Direction, FaultProxy};
    let node = RedisNode::start();
    let proxy = FaultProxy::start(0, node.port(), None).await.unwrap();
    let rl = build(vec![proxy.url()], ms(400));
    let lock = rl
        .try_lock("warm-up", Duration::from_secs(5))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    assert_eq!(proxy.stats().accepted, 1);

    proxy.blackhole();
    let x = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.try_lock("late-x", Duration::from_secs(5)).await })
    };
    tokio::time::sleep(ms(200)).await;
    let y = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.try_lock("late-y", Duration::from_secs(5)).await })
    };
    tokio::time::sleep(ms(50)).await;
    // New connections pass; connection 1 lost bytes, so it stays dead (no reset).
    proxy.set(Direction::Request, DirFault::default());
    proxy.set(Direction::Reply, DirFault::default());
    let x = x.await.unwrap().unwrap_err();
    assert!(x.report().is_some(), "{x:?}");
    assert!(
        wait_for(Duration::from_secs(1), || proxy.stats().accepted == 2),
        "X's release did not reconnect: {:?}",
        proxy.stats()
    );
    let y = y.await.unwrap().unwrap_err();
    let report = y.report().unwrap_or_else(|| panic!("{y:?}"));
    assert!(
        report
            .errors()
            .all(|(_, e)| matches!(e, NodeError::Timeout(_))),
        "{y}"
    );
    tokio::time::sleep(ms(100)).await;
    let lock = rl.try_lock("after", Duration::from_secs(5)).await.unwrap();
    rl.unlock(lock).await.unwrap();
    assert_eq!(
        proxy.stats().accepted,
        2,
        "Y's late timeout dropped the newer connection"
    );
}

/// A `SET` that waits for a cold connection's handshake and the release sent
/// after it wait for the same handshake, and may go out in either order: the
/// release can run first on that node and find nothing. The late `OK` must then
/// be released again; otherwise its key blocks the resource there for its TTL.
/// Node 2 sits behind a proxy that holds its replies until the lock has been
/// taken and released on nodes 0 and 1; each round uses a new handle, so node
/// 2's connection is cold each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_set_behind_a_cold_handshake_is_not_left_by_the_release() {
    use redlock_tests::proxy::{Direction, FaultProxy};
    let cluster = Cluster::start(3);
    let proxy = FaultProxy::start(2, cluster.node(2).port(), None)
        .await
        .unwrap();
    let urls = vec![cluster.node(0).url(), cluster.node(1).url(), proxy.url()];
    let mut ghosts = Vec::new();
    for round in 0..20 {
        let key = format!("cold-{round}");
        proxy.hold(Direction::Reply);
        let rl = build(urls.clone(), ms(3000));
        let lock = rl.try_lock(&key, Duration::from_secs(60)).await.unwrap();
        rl.unlock(lock).await.unwrap();
        proxy.flush();
        // Both calls reach node 2 once the handshake is through; a key that
        // is still there long after that was left behind.
        let gone = wait_for(Duration::from_secs(5), || cluster.count_with_key(&key) == 0);
        if !gone {
            ghosts.push((round, cluster.node(2).pttl(&key)));
        }
    }
    assert!(
        ghosts.is_empty(),
        "keys left on node 2 after the release (round, PTTL ms): {ghosts:?}"
    );
}

// ------------------------------------- acquire secondary errors (issue 10, B)

/// A user allowed `SET`, the scripts and the handshake, but not `PTTL` or `TYPE`.
const LOCKER_PASSWORD: &str = "locker-s3cret-pw";

fn add_locker_user(node: &RedisNode) {
    node.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        &format!(">{LOCKER_PASSWORD}"),
        "~*",
        "+@connection",
        "+set",
        "+get",
        "+del",
        "+pexpire",
        "+eval",
        "+evalsha",
        "+info",
        "+ping",
    ]);
}

/// `SET` said OK but `PTTL` and `TYPE` were refused: the node holds the key, so
/// it counts as acquired. When `SET` said nil, it is busy with no known PTTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_judges_by_set_when_pttl_and_type_are_refused() {
    let cluster = Cluster::start(3);
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| {
            add_locker_user(n);
            format!("redis://locker:{LOCKER_PASSWORD}@127.0.0.1:{}", n.port())
        })
        .collect();
    let rl = build(urls, ms(300));
    let key = "acl-no-pttl";
    let lock = rl
        .try_lock(key, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("SET said OK on every node: {e}"));
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(Duration::from_secs(2), |c| c.count_holding(key, &token)
            == 3)
    );

    let err = rl
        .try_lock(key, Duration::from_secs(10))
        .await
        .expect_err("the key is held");
    let shown = [
        format!("{err}"),
        format!("{err:?}"),
        format!("{rl:?}"),
        format!("{lock:?}"),
    ];
    match &err {
        Error::Busy { report, .. } => {
            assert!(report.busy_count() >= 2, "{report}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    for s in &shown {
        assert!(!s.contains(LOCKER_PASSWORD), "password shown: {s}");
    }
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    assert!(cluster.wait_until(Duration::from_secs(2), |c| c.count_with_key(key) == 0));
}
