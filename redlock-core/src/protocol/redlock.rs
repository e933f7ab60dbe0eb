//! The handle's state, at the base of the protocol layer: N independent
//! masters, the quorum, the settings, and the input and node checks. Each
//! Redlock step lives in a file of its own above it (`steps`, `fan_out`,
//! `acquire`, `extend`, `release`, `stragglers`), as methods of [`Core`]. The
//! public handle (`crate::redlock`) sits above the holding layer and adds its
//! renewal schedule, so no state here names a layer above.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::error::{Error, NodeError};
use crate::eviction::{EvictionCheck, check_eviction};
use crate::fencing::{FencingCheck, check_persistence};
use crate::node::Node;
use crate::protocol::steps::{quorum, whole_millis};
use crate::settings::{RetryPolicy, Settings};
use crate::wake::Waiting;

pub(crate) struct Inner {
    pub(crate) nodes: Vec<Node>,
    pub(crate) quorum: usize,
    pub(crate) settings: Settings,
    pub(crate) waiting: Waiting,
    /// The task that drives calls still on their way after their operation
    /// was decided.
    pub(crate) background: crate::background::Background,
}

impl Inner {
    pub(crate) fn new(mut nodes: Vec<Node>, settings: Settings) -> Self {
        for node in &mut nodes {
            node.native = settings.native_commands;
            node.coalesce = settings.coalesce;
        }
        Self {
            quorum: quorum(nodes.len()),
            waiting: Waiting::new(&nodes, &settings),
            nodes,
            settings,
            background: crate::background::Background::default(),
        }
    }
}

/// The handle's protocol state behind one `Arc`: what every Redlock step
/// runs on. The public handle ([`Redlock`](crate::Redlock), `redlock.rs`)
/// wraps it with the holding layer's renewal schedule; a [`Lock`](crate::Lock)
/// keeps only this, so its release and extend need nothing above this layer.
#[derive(Clone)]
pub(crate) struct Core {
    pub(crate) inner: Arc<Inner>,
}

/// What [`Redlock::check_nodes`](crate::Redlock::check_nodes) learned about one node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The node's label.
    pub node: Arc<str>,
    /// The server's `run_id`, unique per server process.
    pub run_id: Option<String>,
    /// The server's `redis_version`.
    pub version: Option<String>,
    /// The error, if the node did not answer.
    pub error: Option<NodeError>,
    /// Whether the append-only file is on (`aof_enabled` in `INFO persistence`).
    pub aof_enabled: Option<bool>,
    /// The `appendfsync` policy (`always`, `everysec`, `no`), when `CONFIG GET`
    /// is allowed.
    pub appendfsync: Option<String>,
    /// With [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing): whether
    /// the mode keeps tokens monotone on this node. `None` without fencing.
    pub fencing: Option<FencingCheck>,
    /// The `maxmemory` limit in bytes (`0`: none), from `INFO memory`, else
    /// `CONFIG GET maxmemory`.
    pub maxmemory: Option<u64>,
    /// The `maxmemory-policy` (`noeviction`, `allkeys-lru`, …), from `INFO
    /// memory`, else `CONFIG GET maxmemory-policy`.
    pub maxmemory_policy: Option<String>,
    /// Whether the node can evict lock keys or fencing counters. `None` when
    /// the node did not answer.
    pub eviction: Option<EvictionCheck>,
    /// `master` or `slave` (`role` in `INFO replication`). Redlock needs
    /// independent masters: a replica refuses writes, and a master with
    /// replicas can lose a lock on failover.
    pub role: Option<String>,
    /// How many replicas are attached to this master (`connected_slaves`).
    pub connected_replicas: Option<u64>,
    /// The replicas each acquire and extend write must reach on this node
    /// (its [`NodeSpec::replica_acks`](crate::NodeSpec::replica_acks) or URL
    /// `replica_acks`); `None`: the node is taken to be an independent master.
    pub replica_acks: Option<crate::ReplicaAcks>,
    /// The native compare-and-delete and compare-and-set commands found on
    /// the node's current connection (`COMMAND INFO` / `COMMAND DOCS`, asked
    /// in the background once it is open); `None` with
    /// [`NativeCommands::Off`](crate::NativeCommands::Off), when the node did
    /// not answer, or while the answer is not in yet.
    pub native: Option<crate::NativeSupport>,
}

impl Core {
    pub(crate) fn from_inner(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// How many nodes this handle talks to.
    pub(crate) fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree: `N / 2 + 1`.
    pub(crate) fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The per-node timeout.
    pub(crate) fn node_timeout(&self) -> Duration {
        self.inner.settings.node_timeout
    }

    /// The default loss margin of a [`LockGuard`](crate::LockGuard): how long
    /// before the end of its validity the holder is told the lock is lost.
    pub(crate) fn loss_margin(&self) -> Duration {
        self.inner
            .settings
            .loss_margin
            .unwrap_or(self.inner.settings.node_timeout)
    }

    /// The smallest TTL this handle accepts.
    pub(crate) fn min_ttl(&self) -> Duration {
        self.inner.settings.min_ttl
    }

    /// The default retry policy of [`crate::Primitive::acquire`].
    pub(crate) fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.settings.retry
    }

    /// The Redis key used for `resource`: the key prefix, then the
    /// resource, when neither holds `{`, `}` or `%`; else `{` and both with
    /// those three `%`-escaped, then `}`. Every other key of the resource
    /// (waiters flag, fencing counter, idempotency record) hashes to the
    /// same Redis Cluster slot as this one, whatever the resource holds.
    pub(crate) fn key_for(&self, resource: &str) -> String {
        crate::slots::lock_key(&self.inner.settings.key_prefix, resource)
    }

    /// Connects to every node, reads `INFO server`, and refuses the same server
    /// listed twice (same `run_id`). Nodes that do not answer are reported, not
    /// refused: Redlock is built to run with a minority down.
    ///
    /// Also reads each node's persistence (`INFO persistence`, `CONFIG GET
    /// appendfsync`) and, with fencing on, judges whether the
    /// [`FencingMode`](crate::FencingMode) is sound there ([`NodeInfo::fencing`]);
    /// and its eviction policy (`INFO memory`, else `CONFIG GET`), judging
    /// whether it can evict lock keys or fencing counters
    /// ([`NodeInfo::eviction`]: only `noeviction` is sound). A node where
    /// either is unsound is logged at warn level.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`] with `by: "run_id"`.
    pub(crate) async fn check_nodes(&self) -> Result<Vec<NodeInfo>, Error> {
        let cmd = {
            let mut c = redis::cmd("INFO");
            c.arg("server");
            c
        };
        let timeout = self
            .inner
            .settings
            .node_timeout
            .max(Duration::from_millis(500));
        let infos: Vec<NodeInfo> =
            futures_util::future::join_all(self.inner.nodes.iter().map(|node| {
                let cmd = &cmd;
                async move {
                    let mut info = NodeInfo {
                        node: node.label.clone(),
                        run_id: None,
                        version: None,
                        error: None,
                        aof_enabled: None,
                        appendfsync: None,
                        fencing: None,
                        maxmemory: None,
                        maxmemory_policy: None,
                        eviction: None,
                        role: None,
                        connected_replicas: None,
                        replica_acks: node.replica_acks,
                        native: None,
                    };
                    match node.query(cmd, timeout).await {
                        Ok(v) => {
                            let text = match v {
                                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                                Value::VerbatimString { text, .. } => text,
                                other => format!("{other:?}"),
                            };
                            let field = |name: &str| {
                                text.lines()
                                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                                    .map(|v| v.trim().to_owned())
                            };
                            info.run_id = field("run_id");
                            info.version = field("redis_version");
                        }
                        Err(e) => info.error = Some(e),
                    }
                    if info.error.is_none() {
                        self.read_persistence(node, timeout, &mut info).await;
                        self.read_eviction(node, timeout, &mut info).await;
                        read_role(node, timeout, &mut info).await;
                        info.native = node.current_native_support();
                    }
                    info
                }
            }))
            .await;
        for (i, a) in infos.iter().enumerate() {
            if let Some(b) = infos[..i]
                .iter()
                .find(|b| b.run_id.is_some() && b.run_id == a.run_id)
            {
                return Err(Error::DuplicateNode {
                    first: b.node.clone(),
                    second: a.node.clone(),
                    by: "run_id",
                });
            }
        }
        Ok(infos)
    }

    /// Fills `info`'s persistence fields from `node`, and judges the fencing
    /// mode on it. A refused `CONFIG` (managed services often rename it) leaves
    /// `appendfsync` unknown.
    async fn read_persistence(&self, node: &Node, timeout: Duration, info: &mut NodeInfo) {
        let mut persistence = redis::cmd("INFO");
        persistence.arg("persistence");
        let mut fsync = redis::cmd("CONFIG");
        fsync.arg("GET").arg("appendfsync");
        let (persistence, fsync) = futures_util::future::join(
            node.query(&persistence, timeout),
            node.query(&fsync, timeout),
        )
        .await;
        if let Ok(v) = persistence {
            info.aof_enabled = info_field(&reply_text(v), "aof_enabled").map(|v| v == "1");
        }
        if let Ok(v) = fsync {
            info.appendfsync = config_value(v);
        }
        let Some(mode) = self.inner.settings.fencing else {
            return;
        };
        let check = check_persistence(mode, info.aof_enabled, info.appendfsync.as_deref());
        if !matches!(check, FencingCheck::Durable) {
            tracing::warn!(node = %node.label, ?mode, check = ?check, "fencing tokens are not backed by durable counters on this node");
        }
        info.fencing = Some(check);
    }

    /// Fills `info`'s memory fields from `node` (`INFO memory`, which ACLs
    /// deny less often than `CONFIG`; `CONFIG GET` for what it lacks), and
    /// judges whether the node can evict the keys the locks rely on. A node
    /// where it can, or where it is unknown, is logged at warn level.
    async fn read_eviction(&self, node: &Node, timeout: Duration, info: &mut NodeInfo) {
        let mut memory = redis::cmd("INFO");
        memory.arg("memory");
        if let Ok(v) = node.query(&memory, timeout).await {
            let text = reply_text(v);
            info.maxmemory = info_field(&text, "maxmemory").and_then(|v| v.parse().ok());
            info.maxmemory_policy = info_field(&text, "maxmemory_policy");
        }
        if info.maxmemory_policy.is_none() {
            let mut get = redis::cmd("CONFIG");
            get.arg("GET").arg("maxmemory-policy");
            info.maxmemory_policy = node.query(&get, timeout).await.ok().and_then(config_value);
        }
        if info.maxmemory.is_none() {
            let mut get = redis::cmd("CONFIG");
            get.arg("GET").arg("maxmemory");
            info.maxmemory = node
                .query(&get, timeout)
                .await
                .ok()
                .and_then(config_value)
                .and_then(|v| v.parse().ok());
        }
        let check = check_eviction(
            info.maxmemory_policy.as_deref(),
            info.maxmemory,
            self.inner.settings.fencing,
        );
        match &check {
            EvictionCheck::Sound { .. } => {}
            EvictionCheck::Unsound { reason } => {
                tracing::warn!(node = %node.label, %reason, "this node can evict lock keys: mutual exclusion is not guaranteed");
            }
            EvictionCheck::Unknown { reason } => {
                tracing::warn!(node = %node.label, %reason, "cannot tell whether this node evicts lock keys");
            }
        }
        info.eviction = Some(check);
    }

    /// A resource this handle may lock: not empty, and its key not a
    /// waiters flag's ([`crate::keys::WAITERS_SUFFIX`]).
    pub(crate) fn check_resource(&self, resource: &str) -> Result<(), Error> {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        if crate::keys::is_reserved(&self.inner.settings.key_prefix, resource) {
            return Err(Error::ReservedResource {
                resource: resource.into(),
            });
        }
        Ok(())
    }

    /// Spec input checks: the TTL is in bounds and longer than the node timeout.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<(), Error> {
        let s = &self.inner.settings;
        // Under 1 ms the keys would get `PX 0` / `PEXPIRE 0`, which deletes them.
        if whole_millis(ttl).is_zero() || ttl < s.min_ttl || ttl > s.max_ttl {
            return Err(Error::InvalidTtl {
                ttl,
                min: s.min_ttl,
                max: s.max_ttl,
            });
        }
        if s.node_timeout >= ttl {
            return Err(Error::NodeTimeoutTooLong {
                node_timeout: s.node_timeout,
                ttl,
            });
        }
        Ok(())
    }
}

/// The text of an `INFO` reply.
fn reply_text(v: Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        other => format!("{other:?}"),
    }
}

/// One `name:value` field of an `INFO` reply.
fn info_field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// The value of a one-parameter `CONFIG GET` reply (a pair in RESP2, a map in
/// RESP3); `None` when the parameter is unknown or the reply is empty.
fn config_value(v: Value) -> Option<String> {
    let value = match v {
        Value::Array(items) => items.into_iter().nth(1)?,
        Value::Map(pairs) => pairs.into_iter().next()?.1,
        _ => return None,
    };
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Fills `info`'s role and replica count from `INFO replication`.
async fn read_role(node: &Node, timeout: Duration, info: &mut NodeInfo) {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    if let Ok(v) = node.query(&cmd, timeout).await {
        let text = reply_text(v);
        info.role = info_field(&text, "role");
        info.connected_replicas =
            info_field(&text, "connected_slaves").and_then(|n| n.parse().ok());
        if info.role.as_deref() != Some("master") {
            tracing::warn!(node = %node.label, role = ?info.role, "a Redlock node must be an independent master");
        }
    }
}

/// The metrics hooks' view of the settings.
impl Core {
    /// The opt-in `key` label for `key` (a Redis key), if the application
    /// asked for one.
    pub(crate) fn metrics_key(&self, key: &str) -> Option<&'static str> {
        self.inner.settings.metrics_key.as_ref().map(|f| (f.0)(key))
    }

    /// Whether the application asked for the `key` label (so a key is worth
    /// building for it).
    pub(crate) fn has_metrics_key(&self) -> bool {
        self.inner.settings.metrics_key.is_some()
    }
}
