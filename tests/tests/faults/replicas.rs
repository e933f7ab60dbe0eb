//! A node that is one primary with a replica behind a failover endpoint
//! (`redlock_tests::replicas`), and a failover while a lock is held (issue
//! 40): node 1 is the group, nodes 2 and 3 are plain, node 3 is away (cut
//! off by a blackholing proxy, so that A's `SET` never lands there late)
//! while holder A takes the lock (so A holds nodes 1 and 2),
//! the primary is killed and its replica promoted, node 3 comes back, and
//! holder B tries the same key.
//!
//! - With replica acks (`WAIT 1` after each write), the promoted replica has
//!   A's key and B is refused; when the link is stalled, A's write on node 1
//!   does not count ([`NodeError::ReplicaAcks`]), so A gets no lock at all.
//! - Without them (the negative control), the replication link is stalled
//!   before A's write (so the replica surely lacks the key), and B takes the
//!   lock on nodes 1 and 3 while A's is still valid: two holders.
//!
//! Runs on the server `REDIS_SERVER` names (the Valkey CI step runs this
//! binary with `REDIS_SERVER=$VALKEY_SERVER`).

use std::time::Duration;

use redlock_core::{Error, NodeError, NodeSpec, Redlock, RetryPolicy};
use redlock_tests::RedisNode;
use redlock_tests::proxy::FaultProxy;
use redlock_tests::replicas::ReplicaGroup;

const TTL: Duration = Duration::from_secs(20);
/// Long enough for a loaded 2-core machine: the acks under test are a
/// replica's answer to `WAIT`, not a race against the clock (a 500 ms wait
/// timed out once in CI with the replica's link up).
const NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest `WAIT`; the node timeout above leaves it room.
const ACK_TIMEOUT: Duration = Duration::from_secs(3);

/// The group, the two plain nodes, and a handle per holder.
struct Setup {
    group: ReplicaGroup,
    node2: RedisNode,
    /// Node 3's server, kept running behind its proxy.
    _node3: RedisNode,
    /// In front of node 3: blackholed while node 3 is away.
    to_node3: FaultProxy,
}

impl Setup {
    async fn start() -> Self {
        let node3 = RedisNode::start();
        let to_node3 = FaultProxy::start(3, node3.port(), None)
            .await
            .expect("start node 3's proxy");
        Self {
            group: ReplicaGroup::start().await,
            node2: RedisNode::start(),
            _node3: node3,
            to_node3,
        }
    }

    /// Node 3 away: what is sent to it is dropped.
    fn node3_away(&self) {
        self.to_node3.blackhole();
    }

    /// Node 3 back, its blackholed connections reset.
    fn node3_back(&self) {
        self.to_node3.heal();
    }

    /// A holder's handle (each holder has its own, as two processes would).
    fn handle(&self, acks: bool) -> Redlock {
        let mut first = NodeSpec::url(self.group.url());
        if acks {
            first = first.replica_acks(1, ACK_TIMEOUT);
        }
        Redlock::builder()
            .node(first)
            .url(self.node2.url())
            .url(self.to_node3.url())
            .node_timeout(NODE_TIMEOUT)
            .retry(RetryPolicy::no_retry())
            .wake_on_release(false)
            .build()
            .expect("build the handle")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_the_promoted_replica_keeps_the_lock() {
    let _turn = crate::HEAVY.read().await;
    let s = Setup::start().await;
    s.node3_away();
    let a = s
        .handle(true)
        .mutex("failover")
        .try_acquire(TTL)
        .await
        .expect("A takes the lock on nodes 1 and 2");
    // `WAIT` answered: the replica has the key before the failover.
    assert_eq!(s.group.replica().get(a.key()).as_deref(), Some(a.token()));
    s.group.failover().await;
    s.node3_back();
    let b = s.handle(true).mutex("failover").try_acquire(TTL).await;
    assert!(
        matches!(b, Err(Error::Busy { .. } | Error::NoQuorum { .. })),
        "B must be refused while A holds the lock: {b:?}"
    );
    assert_eq!(
        s.group.replica().get(a.key()).as_deref(),
        Some(a.token()),
        "the promoted replica holds A's key"
    );
    assert!(a.is_valid(), "A's lock is still valid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_write_the_replica_missed_does_not_count() {
    let _turn = crate::HEAVY.read().await;
    let s = Setup::start().await;
    s.node3_away();
    s.group.stall();
    let a = s.handle(true).mutex("failover").try_acquire(TTL).await;
    let Some(report) = a.as_ref().err().and_then(Error::report) else {
        panic!("A must not get the lock with node 1's write unacked: {a:?}");
    };
    let first = &report.nodes[0];
    let acks = report
        .errors()
        .find(|(n, _)| n.index == 0)
        .map(|(_, e)| e.clone());
    assert!(
        matches!(
            acks,
            Some(NodeError::ReplicaAcks {
                acked: 0,
                wanted: 1,
                ..
            })
        ),
        "node 1 ({}) must fail for its replica acks: {acks:?}",
        first.node
    );
    s.group.failover().await;
    s.node3_back();
    // No one holds it: B takes it, and B is the only holder.
    let b = s.handle(true).mutex("failover").try_acquire(TTL).await;
    assert!(b.is_ok(), "B takes the free lock: {b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acks_a_failover_hands_the_lock_out_twice() {
    let _turn = crate::HEAVY.read().await;
    let s = Setup::start().await;
    s.node3_away();
    s.group.stall();
    let a = s
        .handle(false)
        .mutex("failover")
        .try_acquire(TTL)
        .await
        .expect("A takes the lock on nodes 1 and 2");
    s.group.failover().await;
    assert_eq!(
        s.group.replica().get(a.key()),
        None,
        "the promoted replica never got A's key"
    );
    s.node3_back();
    let b = s.handle(false).mutex("failover").try_acquire(TTL).await;
    let b = b.expect("negative control: B takes the lock on nodes 1 and 3");
    assert_eq!(s.group.replica().get(b.key()).as_deref(), Some(b.token()));
    assert_eq!(s.node2.get(a.key()).as_deref(), Some(a.token()));
    assert!(
        a.is_valid() && b.is_valid(),
        "two holders of one lock at once: A ({:?} left) and B ({:?} left)",
        a.remaining(),
        b.remaining()
    );
    println!(
        "negative control ({}): A and B both hold {:?} after the failover (A {:?} left, B {:?} left)",
        redlock_tests::servers::server_version(&redlock_tests::redis_server_binary()),
        a.key(),
        a.remaining(),
        b.remaining()
    );
}

/// Issue 49, item 2: a primary with no replica attached (as a promoted one
/// is until its first replica has synced) on a node with replica acks, and
/// eight acquires at once. The server runs the connection's commands in
/// order, so each `WAIT` starts only when the one before it has waited its
/// whole timeout, and the later ones cannot answer within the node timeout.
/// Every call still fails for its acks ([`NodeError::ReplicaAcks`], the late
/// ones marked `queued`), never with a `Timeout` that would send an operator
/// looking for a slow server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_queued_behind_waits_fail_for_their_acks_not_a_timeout() {
    let _turn = crate::HEAVY.read().await;
    let node = RedisNode::start();
    // Four `WAIT`s in a row fill the node timeout: the fifth on cannot start
    // in time.
    let ack_timeout = Duration::from_millis(500);
    let rl = Redlock::builder()
        .node(NodeSpec::url(node.url()).replica_acks(1, ack_timeout))
        .node_timeout(ack_timeout * 4)
        .retry(RetryPolicy::no_retry())
        .wake_on_release(false)
        .build()
        .expect("build the handle");
    // The connection is made first, so that all eight go out on it at once.
    rl.inspect("warm-up").await.expect("inspect");
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let rl = rl.clone();
            tokio::spawn(async move { rl.mutex(format!("queued-{i}")).try_acquire(TTL).await })
        })
        .collect();
    let mut queued = 0;
    for call in calls {
        let err = call
            .await
            .expect("the task")
            .expect_err("no replica acknowledges the write");
        let errors: Vec<NodeError> = err
            .report()
            .map(|r| r.errors().map(|(_, e)| e.clone()).collect())
            .unwrap_or_default();
        match errors.as_slice() {
            [
                NodeError::ReplicaAcks {
                    acked: 0,
                    wanted: 1,
                    queued: q,
                    ..
                },
            ] => queued += usize::from(*q),
            other => panic!("the node must fail for its acks: {other:?} ({err})"),
        }
    }
    assert!(
        queued > 0,
        "no WAIT was queued: this test's subject did not happen"
    );
}
