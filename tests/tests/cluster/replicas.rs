//! Replica acks on a cluster node (issue 40): node 1 is a cluster whose
//! masters have a replica each, nodes 2 and 3 are clusters of masters only.
//! Node 3 is busy (another holder's key, deleted before B's turn) while
//! holder A takes the lock, so A holds nodes 1 and 2; then the master that
//! serves the key's slot on node 1 is killed and its replica takes over
//! (`CLUSTER FAILOVER TAKEOVER`), and holder B tries the same key.
//!
//! - With replica acks (`WAIT 1` on the slot's master after each write),
//!   the promoted replica has A's key and B is refused.
//! - Without them (the negative control), the replica is stopped (SIGSTOP)
//!   and its link cut before A's write, so it surely lacks the key: B takes
//!   the lock on nodes 1 and 3 while A's is still valid, two holders.
//! - With replica acks and the replica stopped, A's write on node 1 does not
//!   count, and the error names the master and the slot.
//! - With replica acks and a failover between A's write and its `WAIT`
//!   (issue 47, item 10): the replica, which never got A's write, takes
//!   over, and the old master rejoins as its replica, so the new master's
//!   `WAIT` is acked. A's write is lost, and node 1 must not count it:
//!   its master changed between the write and the acks
//!   ([`NodeError::MasterChanged`]). A retry on the same handle counts.
//! - The check's cost: a handle asks a slot's master for its replication ID
//!   once, before its first acked write there, not on every call.
//!
//! Runs on the server `REDIS_SERVER` names (Valkey 9 with
//! `REDIS_SERVER=$VALKEY_SERVER`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::{Error, Lock, NodeError, NodeSpec, Redlock, RetryPolicy};
use redlock_tests::timing::liveness;
use redlock_tests::util::{poll_until, within};
use redlock_tests::{RedisCluster, RedisNode};

const TTL: Duration = Duration::from_secs(30);
/// Long enough for a loaded 2-core machine: the acks under test are a
/// replica's answer to `WAIT`, not a race against the clock (a 500 ms wait
/// timed out once in CI with the replica's link up).
const NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest `WAIT`; the node timeout above leaves it room.
const ACK_TIMEOUT: Duration = Duration::from_secs(3);
const RESOURCE: &str = "cluster-failover";
/// How long `fail_over` and the old master's return as a replica may take
/// on a quiet machine (a takeover, a restart, a full resync).
const FAILOVER_WITHIN: Duration = Duration::from_secs(20);

/// Node 1 (replicas), nodes 2 and 3 (masters only).
struct Setup {
    clusters: [RedisCluster; 3],
    /// The lock key, and its slot (the same in every cluster).
    key: String,
    slot: u16,
}

impl Setup {
    fn start() -> Self {
        let with_replicas = std::thread::spawn(|| RedisCluster::start(3, 1));
        let plain: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(|| RedisCluster::start(3, 0)))
            .collect();
        let mut plain = plain.into_iter().map(|h| h.join().expect("a cluster"));
        let clusters = [
            with_replicas.join().expect("the cluster with replicas"),
            plain.next().expect("node 2"),
            plain.next().expect("node 3"),
        ];
        let key = Redlock::builder()
            .url("redis://127.0.0.1:1")
            .build()
            .expect("a handle for the key's name")
            .key_for(RESOURCE);
        let slot = clusters[0].slot_of(key.as_bytes());
        Self {
            clusters,
            key,
            slot,
        }
    }

    /// A holder's handle, connected to every node (its cluster connections
    /// made while every member answers: redis' cluster connection waits
    /// for a stopped replica's handshake when it connects).
    async fn connected(&self, acks: bool) -> Redlock {
        let handle = self.handle(acks);
        let seen = handle.inspect("warm-up").await.expect("inspect");
        assert!(
            seen.nodes.iter().all(|n| n.state.is_ok()),
            "a node did not answer: {seen:?}"
        );
        handle
    }

    /// A holder's handle (each holder has its own, as two processes would).
    fn handle(&self, acks: bool) -> Redlock {
        self.handle_timing_out(acks, NODE_TIMEOUT)
    }

    /// [`Setup::handle`] with node timeout `node_timeout`.
    fn handle_timing_out(&self, acks: bool, node_timeout: Duration) -> Redlock {
        let mut first = NodeSpec::cluster(self.clusters[0].seeds());
        if acks {
            first = first.replica_acks(1, ACK_TIMEOUT);
        }
        Redlock::builder()
            .node(first)
            .cluster(self.clusters[1].seeds())
            .cluster(self.clusters[2].seeds())
            .node_timeout(node_timeout)
            .retry(RetryPolicy::no_retry())
            .wake_on_release(false)
            .build()
            .expect("build the handle")
    }

    /// The master serving the key's slot on node 1, and its replica.
    fn shard(&self) -> (Arc<RedisNode>, Arc<RedisNode>) {
        let master = self.clusters[0]
            .owner(self.slot)
            .expect("the slot's master");
        let port = master.port().to_string();
        let replica = self.clusters[0]
            .replicas()
            .iter()
            .find(|r| info_field(r, "master_port") == port)
            .cloned()
            .expect("the master's replica");
        (master, replica)
    }

    /// Node 3 busy: another holder's key there.
    fn node3_busy(&self) {
        let owner = self.clusters[2].owner(self.slot).expect("node 3's master");
        let _: () = owner
            .raw(&["SET", &self.key, "someone-else", "PX", "60000"])
            .expect("SET on node 3");
    }

    /// Node 3 free again (the other holder released).
    fn node3_free(&self) {
        let owner = self.clusters[2].owner(self.slot).expect("node 3's master");
        let _: i64 = owner.raw(&["DEL", &self.key]).expect("DEL on node 3");
    }

    /// The slot's master killed (if it still runs) and its replica
    /// (running) taking over.
    fn fail_over(&self, master: &RedisNode, replica: &RedisNode) {
        if master.is_running() {
            master.kill();
        }
        let _: () = replica
            .raw(&["CLUSTER", "FAILOVER", "TAKEOVER"])
            .expect("CLUSTER FAILOVER TAKEOVER");
        assert!(
            poll_until(liveness(FAILOVER_WITHIN), || self.clusters[0]
                .owner(self.slot)
                .is_some_and(|o| o.port() == replica.port())),
            "the replica did not take over: {}",
            self.clusters[0].describe()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_the_promoted_replica_of_a_cluster_keeps_the_lock() {
    let s = Setup::start();
    let (master, replica) = s.shard();
    s.node3_busy();
    let a = s
        .handle(true)
        .mutex(RESOURCE)
        .try_acquire(TTL)
        .await
        .expect("A takes the lock on nodes 1 and 2");
    // The `WAIT` answered: the replica has the key before the failover.
    assert_eq!(read(&replica, a.key()).as_deref(), Some(a.token()));
    s.fail_over(&master, &replica);
    s.node3_free();
    let b = s.handle(true);
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match b.mutex(RESOURCE).try_acquire(TTL).await {
            Ok(lock) => panic!(
                "B got the lock while A holds it: A {:?} left, B {:?} left",
                a.remaining(),
                lock.remaining()
            ),
            // Node 1 answered (its new master): it refused B.
            Err(e) if answered_by_node1(&e) => break,
            Err(e) => assert!(Instant::now() < end, "node 1 never answered B: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        read(&replica, a.key()).as_deref(),
        Some(a.token()),
        "the promoted replica holds A's key"
    );
    assert!(a.is_valid(), "A's lock is still valid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acks_a_cluster_failover_hands_the_lock_out_twice() {
    let s = Setup::start();
    let (master, replica) = s.shard();
    s.node3_busy();
    let a = s.connected(false).await;
    stop_replica(&master, &replica);
    let a = a
        .mutex(RESOURCE)
        .try_acquire(TTL)
        .await
        .expect("A takes the lock on nodes 1 and 2");
    // The master dies before the replica runs again: A's write never left.
    master.kill();
    replica.resume();
    s.fail_over(&master, &replica);
    assert_eq!(
        read(&replica, a.key()),
        None,
        "the promoted replica never got A's key"
    );
    s.node3_free();
    let b = s.handle(false);
    let end = Instant::now() + Duration::from_secs(20);
    let b: Lock = loop {
        match b.mutex(RESOURCE).try_acquire(TTL).await {
            Ok(lock) => break lock,
            Err(e) => assert!(Instant::now() < end, "B never took the lock: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(read(&replica, b.key()).as_deref(), Some(b.token()));
    assert_eq!(
        s.clusters[1].get(a.key().as_bytes()).as_deref(),
        Some(a.token().as_bytes())
    );
    assert!(
        a.is_valid() && b.is_valid(),
        "two holders of one lock at once: A ({:?} left) and B ({:?} left)",
        a.remaining(),
        b.remaining()
    );
    println!(
        "negative control ({}): A and B both hold {:?} after the cluster failover \
         (A {:?} left, B {:?} left)",
        redlock_tests::servers::server_version(&redlock_tests::redis_server_binary()),
        a.key(),
        a.remaining(),
        b.remaining()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_write_a_stopped_replica_missed_does_not_count() {
    let s = Setup::start();
    let (master, replica) = s.shard();
    s.node3_busy();
    let a = s.connected(true).await;
    replica.pause();
    let a = a.mutex(RESOURCE).try_acquire(TTL).await;
    replica.resume();
    let Some(report) = a.as_ref().err().and_then(Error::report) else {
        panic!("A must not get the lock with node 1's write unacked: {a:?}");
    };
    let error = report
        .errors()
        .find(|(n, _)| n.index == 0)
        .map(|(_, e)| e.clone());
    let Some(NodeError::ReplicaAcks {
        acked: 0,
        wanted: 1,
        master: Some(at),
        ..
    }) = &error
    else {
        panic!("node 1 must fail for its replica acks: {error:?}");
    };
    let want = format!("127.0.0.1:{}, slot {}", master.port(), s.slot);
    assert_eq!(at, &want);
    let shown = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(shown.contains(&want), "{shown}");
    println!("node 1's error: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_failover_between_the_write_and_its_wait_does_not_count() {
    // The call is held between its write and its marker while the shard
    // fails over: its node timeout covers that, and the TTL the timeout.
    let node_timeout = liveness(FAILOVER_WITHIN);
    let ttl = node_timeout * 3;
    let s = Setup::start();
    let (master, replica) = s.shard();
    s.node3_busy();
    let a = s.handle_timing_out(true, node_timeout);
    let seen = a.inspect("warm-up").await.expect("inspect");
    assert!(
        seen.nodes.iter().all(|n| n.state.is_ok()),
        "a node did not answer: {seen:?}"
    );
    // The replica will miss A's write: stopped, its link cut.
    stop_replica(&master, &replica);
    let pause = redlock_core::hooks::pause_before_marker(&s.key);
    let acquiring = tokio::spawn({
        let a = a.clone();
        async move { a.mutex(RESOURCE).try_acquire(ttl).await }
    });
    within(
        liveness(NODE_TIMEOUT),
        "A's write on node 1 answered",
        pause.reached(),
    )
    .await;
    // A's write is on the master alone. The master dies, the replica that
    // never got the write takes over, and the old master comes back empty
    // as its replica, which will ack the new master's writes.
    tokio::task::block_in_place(|| {
        master.kill();
        replica.resume();
        s.fail_over(&master, &replica);
        let _: () = replica
            .raw(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"])
            .expect("CONFIG SET repl-diskless-sync-delay 0");
        master.restart();
        let port = replica.port().to_string();
        assert!(
            poll_until(liveness(FAILOVER_WITHIN), || {
                info_field(&master, "master_port") == port
                    && info_field(&master, "master_link_status") == "up"
            }),
            "the old master did not become the new one's replica: {}",
            s.clusters[0].describe()
        );
    });
    assert_eq!(
        read(&replica, &s.key),
        None,
        "the promoted replica never got A's write"
    );
    pause.resume();
    drop(pause);
    let first = within(liveness(node_timeout), "A's acquire", acquiring)
        .await
        .expect("A's acquire task");
    let error = match first {
        Ok(lock) => {
            // Node 1 counted a write its new master lacks: B can take it.
            s.node3_free();
            let b = s
                .handle_timing_out(true, node_timeout)
                .mutex(RESOURCE)
                .try_acquire(ttl)
                .await;
            panic!(
                "node 1 counted A's write, lost in the failover, by the new master's acks \
                 (A {:?} left; B, on nodes 1 and 3: {:?})",
                lock.remaining(),
                b.map(|b| b.remaining())
            );
        }
        Err(e) => e,
    };
    let node1 = error
        .report()
        .and_then(|r| r.errors().find(|(n, _)| n.index == 0))
        .map(|(_, e)| e.clone());
    let Some(NodeError::MasterChanged { slot, master: at }) = &node1 else {
        panic!("node 1 must fail because its master changed: {node1:?} ({error})");
    };
    assert_eq!(*slot, s.slot);
    assert_eq!(
        at.as_deref(),
        Some(format!("127.0.0.1:{}", replica.port()).as_str())
    );
    let shown = node1.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        shown.contains(&format!("slot {}", s.slot)) && shown.contains("retried"),
        "{shown}"
    );
    println!("node 1's error: {shown}");
    // The node knows the new master now: A's retry counts on it (once the
    // failed attempt's key on node 2 is released; node 3 is still busy).
    let end = Instant::now() + liveness(node_timeout);
    let lock = loop {
        match a.mutex(RESOURCE).try_acquire(ttl).await {
            Ok(lock) => break lock,
            Err(e) => assert!(Instant::now() < end, "A's retry never counted: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        read(&replica, lock.key()).as_deref(),
        Some(lock.token()),
        "the new master holds A's retried key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_cluster_node_asks_a_slots_master_for_its_replid_once() {
    let cluster = RedisCluster::start(3, 1);
    let handle = Redlock::builder()
        .node(NodeSpec::cluster(cluster.seeds()).replica_acks(1, ACK_TIMEOUT))
        .node_timeout(NODE_TIMEOUT)
        .retry(RetryPolicy::no_retry())
        .wake_on_release(false)
        .build()
        .expect("build the handle");
    let key = handle.key_for(RESOURCE);
    let master = cluster
        .owner(cluster.slot_of(key.as_bytes()))
        .expect("the slot's master");
    let monitor = master.monitor();
    for _ in 0..3 {
        // The last release may still be on its way to one node.
        let end = Instant::now() + liveness(NODE_TIMEOUT);
        let lock = loop {
            match handle.mutex(RESOURCE).try_acquire(TTL).await {
                Ok(lock) => break lock,
                Err(e) => assert!(Instant::now() < end, "no lock: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        handle.unlock(lock).await.expect("unlock");
    }
    let marker = format!("{{{key}}}:redlock-acked");
    let sent = |c: &[String], name: &str, key: &str| {
        c.len() > 1 && c[0].eq_ignore_ascii_case(name) && c[1] == key
    };
    assert!(
        poll_until(liveness(NODE_TIMEOUT), || monitor
            .client_commands()
            .iter()
            .filter(|c| sent(c, "SET", &marker))
            .count()
            == 3),
        "three markers: {:?}",
        monitor.client_commands()
    );
    let commands = monitor.client_commands();
    let fetches: Vec<usize> = (0..commands.len())
        .filter(|&i| sent(&commands[i], "EXISTS", &marker))
        .collect();
    let first_write = commands.iter().position(|c| sent(c, "SET", &key));
    assert_eq!(fetches.len(), 1, "one fetch of the replid: {commands:?}");
    assert!(
        first_write.is_some_and(|w| fetches[0] < w),
        "the fetch comes before the first write: {commands:?}"
    );
}

/// `GET key` on `node`, a replica or a master (`READONLY` first).
fn read(node: &RedisNode, key: &str) -> Option<String> {
    let client = redis::Client::open(node.url()).expect("a client");
    let mut conn = client.get_connection().expect("connect");
    let (_, value): ((), Option<String>) = redis::pipe()
        .cmd("READONLY")
        .cmd("GET")
        .arg(key)
        .query(&mut conn)
        .expect("READONLY, GET");
    value
}

/// Whether node 1 answered in `e`'s report (refused, not failed).
fn answered_by_node1(e: &Error) -> bool {
    e.report()
        .is_some_and(|r| r.errors().all(|(n, _)| n.index != 0))
}

/// The replica stopped (SIGSTOP) and its link cut by the master, which then
/// has no replica to send a write to.
fn stop_replica(master: &RedisNode, replica: &RedisNode) {
    replica.pause();
    let _: i64 = master
        .raw(&["CLIENT", "KILL", "TYPE", "replica"])
        .expect("CLIENT KILL TYPE replica");
    assert!(
        poll_until(Duration::from_secs(5), || info_field(
            master,
            "connected_slaves"
        ) == "0"),
        "the master still has its replica"
    );
}

/// A field of a node's `INFO replication`, empty when absent.
fn info_field(node: &RedisNode, field: &str) -> String {
    let info: String = node.raw(&["INFO", "replication"]).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned()
}
