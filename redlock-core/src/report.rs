//! *Layer 1, values (see `lib.rs`).*
//!
//! Every node's outcome within one operation: what each node answered
//! ([`NodeStatus`]), and the [`Report`] that errors and releases carry.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::node_error::NodeError;

/// What one node answered to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeStatus {
    /// The node did what was asked: set, extended or released the key.
    Ok,
    /// Another holder has the key. `pttl` is its remaining time to live, when the
    /// key has one.
    Busy {
        /// The holder's remaining time to live on this node.
        pttl: Option<Duration>,
    },
    /// The key does not hold this lock's token (it expired, or was deleted).
    NotHeld,
    /// The outcome was decided before this node answered. Its answer is still
    /// handled in the background (a late key is released).
    Pending,
    /// The call failed.
    Failed(NodeError),
}

/// One node's outcome within one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOutcome {
    /// The node's position in the list the [`Redlock`](crate::Redlock) was built from.
    pub index: usize,
    /// The node's label: its address with no password, or `node<i>` for a pool
    /// given without one.
    pub node: Arc<str>,
    /// The time from sending to the answer (zero for [`NodeStatus::Pending`]).
    pub latency: Duration,
    /// What the node answered.
    pub status: NodeStatus,
}

/// Every node's outcome within one operation, in node order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// One entry per node.
    pub nodes: Vec<NodeOutcome>,
}

impl Report {
    /// How many nodes answered [`NodeStatus::Ok`].
    pub fn ok_count(&self) -> usize {
        self.count(|s| matches!(s, NodeStatus::Ok))
    }

    /// How many nodes failed with an error.
    pub fn failed_count(&self) -> usize {
        self.count(|s| matches!(s, NodeStatus::Failed(_)))
    }

    /// The errors, with the node each came from.
    pub fn errors(&self) -> impl Iterator<Item = (&NodeOutcome, &NodeError)> {
        self.nodes.iter().filter_map(|n| match &n.status {
            NodeStatus::Failed(e) => Some((n, e)),
            _ => None,
        })
    }

    /// How many nodes refused a write because they are over `maxmemory`
    /// ([`NodeError::OutOfMemory`]): up, but full.
    pub fn out_of_memory_count(&self) -> usize {
        self.count(|s| matches!(s, NodeStatus::Failed(NodeError::OutOfMemory)))
    }

    /// How many nodes answered with an error reply: up, but refusing
    /// ([`NodeError::is_refusal`]: credentials, a replica, out of memory, …),
    /// as opposed to nodes that did not answer at all.
    pub fn refusal_count(&self) -> usize {
        self.count(|s| matches!(s, NodeStatus::Failed(e) if e.is_refusal()))
    }

    /// How many nodes had not answered when the outcome was decided.
    pub fn pending_count(&self) -> usize {
        self.count(|s| matches!(s, NodeStatus::Pending))
    }

    /// How many nodes answered that another holder has the key.
    pub fn busy_count(&self) -> usize {
        self.count(|s| matches!(s, NodeStatus::Busy { .. }))
    }

    /// The remaining TTLs the busy nodes reported, where known.
    pub fn busy_pttls(&self) -> impl Iterator<Item = Duration> + '_ {
        self.nodes.iter().filter_map(|n| match n.status {
            NodeStatus::Busy { pttl } => pttl,
            _ => None,
        })
    }

    fn count(&self, f: impl Fn(&NodeStatus) -> bool) -> usize {
        self.nodes.iter().filter(|n| f(&n.status)).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: ", n.node)?;
            match &n.status {
                NodeStatus::Ok => f.write_str("ok")?,
                NodeStatus::Busy { pttl: Some(p) } => write!(f, "busy, holder expires in {p:?}")?,
                NodeStatus::Busy { pttl: None } => {
                    f.write_str("busy, holder key TTL unknown or none")?
                }
                NodeStatus::NotHeld => f.write_str("not held")?,
                NodeStatus::Pending => f.write_str("pending")?,
                NodeStatus::Failed(e) => write!(f, "{e}")?,
            }
            if !matches!(n.status, NodeStatus::Pending) {
                write!(f, " ({:?})", n.latency)?;
            }
        }
        Ok(())
    }
}
