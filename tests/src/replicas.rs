//! One primary with one replica behind a failover endpoint: what a managed
//! Redis service, or a Sentinel group behind a proxy, gives its clients.
//!
//! - The **endpoint** is a [`FaultProxy`] in front of the primary: the
//!   address the client is given. On failover it moves to the promoted
//!   replica ([`FaultProxy::retarget`]), resetting the connections it had.
//! - The **replication link** goes through a second proxy (the replica is
//!   started with `--replicaof` the link's port), so a test can hold what
//!   the primary streams to the replica ([`ReplicaGroup::stall`]): a write
//!   the primary answered that the replica has not received.
//! - The **failover** ([`ReplicaGroup::failover`]): the link is cut (what it
//!   held is dropped, never delivered), the primary is killed, the replica
//!   is promoted (`REPLICAOF NO ONE`) with what it had received, and the
//!   endpoint moves to it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::RedisNode;
use crate::proxy::{Direction, FaultProxy};
use crate::util::eventually;

/// A primary, its replica, the replication link between them and the
/// endpoint in front. Every process is killed when it is dropped.
pub struct ReplicaGroup {
    primary: Arc<RedisNode>,
    replica: Arc<RedisNode>,
    link: Mutex<Option<FaultProxy>>,
    endpoint: FaultProxy,
}

impl std::fmt::Debug for ReplicaGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaGroup")
            .field("primary", &self.primary.port())
            .field("replica", &self.replica.port())
            .field("endpoint", &self.endpoint.port())
            .finish()
    }
}

/// A field of `INFO replication` on `node` (`None` when it does not answer).
pub fn replication_field(node: &RedisNode, name: &str) -> Option<String> {
    let info: String = node.raw(&["INFO", "replication"]).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

impl ReplicaGroup {
    /// Starts the primary, the replica (of the primary, through the link)
    /// and the endpoint, and waits (at most 20 s) until the replica's link
    /// is up and the primary counts it.
    ///
    /// # Panics
    /// When a server cannot start or the replica does not sync in time.
    pub async fn start() -> Self {
        let primary = Arc::new(RedisNode::start());
        let link = FaultProxy::start(0, primary.port(), None)
            .await
            .expect("start the replication link's proxy");
        let link_port = link.port().to_string();
        let replica = Arc::new(RedisNode::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &link_port,
        ]));
        let endpoint = FaultProxy::start(0, primary.port(), None)
            .await
            .expect("start the endpoint's proxy");
        let synced = eventually(Duration::from_secs(20), || {
            replication_field(&replica, "master_link_status").as_deref() == Some("up")
                && replication_field(&primary, "connected_slaves").as_deref() == Some("1")
        })
        .await;
        assert!(synced, "the replica did not sync with its primary in 20 s");
        Self {
            primary,
            replica,
            link: Mutex::new(Some(link)),
            endpoint,
        }
    }

    /// The address clients are given: `redis://127.0.0.1:<endpoint port>`.
    pub fn url(&self) -> String {
        self.endpoint.url()
    }

    /// The primary.
    pub fn primary(&self) -> &Arc<RedisNode> {
        &self.primary
    }

    /// The replica (the primary after [`ReplicaGroup::failover`]).
    pub fn replica(&self) -> &Arc<RedisNode> {
        &self.replica
    }

    /// The endpoint proxy.
    pub fn endpoint(&self) -> &FaultProxy {
        &self.endpoint
    }

    /// Holds everything the primary streams to the replica from now on:
    /// writes the primary answers stay off the replica, and `WAIT` sees no
    /// replica acknowledge them.
    pub fn stall(&self) {
        if let Some(link) = &*self.link() {
            link.hold(Direction::Reply);
        }
    }

    /// Waits (at most 10 s) until the replica holds `value` at `key`.
    pub async fn replica_has(&self, key: &str, value: &str) -> bool {
        eventually(Duration::from_secs(10), || {
            self.replica.get(key).as_deref() == Some(value)
        })
        .await
    }

    /// The failover: the link is cut (what it held is dropped), the primary
    /// killed, the replica promoted with what it had received, and the
    /// endpoint moved to it. Waits (at most 10 s) for the promotion.
    ///
    /// # Panics
    /// When the replica is not promoted in time.
    pub async fn failover(&self) {
        if let Some(link) = self.link().take() {
            // Held bytes are dropped by the blackhole, never delivered.
            link.blackhole();
            link.reset();
        }
        self.primary.kill();
        self.replica.cmd(&["REPLICAOF", "NO", "ONE"]);
        let promoted = eventually(Duration::from_secs(10), || {
            replication_field(&self.replica, "role").as_deref() == Some("master")
        })
        .await;
        assert!(promoted, "the replica was not promoted in 10 s");
        self.endpoint.retarget(self.replica.port());
    }

    fn link(&self) -> std::sync::MutexGuard<'_, Option<FaultProxy>> {
        self.link.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
