//! Which lock a request takes, in every combination a user can build: the
//! kind (mutex, permits, shared reads) with one key or several, and the
//! idempotency layer's lock, through both adapters on real `redis-server`
//! nodes. Each combination holds what its parts promise, or is refused
//! (500, logged) before the handler runs and before any key is written;
//! none is silently taken as another kind.

mod actix;
mod actix_matrix;
mod matrix;
mod tower;
mod tower_matrix;
mod web_matrix;

use redlock_core::Redlock;
use redlock_tests::Cluster;

/// A handle over `cluster` whose every call gets its answers on a loaded
/// machine (the subject here is the kind, not a slow node).
fn redlock(cluster: &Cluster) -> Redlock {
    cluster.patient_redlock()
}

/// Every key on every node (lossy: fence counters' names start with a
/// 0xff byte): a refused request writes none.
fn all_keys(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .flat_map(|n| raw_keys(n))
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .collect()
}

/// The keys of one node, as bytes.
fn raw_keys(node: &redlock_tests::RedisNode) -> Vec<Vec<u8>> {
    node.raw_bytes(&[b"KEYS", b"*"]).unwrap()
}

/// Every key of `cluster` with no expiry, as `port: key`.
fn without_expiry(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .flat_map(|n| {
            raw_keys(n)
                .into_iter()
                .filter(|k| n.raw_bytes::<i64>(&[b"PTTL", k]).unwrap() == -1)
                .map(|k| format!("{}: {}", n.port(), String::from_utf8_lossy(&k)))
                .collect::<Vec<_>>()
        })
        .collect()
}
