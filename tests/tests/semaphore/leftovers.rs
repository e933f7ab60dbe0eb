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
            .rw_lock(&resource, Access::Shared)
            .try_acquire(ttl)
            .await
            .unwrap();
        let b = rl
            .rw_lock(&resource, Access::Shared)
            .try_acquire(ttl)
            .await
            .unwrap();
        rl.unlock(a).await.unwrap();
        rl.unlock(b).await.unwrap();
        // A guarded reader, released by its guard.
        let g = rl
            .rw_lock(&resource, Access::Shared)
            .guard(&LockOptions::new(ms(5000)))
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

/// Issue 47 item 7: a reader that dies unreleased (here: its `Lock` is
/// forgotten, as a killed process leaves it) leaves nothing once its TTL has
/// passed. Its key expires by itself; before the index had an expiry, the
/// index listing it stayed on every node for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreleased_reader_leaves_no_key_once_its_ttl_has_passed() {
    let cluster = Cluster::start(3);
    let ttl = ms(800);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::patient_node_timeout_for(ttl))
        .build()
        .unwrap();
    for i in 0..5 {
        let lock = rl
            .rw_lock(format!("dead-readers/{i}"), Access::Shared)
            .try_acquire(ttl)
            .await
            .unwrap();
        std::mem::forget(lock);
    }
    // The index is given an expiry with the reader's key, on every node
    // that took the reader (a quorum at least; poll for the third).
    let expiring = cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| {
            let keys = n.keys();
            keys.len() == 10 && keys.iter().all(|k| n.pttl(k) > 0)
        })
    });
    assert!(expiring, "a key without an expiry: {:?}", left(&cluster));
    let clean = cluster.wait_until(timing::liveness(ttl), |c| {
        c.nodes().iter().all(|n| n.keys().is_empty())
    });
    assert!(
        clean,
        "keys left after dead readers' TTL: {:?}",
        left(&cluster)
    );
}

/// The other side of item 7, safety: a read share held by its guard well
/// past the TTL its acquire gave the index stays visible to writers, so its
/// renewals must keep the index alive too. One guard (its renewal is the
/// single extend) and eight at once (renewed in batches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_reader_keeps_writers_out_past_its_first_ttl() {
    let cluster = Cluster::start(3);
    tokio::join!(
        renewed_readers_keep_writers_out(&cluster, NativeCommands::default(), 1),
        renewed_readers_keep_writers_out(&cluster, NativeCommands::default(), 8),
    );
}

/// The same on Valkey 9, whose `SET … IFEQ` extends a mutex natively: a
/// reader's extend must still run the script that keeps its index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_valkey_a_renewed_reader_keeps_writers_out_past_its_first_ttl() {
    let Some(valkey) =
        valkey_or_skip("on_valkey_a_renewed_reader_keeps_writers_out_past_its_first_ttl")
    else {
        return;
    };
    let cluster = Cluster::of(
        (0..3)
            .map(|_| RedisNode::start_binary(&valkey, &[], &[]))
            .collect(),
    );
    tokio::join!(
        renewed_readers_keep_writers_out(&cluster, NativeCommands::ReleaseAndExtend, 1),
        renewed_readers_keep_writers_out(&cluster, NativeCommands::ReleaseAndExtend, 8),
    );
}

/// `readers` guarded read shares of a 2 s TTL, each on its own resource;
/// once three TTLs have passed (renewed, not lost), a writer is refused on
/// each resource. The TTL is long enough that a renewal is not starved on a
/// loaded machine; a reader lost all the same is not judged, but at least
/// one must be.
async fn renewed_readers_keep_writers_out(
    cluster: &Cluster,
    native: NativeCommands,
    readers: usize,
) {
    let ttl = ms(2000);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::patient_node_timeout_for(ttl))
        .native_commands(native)
        .build()
        .unwrap();
    let resources: Vec<String> = (0..readers)
        .map(|i| format!("renewed-readers/{readers}/{i}"))
        .collect();
    let options = LockOptions::new(ttl);
    let guards = futures_util::future::try_join_all(resources.iter().map(|r| {
        let (read, options) = (rl.rw_lock(r, Access::Shared), &options);
        async move { read.guard(options).await }
    }))
    .await
    .unwrap();
    // The subject is time itself: three TTLs of the acquire's.
    tokio::time::sleep(ttl * 3).await;
    let mut judged = 0;
    for (guard, resource) in guards.iter().zip(&resources) {
        if guard.is_lost() {
            // A starved renewal is the library's honest answer, not a
            // finding: safety is judged only for readers still held.
            eprintln!("{resource}: reader lost its lease (load); not judged");
            continue;
        }
        match rl
            .rw_lock(resource, Access::Exclusive)
            .try_acquire(ms(5000))
            .await
        {
            Err(redlock_core::Error::Busy { .. }) => {}
            other => panic!(
                "{resource}: a writer while a renewed reader holds: {other:?}; nodes: {:?}",
                left(cluster)
            ),
        }
        judged += 1;
    }
    assert!(judged > 0, "every reader was lost: nothing judged");
    for guard in guards {
        guard.release().await.unwrap();
    }
}
