//! Per-node faults, each a typed node error: refused, reset, paused, foreign values, NOSCRIPT, READONLY, OOM, AUTH, BUSY, LOADING, slow answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::{Error, NodeError};
use redlock_tests::{Cluster, RedisNode};

use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};

use super::*;

// ------------------------------------------------------------ per-node faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn connection_refused_is_a_connect_error() {
    let cluster = Cluster::start(3);
    let key = "fault-refused";
    cluster.node(2).kill();
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (err, node_err) = single_node_fault(cluster.node(2).url(), key, PATIENT_NODE_TIMEOUT).await;
    assert!(matches!(err, Error::NoQuorum { .. }), "{err:?}");
    assert!(matches!(node_err, NodeError::Connect(_)), "{node_err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn connection_reset_is_an_io_error() {
    let cluster = Cluster::start(3);
    let key = "fault-reset";
    // The subject is the reset's error, not a slow node.
    let three = build(cluster.urls(), PATIENT_NODE_TIMEOUT);
    let one = build(vec![cluster.node(2).url()], PATIENT_NODE_TIMEOUT);
    // Use every connection once. The release is decided at a quorum, so the
    // next handle waits until the key is gone from every node.
    for rl in [&three, &one] {
        let lock = rl
            .mutex("use-once")
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap();
        rl.unlock(lock).await.unwrap();
        assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("use-once") == 0));
    }
    cluster.node(2).kill();
    let lock = three
        .mutex(key)
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_holding(key, lock.token())
            == 2)
    );
    drop(lock);
    let err = one
        .mutex(key)
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap_err();
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
pub(super) async fn paused_node_is_a_timeout() {
    let cluster = Cluster::start(3);
    let key = "fault-timeout";
    cluster.node(2).pause();
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, ms(100)).await;
    cluster.node(2).resume();
    assert_eq!(node_err, NodeError::Timeout(ms(100)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn foreign_hash_is_wrongtype_with_its_type_and_pttl() {
    let cluster = Cluster::start(3);
    let key = "fault-wrongtype";
    cluster.node(2).cmd(&["HSET", key, "field", "value"]);
    cluster.node(2).cmd(&["PEXPIRE", key, "5000"]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, PATIENT_NODE_TIMEOUT).await;
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
pub(super) async fn unlock_leaves_a_foreign_typed_value_alone_without_error() {
    let cluster = Cluster::start(3);
    let key = "fault-wrongtype-unlock";
    cluster.node(2).cmd(&["HSET", key, "field", "value"]);
    cluster.node(2).cmd(&["PEXPIRE", key, "5000"]);
    let rl = build(cluster.urls(), PATIENT_NODE_TIMEOUT);
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap();
    let token = lock.token().to_owned();
    assert!(cluster.wait_until(timing::settled(), |c| {
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
        cluster.wait_until(timing::settled(), |c| c.node(0).get(key).is_none()
            && c.node(1).get(key).is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn missing_eval_is_noscript() {
    let a = RedisNode::start();
    let b = RedisNode::start();
    let c = RedisNode::start_with(&["--rename-command", "EVAL", ""]);
    let key = "fault-noscript";
    quorum_survives(vec![a.url(), b.url(), c.url()], [&a, &b], key).await;
    // On one node: the first operation that runs a script (the acquire, if it is
    // a script; else the release) fails with NoScript, as EVALSHA finds no script
    // and the EVAL fallback does not exist.
    let rl = build(vec![c.url()], PATIENT_NODE_TIMEOUT);
    let err = match rl
        .mutex("fault-noscript-1")
        .try_acquire(Duration::from_secs(10))
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
pub(super) async fn replica_is_readonly() {
    let cluster = Cluster::start(3);
    let master = RedisNode::start();
    let key = "fault-readonly";
    let port = master.port().to_string();
    cluster.node(2).cmd(&["REPLICAOF", "127.0.0.1", &port]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, PATIENT_NODE_TIMEOUT).await;
    assert_eq!(node_err, NodeError::ReadOnly);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn maxmemory_is_out_of_memory() {
    let cluster = Cluster::start(3);
    let key = "fault-oom";
    cluster
        .node(2)
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    cluster.node(2).cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, PATIENT_NODE_TIMEOUT).await;
    assert_eq!(node_err, NodeError::OutOfMemory);
    assert!(cluster.node(2).keys().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn missing_password_is_auth() {
    let cluster = Cluster::start(3);
    let key = "fault-noauth";
    // Before any client of this test connects.
    cluster.node(2).cmd(&["CONFIG", "SET", "requirepass", "x"]);
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(cluster.node(2).url(), key, PATIENT_NODE_TIMEOUT).await;
    match &node_err {
        NodeError::Auth(m) => assert!(m.contains("NOAUTH"), "{m}"),
        other => panic!("expected Auth, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn wrong_password_is_auth() {
    let cluster = Cluster::start(3);
    let key = "fault-wrongpass";
    cluster
        .node(2)
        .cmd(&["CONFIG", "SET", "requirepass", "right"]);
    let wrong = format!("redis://:wrong@127.0.0.1:{}", cluster.node(2).port());
    let urls = vec![cluster.node(0).url(), cluster.node(1).url(), wrong.clone()];
    quorum_survives(urls, [cluster.node(0), cluster.node(1)], key).await;
    let (err, node_err) = single_node_fault(wrong, key, PATIENT_NODE_TIMEOUT).await;
    assert!(matches!(node_err, NodeError::Auth(_)), "{node_err:?}");
    assert!(!err.to_string().contains(":wrong@"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn busy_script_is_script_busy() {
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
    // Until the script runs: the node answers BUSY.
    assert!(
        wait_for(timing::settled(), || node
            .raw::<String>(&["PING"])
            .is_err_and(|e| e.code() == Some("BUSY"))),
        "the endless script never started"
    );
    quorum_survives(cluster.urls(), [cluster.node(0), cluster.node(1)], key).await;
    let (_, node_err) = single_node_fault(node.url(), key, PATIENT_NODE_TIMEOUT).await;
    let killed = wait_for(timing::settled(), || {
        node.raw::<redis::Value>(&["SCRIPT", "KILL"]).is_ok()
    });
    runner.join().unwrap();
    assert!(killed, "the endless script could not be killed");
    assert_eq!(node_err, NodeError::ScriptBusy);
    // The node answers again once the script is gone.
    assert!(node.keys().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn loading_dataset_is_loading() {
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
    let (_, node_err) = single_node_fault(slow.url(), key, PATIENT_NODE_TIMEOUT).await;
    let loading_for = restarted.elapsed();
    assert_eq!(
        node_err,
        NodeError::Loading,
        "(measured {loading_for:?} after the restart; loading takes about 4 s)"
    );
}

/// A node that answers after 800 ms, well inside a node timeout above
/// 500 ms (redis' own cap), must count. The node timeout leaves the 800 ms
/// the room a loaded machine needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn node_timeout_above_500ms_is_honoured() {
    let node = Arc::new(RedisNode::start());
    let node_timeout = timing::liveness(ms(800));
    let rl = build(vec![node.url()], node_timeout);
    // Connect and load the scripts first.
    let lock = rl
        .mutex("warm-up")
        .try_acquire(Duration::from_secs(30))
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
    let result = rl
        .mutex("slow-node")
        .try_acquire(Duration::from_secs(30))
        .await;
    let took = t0.elapsed();
    resumer.join().unwrap();
    let lock = result.unwrap_or_else(|e| {
        panic!(
            "a node answering after ~800 ms failed a {node_timeout:?} node timeout after {took:?}: {e}"
        )
    });
    assert!(took >= ms(700), "{took:?}");
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 1);
}
