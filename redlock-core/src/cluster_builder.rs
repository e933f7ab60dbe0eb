//! The builder's Redis Cluster nodes: by seed URLs or a deadpool-redis
//! cluster pool (the node itself is `node/cluster.rs`).

use crate::builder::RedlockBuilder;
use crate::sources::NodeSource;

impl RedlockBuilder {
    /// Adds a node that is a Redis Cluster (Redis 7, Valkey), given by seed
    /// URLs of its members (one is enough; the masters and their slots are
    /// found from the first that answers). The cluster is one Redlock node:
    /// a lock counts on it when its keys were set there, on whichever
    /// masters serve their slots, and the quorum is still over the
    /// independent nodes, single servers and clusters alike. A cluster's own
    /// failover (a replica promoted before it had the key) can lose a key,
    /// as a single server's restart without persistence can.
    ///
    /// Labelled `cluster:<first seed's host:port>`.
    pub fn cluster<I, S>(mut self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sources.push(NodeSource::Seeds(
            seeds.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Adds a node that is the Redis Cluster behind a deadpool-redis cluster
    /// pool, labelled `label` in errors, reports and metrics (see
    /// [`RedlockBuilder::cluster`]).
    pub fn cluster_pool(
        mut self,
        label: impl Into<String>,
        pool: deadpool_redis::cluster::Pool,
    ) -> Self {
        self.sources.push(NodeSource::ClusterPool {
            label: Some(label.into()),
            pool,
        });
        self
    }
}
