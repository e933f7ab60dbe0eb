//! A node that is a Redis Cluster: where its connection comes from (seed URLs
//! or a deadpool-redis cluster pool) and the one connection type every step
//! sends on, a single server's or a cluster's.
//!
//! A cluster node is one Redlock node: its masters share the node's part of
//! the quorum, each key going to the master serving its slot, and every key
//! of one resource is in one slot (`slots.rs`), so each script runs on one
//! shard. redis' cluster connection follows a `MOVED` or `ASK` (a slot that
//! moved, or is moving, to another master) by itself, refreshing its slot
//! map, and retries `TRYAGAIN`: within the node timeout, which bounds every
//! call as on a single server, the call then succeeds on the new owner;
//! past it, the call is a node error (`Timeout`) for that one call.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisResult, Value};

use super::Node;
use super::from_url::{invalid_url, pool_from_info};
use crate::error::{Error, NodeError};
use crate::url::redact_url;

/// How many times redis' cluster connection follows a redirect or retries a
/// failed request before it gives the call an error; the node timeout cuts
/// the retries short in any case.
const CLUSTER_RETRIES: u32 = 6;

/// Where a node's connection comes from.
#[derive(Clone)]
pub(crate) enum NodePool {
    /// One server, through a deadpool-redis pool.
    Single(deadpool_redis::Pool),
    /// A cluster given by its seed URLs.
    Seeds(Box<ClusterClient>),
    /// A cluster given as a deadpool-redis cluster pool.
    Cluster(deadpool_redis::cluster::Pool),
}

/// A connection to a node: one server's multiplexed connection, or a
/// cluster's (which multiplexes over one connection per master).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Sends one command and reads its reply.
    pub(crate) async fn send_packed_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => c.send_packed_command(cmd).await,
            Conn::Cluster(c) => redis::aio::ConnectionLike::req_packed_command(c, cmd).await,
        }
    }

    /// Sends a pipeline and reads `count` replies from `offset`. On a
    /// cluster, every keyed command of the pipeline must be of one slot.
    pub(crate) async fn send_packed_commands(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => c.send_packed_commands(pipeline, offset, count).await,
            Conn::Cluster(c) => {
                redis::aio::ConnectionLike::req_packed_commands(c, pipeline, offset, count).await
            }
        }
    }
}

impl NodePool {
    /// A new connection (a cluster's discovers the masters and their slots
    /// from the first seed that answers).
    pub(super) async fn connect(&self) -> Result<Conn, NodeError> {
        let refused = |e: redis::RedisError| match NodeError::from_redis(&e) {
            NodeError::Io(m) | NodeError::Protocol(m) => NodeError::Connect(m),
            other => other,
        };
        match self {
            NodePool::Single(pool) => {
                let conn = pool.get().await.map_err(|e| match e {
                    deadpool_redis::PoolError::Backend(err) => refused(err),
                    other => NodeError::Connect(other.to_string()),
                })?;
                Ok(Conn::Single(deadpool_redis::Connection::take(conn)))
            }
            NodePool::Seeds(client) => client
                .get_async_connection()
                .await
                .map(Conn::Cluster)
                .map_err(refused),
            NodePool::Cluster(pool) => {
                let conn = pool.get().await.map_err(|e| match e {
                    deadpool_redis::cluster::PoolError::Backend(err) => refused(err),
                    other => NodeError::Connect(other.to_string()),
                })?;
                Ok(Conn::Cluster(deadpool_redis::cluster::Connection::take(
                    conn,
                )))
            }
        }
    }
}

/// A plain command's reply as one member gave it: redis' cluster
/// connection sends a keyless command such as `INFO` to every member and
/// answers a map of member to reply, of which the first is taken (a
/// single server's reply is left as it is).
pub(super) fn one_members_reply(reply: Value) -> Value {
    match reply {
        Value::Map(members) => members
            .into_iter()
            .next()
            .map_or(Value::Nil, |(_, reply)| reply),
        other => other,
    }
}

impl NodePool {
    /// Whether the node is a cluster.
    pub(super) fn is_cluster(&self) -> bool {
        !matches!(self, NodePool::Single(_))
    }
}

impl Node {
    /// A node that is the Redis Cluster reached through `seeds` (any of its
    /// members; the masters are found from them). Labelled and compared by
    /// its first seed's address. Replica acks may be given in the seeds'
    /// URLs (`?replica_acks=n`, the same on each).
    pub(crate) fn from_seeds(seeds: &[String]) -> Result<Node, Error> {
        let first = seeds.first().ok_or(Error::NoNodes)?;
        let mut infos = Vec::with_capacity(seeds.len());
        let mut acks = None;
        for (i, url) in seeds.iter().enumerate() {
            // `?replica_acks=n` on the seeds: the same on every one.
            let (url, seed_acks) = super::split_url(url)?;
            if i == 0 {
                acks = seed_acks;
            } else if seed_acks != acks {
                return Err(invalid_url(
                    &url,
                    "the seeds of one cluster disagree on replica_acks".into(),
                ));
            }
            let url = &url;
            if url.starts_with("rediss://") {
                return Err(invalid_url(
                    url,
                    "a cluster node over TLS is not supported yet".into(),
                ));
            }
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| invalid_url(url, e.to_string()))?;
            // Checks the URL as a single node's would be, for its address.
            let (_, address, _) = pool_from_info(url, info.clone())?;
            infos.push((address, info));
        }
        let address = infos
            .first()
            .map(|(a, _)| a.clone())
            .unwrap_or_else(|| redact_url(first));
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let infos: Vec<_> = infos.into_iter().map(|(_, info)| info).collect();
        let client = redis::cluster::ClusterClientBuilder::new(infos.clone())
            .tcp_settings(tcp)
            .retries(CLUSTER_RETRIES)
            // Every call is bounded by the node timeout; these only keep a
            // connection attempt of the client's own from hanging forever.
            .connection_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| invalid_url(first, e.to_string()))?;
        let label = format!("cluster:{address}");
        let mut node = Node::with_pool(
            label.into(),
            Some(address),
            NodePool::Seeds(Box::new(client)),
        );
        node.pubsub = Some(super::PubSubAt::Cluster(infos));
        node.replica_acks = acks;
        Ok(node)
    }

    /// A node that is the Redis Cluster a deadpool-redis cluster `config`
    /// describes: its pool, made here, and its seeds (the config's URLs or
    /// connection infos, credentials included) for wake-ups, which a pool
    /// alone does not give (its manager keeps its client private).
    pub(crate) fn from_cluster_config(
        label: std::sync::Arc<str>,
        config: &deadpool_redis::cluster::Config,
    ) -> Result<Node, Error> {
        let urls = config.urls.as_deref().unwrap_or_default();
        // Every message loses the passwords of every URL of the config.
        let invalid = |reason: String| Error::InvalidUrl {
            url: label.to_string(),
            reason: urls
                .iter()
                .fold(reason, |r, u| crate::url::scrub_password(u, r)),
        };
        let infos = match &config.connections {
            Some(infos) => infos
                .iter()
                .cloned()
                .map(redis::ConnectionInfo::from)
                .collect(),
            None => urls
                .iter()
                .map(|u| u.as_str().into_connection_info())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(e.to_string()))?,
        };
        let pool = config
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map_err(|e| invalid(e.to_string()))?;
        let mut node = Node::from_cluster_pool(label.clone(), Some(label.to_string()), pool);
        if !infos.is_empty() {
            node.pubsub = Some(super::PubSubAt::Cluster(infos));
        }
        Ok(node)
    }

    /// A node that is the Redis Cluster behind a deadpool-redis cluster pool.
    pub(crate) fn from_cluster_pool(
        label: std::sync::Arc<str>,
        address: Option<String>,
        pool: deadpool_redis::cluster::Pool,
    ) -> Node {
        Node::with_pool(label, address, NodePool::Cluster(pool))
    }
}
