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
    ///
    /// Its waiters poll: a pool does not tell where its cluster is or with
    /// which credentials (its manager keeps its client private), so the
    /// node cannot subscribe to releases. Give the pool's
    /// [`Config`](deadpool_redis::cluster::Config) to
    /// [`RedlockBuilder::cluster_config`] instead to have them woken.
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

    /// Adds a node that is the Redis Cluster a deadpool-redis cluster
    /// `config` describes, labelled `label`: the node's pool is made from
    /// it at build (an [`Error::InvalidUrl`](crate::Error::InvalidUrl)
    /// there, with no password, if it cannot be), and its URLs or
    /// connection infos are the seeds its waiters subscribe through
    /// (`SSUBSCRIBE` on each key's master), so that they are woken by a
    /// release as on a node given by [`RedlockBuilder::cluster`].
    ///
    /// ```no_run
    /// use redlock_core::Redlock;
    /// use redlock_core::deadpool_redis::cluster::Config;
    ///
    /// # fn main() -> Result<(), redlock_core::Error> {
    /// let config = |port: u16| Config::from_urls(vec![format!("redis://10.0.0.1:{port}")]);
    /// let redlock = Redlock::builder()
    ///     .cluster_config("east", config(7000))
    ///     .cluster_config("west", config(7100))
    ///     .cluster_config("north", config(7200))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster_config(
        mut self,
        label: impl Into<String>,
        config: deadpool_redis::cluster::Config,
    ) -> Self {
        self.sources.push(NodeSource::ClusterConfig {
            label: label.into(),
            config: Box::new(config),
        });
        self
    }
}
