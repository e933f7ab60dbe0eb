//! One node with options of its own ([`NodeSpec`]), for
//! [`RedlockBuilder::node`](crate::RedlockBuilder::node).

use std::time::Duration;

use deadpool_redis::Pool;

use crate::node::ReplicaAcks;
use crate::sources::NodeSource;

/// One node and its own options: a URL or a pool, and with
/// [`replica_acks`](Self::replica_acks) the replicas each write must reach.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::{NodeSpec, Redlock};
///
/// # fn main() -> Result<(), redlock_core::Error> {
/// let redlock = Redlock::builder()
///     // A managed primary with one replica behind a failover endpoint.
///     .node(NodeSpec::url("redis://primary.example:6379").replica_acks(1, Duration::from_millis(20)))
///     .url("redis://10.0.0.2:6379")
///     .url("redis://10.0.0.3:6379")
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct NodeSpec {
    source: NodeSource,
    /// `None`: as the URL says (off for a pool); `Some`: set here.
    acks: Option<Option<ReplicaAcks>>,
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSpec")
            .field("node", &self.source.shown())
            .field("replica_acks", &self.acks)
            .finish()
    }
}

impl NodeSpec {
    /// A node by URL, as [`RedlockBuilder::url`](crate::RedlockBuilder::url)
    /// takes it (its `replica_acks` query parameters included).
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            source: NodeSource::Url(url.into()),
            acks: None,
        }
    }

    /// A node given as a pool, as
    /// [`RedlockBuilder::pool`](crate::RedlockBuilder::pool) takes it.
    pub fn pool(pool: Pool) -> Self {
        Self {
            source: NodeSource::Pool { label: None, pool },
            acks: None,
        }
    }

    /// A labelled pool, as
    /// [`RedlockBuilder::labeled_pool`](crate::RedlockBuilder::labeled_pool)
    /// takes it.
    pub fn labeled_pool(label: impl Into<String>, pool: Pool) -> Self {
        Self {
            source: NodeSource::Pool {
                label: Some(label.into()),
                pool,
            },
            acks: None,
        }
    }

    /// A node that is a Redis Cluster, by seed URLs of its members, as
    /// [`RedlockBuilder::cluster`](crate::RedlockBuilder::cluster) takes it.
    /// With [`replica_acks`](Self::replica_acks), each write waits for its
    /// replicas on the master of every slot it wrote.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{NodeSpec, Redlock};
    ///
    /// # fn main() -> Result<(), redlock_core::Error> {
    /// let cluster = |port: u16| NodeSpec::cluster([format!("redis://10.0.0.1:{port}")]);
    /// let redlock = Redlock::builder()
    ///     .node(cluster(7000).replica_acks(1, Duration::from_millis(50)))
    ///     .node(cluster(7100).replica_acks(1, Duration::from_millis(50)))
    ///     .node(cluster(7200).replica_acks(1, Duration::from_millis(50)))
    ///     // The ack wait must fit three quarters of the node timeout.
    ///     .node_timeout(Duration::from_millis(100))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I, S>(seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            source: NodeSource::Seeds(seeds.into_iter().map(Into::into).collect()),
            acks: None,
        }
    }

    /// A Redis Cluster behind a deadpool-redis cluster pool, labelled
    /// `label`, as
    /// [`RedlockBuilder::cluster_pool`](crate::RedlockBuilder::cluster_pool)
    /// takes it.
    pub fn cluster_pool(label: impl Into<String>, pool: deadpool_redis::cluster::Pool) -> Self {
        Self {
            source: NodeSource::ClusterPool {
                label: Some(label.into()),
                pool,
            },
            acks: None,
        }
    }

    /// A Redis Cluster by a deadpool-redis cluster config, labelled
    /// `label`, as
    /// [`RedlockBuilder::cluster_config`](crate::RedlockBuilder::cluster_config)
    /// takes it.
    pub fn cluster_config(
        label: impl Into<String>,
        config: deadpool_redis::cluster::Config,
    ) -> Self {
        Self {
            source: NodeSource::ClusterConfig {
                label: label.into(),
                config: Box::new(config),
            },
            acks: None,
        }
    }

    /// Counts the node for an acquire or an extend only when its write
    /// reached `replicas` replicas within `timeout` (see [`ReplicaAcks`]);
    /// `0` turns replica acks off. Overrides a URL's `replica_acks`. A
    /// `timeout` above three quarters of the handle's node timeout is
    /// refused by `build()` ([`Error::InvalidConfig`](crate::Error::InvalidConfig)).
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acks = Some((replicas > 0).then(|| ReplicaAcks::new(replicas, timeout)));
        self
    }

    /// Counts the node for an acquire or an extend only when `WAITAOF`
    /// saw the write fsynced to this master's AOF (`local`) and to the AOFs
    /// of `replicas` replicas within `timeout` (see [`ReplicaAcks::aof`];
    /// Redis 7.2 or Valkey 8 and `appendonly yes`). Overrides a URL's
    /// `replica_acks` and `waitaof`.
    pub fn aof_acks(mut self, local: bool, replicas: u32, timeout: Duration) -> Self {
        self.acks = Some(Some(ReplicaAcks::aof(local, replicas, timeout)));
        self
    }

    /// The node as the builder keeps it.
    pub(crate) fn into_source(self) -> NodeSource {
        match self.acks {
            None => self.source,
            Some(acks) => NodeSource::Acked {
                source: Box::new(self.source),
                acks,
            },
        }
    }
}
