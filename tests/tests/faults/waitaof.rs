//! `WAITAOF` acks ([`ReplicaAcks::aof`]): a node counts for an acquire only
//! once its write is fsynced to its append-only file. On Valkey 9 with
//! `appendonly yes` (`appendfsync everysec`) the lock is taken after a
//! `WAITAOF 1 0` that followed the `SET`; with `appendonly no` the node does
//! not count; on Redis 7.0 (no `WAITAOF`) the node fails with
//! [`NodeError::NoWaitAof`].
//! The Valkey tests are skipped, saying so, when `VALKEY_SERVER` is unset.
//!
//! [`ReplicaAcks::aof`]: redlock_core::ReplicaAcks::aof

use std::time::{Duration, Instant};

use redlock_core::{Error, NodeError, NodeSpec, Redlock, RetryPolicy};
use redlock_tests::RedisNode;

const TTL: Duration = Duration::from_secs(20);
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// A handle whose first node waits for its own AOF (`WAITAOF 1 0`), and two
/// plain nodes; with `busy`, node 3 already holds the key for someone else,
/// so that the first node's vote decides.
fn handle(first: &RedisNode, others: &[RedisNode]) -> Redlock {
    Redlock::builder()
        .node(NodeSpec::url(first.url()).aof_acks(true, 0, ACK_TIMEOUT))
        .urls(others.iter().map(RedisNode::url))
        // `appendfsync everysec`: a write waits up to a second for its fsync.
        .node_timeout(Duration::from_secs(3))
        .retry(RetryPolicy::no_retry())
        .wake_on_release(false)
        .build()
        .expect("build the handle")
}

/// Two plain nodes, the second holding `resource`'s key for someone else.
fn others(resource: &str) -> [RedisNode; 2] {
    let others = [RedisNode::start(), RedisNode::start()];
    let key = Redlock::builder()
        .url(others[0].url())
        .build()
        .expect("a handle for the key's name")
        .key_for(resource);
    let _: () = others[1]
        .raw(&["SET", &key, "someone-else", "PX", "60000"])
        .expect("SET on node 3");
    others
}

/// The first node's error in `result`'s report.
fn first_error<T: std::fmt::Debug>(result: &Result<T, Error>) -> Option<NodeError> {
    let report = result.as_ref().err().and_then(Error::report)?;
    report
        .errors()
        .find(|(n, _)| n.index == 0)
        .map(|(_, e)| e.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_waitaof_the_lock_counts_once_its_write_is_fsynced() {
    let _turn = crate::HEAVY.read().await;
    let Some(valkey) = redlock_tests::servers::valkey_or_skip(
        "with_waitaof_the_lock_counts_once_its_write_is_fsynced",
    ) else {
        return;
    };
    let aof = RedisNode::start_binary(
        &valkey,
        &["--appendonly", "yes", "--appendfsync", "everysec"],
        &[],
    );
    let others = others("waitaof");
    let monitor = aof.monitor();
    let lock = handle(&aof, &others)
        .mutex("waitaof")
        .try_acquire(TTL)
        .await
        .expect("the lock on nodes 1 and 2");
    assert_eq!(aof.get(lock.key()).as_deref(), Some(lock.token()));
    // The `SET`, then `WAITAOF 1 0 <ms>` (on the same connection).
    let end = Instant::now() + Duration::from_secs(5);
    let waited = loop {
        let commands = monitor.client_commands();
        let set = commands
            .iter()
            .position(|c| c.first().is_some_and(|n| n == "SET"));
        let wait = commands
            .iter()
            .position(|c| c.first().is_some_and(|n| n == "WAITAOF"));
        if let (Some(set), Some(wait)) = (set, wait) {
            assert!(set < wait, "WAITAOF before the SET: {commands:?}");
            break commands[wait].clone();
        }
        assert!(
            Instant::now() < end,
            "no SET then WAITAOF seen: {commands:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(&waited[1..3], ["1", "0"], "{waited:?}");
    drop(monitor.stop());
    // The same server with no AOF: `WAITAOF 1 ..` is refused, node 1 does
    // not count, and the lock is not taken.
    let no_aof = RedisNode::start_binary(&valkey, &[], &[]);
    let others = self::others("waitaof-off");
    let refused = handle(&no_aof, &others)
        .mutex("waitaof-off")
        .try_acquire(TTL)
        .await;
    let error = first_error(&refused);
    assert!(
        matches!(&error, Some(NodeError::Server { message, .. }) if message.contains("appendonly")),
        "node 1 must refuse WAITAOF without an AOF: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_waitaof_fails_the_node_saying_so() {
    let _turn = crate::HEAVY.read().await;
    let bin = redlock_tests::redis_server_binary();
    let version = redlock_tests::servers::server_version(&bin);
    let old = RedisNode::start_binary(&bin, &["--appendonly", "yes"], &[]);
    let probe: redis::RedisResult<redis::Value> = old.raw(&["WAITAOF", "1", "0", "10"]);
    if probe.is_ok() {
        eprintln!(
            "skipped a_server_without_waitaof_fails_the_node_saying_so: {version} has WAITAOF \
             (set REDIS_SERVER to a Redis before 7.2, as the default Redis 7.0.15 is)"
        );
        return;
    }
    let others = others("no-waitaof");
    let result = handle(&old, &others)
        .mutex("no-waitaof")
        .try_acquire(TTL)
        .await;
    let error = first_error(&result);
    assert!(
        matches!(error, Some(NodeError::NoWaitAof(_))),
        "node 1 must fail for its missing WAITAOF: {result:?}"
    );
    println!(
        "{version}: {}",
        error.map(|e| e.to_string()).unwrap_or_default()
    );
}
