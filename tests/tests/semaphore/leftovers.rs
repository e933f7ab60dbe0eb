//! What a read share leaves on the nodes once it is released: nothing. A
//! reader is listed in its resource's readers index (the set a writer
//! checks); its release must take it off, or every resource ever read
//! keeps an index key with no expiry on every node, and a client that
//! reads many distinct paths (`shared_for_safe_methods()` under
//! `by_path()`) grows the nodes without bound.

use std::time::Duration;

use redlock_core::{Access, LockOptions, NativeCommands, Redlock};
use redlock_tests::servers::valkey_or_skip;
use redlock_tests::{Cluster, RedisNode, timing};

use super::ms;

/// Every key left on each node, with its PTTL.
fn left(cluster: &Cluster) -> Vec<Vec<(String, i64)>> {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            n.keys()
                .into_iter()
                .map(|k| (k.clone(), n.pttl(&k)))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_readers_leave_no_key_on_any_node() {
    let cluster = Cluster::start(3);
    read_and_release_many(&cluster, NativeCommands::default()).await;
}

/// On Valkey 9 with native release (`DELIFEQ`) on: a reader's release
/// still runs the script, which takes it off the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_native_release_released_readers_leave_no_key_either() {
    let Some(valkey) = valkey_or_skip("with_native_release_released_readers_leave_no_key_either")
    else {
        return;
    };
    let cluster = Cluster::of(
        (0..3)
            .map(|_| RedisNode::start_binary(&valkey, &[], &[]))
            .collect(),
    );
    read_and_release_many(&cluster, NativeCommands::ReleaseAndExtend).await;
}

/// Two readers and a guarded one on each of 40 resources, all released,
/// then no key is left on any node.
async fn read_and_release_many(cluster: &Cluster, native: NativeCommands) {
    const RESOURCES: usize = 40;
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .native_commands(native)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(30);
    for i in 0..RESOURCES {
        let resource = format!("reports/{i}");
        // Two readers together, released one after the other.
        let a = rl
            .try_rw_lock(&resource, Access::Shared, ttl)
            .await
            .unwrap();
        let b = rl
            .try_rw_lock(&resource, Access::Shared, ttl)
            .await
            .unwrap();
        rl.unlock(a).await.unwrap();
        rl.unlock(b).await.unwrap();
        // A guarded reader, released by its guard.
        let g = rl
            .rw_guard(&resource, Access::Shared, &LockOptions::new(ms(5000)))
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    // Each unlock answers at a quorum; the third node's delete may land
    // just after.
    let clean = cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| n.keys().is_empty())
    });
    assert!(
        clean,
        "keys left after every reader of {RESOURCES} resources released: {:?}",
        left(cluster)
    );
}
