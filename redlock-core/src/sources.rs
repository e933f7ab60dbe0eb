//! *Layer 2, one master (see `lib.rs`).*
//!
//! The nodes a [`RedlockBuilder`](crate::RedlockBuilder) was given, and their
//! checks at build: each opened into a [`Node`], no address listed twice.

use std::sync::Arc;

use deadpool_redis::Pool;

use crate::error::Error;
use crate::node::Node;
use crate::url::redact_url;

/// One node as the builder was given it.
pub(crate) enum NodeSource {
    /// A pool, with its label if it was given one.
    Pool { label: Option<String>, pool: Pool },
    /// A URL, opened at build.
    Url(String),
    /// A node with its replica acks set by a
    /// [`NodeSpec`](crate::NodeSpec) (`None`: off, whatever its URL says).
    Acked {
        source: Box<NodeSource>,
        acks: Option<crate::ReplicaAcks>,
    },
    /// A Redis Cluster by its seed URLs.
    Seeds(Vec<String>),
    /// A Redis Cluster by a deadpool-redis cluster config (its pool made at
    /// build, its seeds kept for wake-ups).
    ClusterConfig {
        label: String,
        config: Box<deadpool_redis::cluster::Config>,
    },
    /// A Redis Cluster by a deadpool-redis cluster pool.
    ClusterPool {
        label: Option<String>,
        pool: deadpool_redis::cluster::Pool,
    },
}

impl NodeSource {
    /// How the builder's `Debug` shows the node: its label (`<pool>` for a pool
    /// given without one), or its URL with no password.
    pub(crate) fn shown(&self) -> String {
        match self {
            NodeSource::Pool { label, .. } => label.clone().unwrap_or_else(|| "<pool>".into()),
            NodeSource::Url(u) => redact_url(u),
            NodeSource::Acked { source, .. } => source.shown(),
            NodeSource::Seeds(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|s| redact_url(s)).collect();
                format!("cluster[{}]", seeds.join(", "))
            }
            NodeSource::ClusterPool { label, .. } => {
                label.clone().unwrap_or_else(|| "<cluster pool>".into())
            }
            NodeSource::ClusterConfig { label, .. } => label.clone(),
        }
    }

    /// The node, the `i`-th given. A pool given without a label is labelled
    /// `node<i>`, and has no address to compare with the others.
    fn open(self, i: usize) -> Result<Node, Error> {
        Ok(match self {
            NodeSource::Pool { label, pool } => {
                let address = label.clone();
                let label: Arc<str> = label.unwrap_or_else(|| format!("node{i}")).into();
                Node::new(label, address, pool)
            }
            NodeSource::Url(url) => Node::from_url(&url)?,
            NodeSource::Acked { source, acks } => {
                let mut node = source.open(i)?;
                node.replica_acks = acks;
                node
            }
            NodeSource::Seeds(seeds) => Node::from_seeds(&seeds)?,
            NodeSource::ClusterPool { label, pool } => {
                let address = label.clone();
                let label: Arc<str> = label.unwrap_or_else(|| format!("cluster{i}")).into();
                Node::from_cluster_pool(label, address, pool)
            }
            NodeSource::ClusterConfig { label, config } => {
                Node::from_cluster_config(label.into(), &config)?
            }
        })
    }
}

/// Opens every node in the order given, refusing an address listed twice.
///
/// # Errors
/// [`Error::InvalidUrl`] or [`Error::DuplicateNode`] (by address).
pub(crate) fn open_nodes(sources: Vec<NodeSource>) -> Result<Vec<Node>, Error> {
    let mut nodes: Vec<Node> = Vec::with_capacity(sources.len());
    for (i, source) in sources.into_iter().enumerate() {
        let node = source.open(i)?;
        if let Some(addr) = &node.address
            && let Some(first) = nodes.iter().find(|n| n.address.as_ref() == Some(addr))
        {
            return Err(Error::DuplicateNode {
                first: first.label.clone(),
                second: node.label.clone(),
                by: "address",
            });
        }
        nodes.push(node);
    }
    Ok(nodes)
}
