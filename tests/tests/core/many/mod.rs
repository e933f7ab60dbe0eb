//! Several resources under one lock (issue 22) on real `redis-server`
//! processes: two clients locking {A, B} and {B, A} (and a third locking A
//! alone) never deadlock and never overlap; a node holding one of the keys
//! for someone else does not count; the quorum rule for every way of spreading
//! foreign keys over N = 3 and 5 nodes; a partial acquire released
//! everywhere; extend refused once one key was taken on a quorum; release
//! waking the waiters of either key; a guard renewing every key; one fencing
//! token per resource; deduplication, order and the limit on the number of
//! resources.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redlock_core::Redlock;
use redlock_tests::Cluster;

mod acquire;
mod holding;
mod wake;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

const FOREIGN: &str = "held-by-someone-else";

/// Every node holds the foreign value at each key it was given one at, and
/// nothing at the others, within 3 s (a late answer's release runs in the
/// background).
fn eventually_only_foreign(
    cluster: &Cluster,
    foreign: &[(usize, &str)],
    keys: &[&str],
) -> Result<(), String> {
    let check = |c: &Cluster| -> Result<(), String> {
        for (i, node) in c.nodes().iter().enumerate() {
            for &key in keys {
                let expected = foreign
                    .iter()
                    .any(|&(n, k)| n == i && k == key)
                    .then(|| FOREIGN.to_owned());
                let value = node.get(key);
                if value != expected {
                    return Err(format!(
                        "node {i}, key {key}: {value:?}, expected {expected:?}"
                    ));
                }
            }
        }
        Ok(())
    };
    let mut last = Ok(());
    cluster.wait_until(redlock_tests::timing::settled(), |c| {
        last = check(c);
        last.is_ok()
    });
    last
}

/// The overlap check: how many holders each key has right now.
#[derive(Default)]
struct Holders {
    a: AtomicUsize,
    b: AtomicUsize,
    overlaps: AtomicU64,
}

impl Holders {
    fn counter(&self, resource: &str) -> &AtomicUsize {
        match resource {
            "A" => &self.a,
            "B" => &self.b,
            other => panic!("unexpected resource {other}"),
        }
    }

    fn enter(&self, resources: &[&str]) {
        for r in resources {
            if self.counter(r).fetch_add(1, Ordering::SeqCst) != 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn leave(&self, resources: &[&str]) {
        for r in resources {
            self.counter(r).fetch_sub(1, Ordering::SeqCst);
        }
    }
}
