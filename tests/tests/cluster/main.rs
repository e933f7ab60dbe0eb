//! Redlock nodes that are Redis Clusters (three masters each, started by the
//! harness on loopback ports): the lock's steps on cluster nodes, alone and
//! mixed with single servers, and the key layout that keeps every key of one
//! resource in one slot.

mod basic;
mod batches;
mod faults;
mod isolation;
mod layout;
mod replicas;
mod reshard;
mod wake;

use std::time::Duration;

use redlock_core::Redlock;
use redlock_tests::RedisClusters;

/// A handle over every cluster of `clusters`, one node each, with a node
/// timeout long enough for a loaded machine.
pub fn handle(clusters: &RedisClusters) -> Redlock {
    clusters
        .clusters()
        .iter()
        .fold(Redlock::builder(), |b, c| b.cluster(c.seeds()))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}
