//! Which lock a request takes, in every combination a user can build: the
//! kind (mutex, permits, shared reads) with one key or several, and the
//! idempotency layer's lock, through both adapters on real `redis-server`
//! nodes. Each combination holds what its parts promise, or is refused
//! (500, logged) before the handler runs and before any key is written;
//! none is silently taken as another kind.

mod actix;
mod tower;

use redlock_core::Redlock;
use redlock_tests::{Cluster, timing};

/// A handle over `cluster` whose every call gets its answers on a loaded
/// machine (the subject here is the kind, not a slow node).
fn redlock(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// Every key on every node: a refused request writes none.
fn all_keys(cluster: &Cluster) -> Vec<String> {
    cluster.nodes().iter().flat_map(|n| n.keys()).collect()
}
