//! Native compare-and-delete and compare-and-set (`node/native.rs`) on real
//! servers: what is detected on Redis 7 and on Valkey 9, that release and
//! extend by `DELIFEQ` and `SET … IFEQ … PX` keep the scripts' semantics (a
//! foreign token is neither deleted nor extended, a missing key is not
//! created, the wake-up follows a real release only), a cluster mixing both
//! servers, and detection again after a node comes back as another server.
//!
//! The Valkey tests start their own `valkey-server` (`$VALKEY_SERVER`, or
//! `$REDIS_SERVER` when it is a Valkey, or `valkey-server` on `PATH`) and say
//! by name that they skipped when there is none.

use std::path::Path;
use std::time::Duration;

use redlock_core::{
    CompareAndDelete, NativeCommands, NativeSupport, NodeStatus, Redlock, RetryPolicy,
};
use redlock_tests::servers::{redis_without_native_or_skip, valkey_or_skip};
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};
use redlock_tests::util::eventually;
use redlock_tests::{Cluster, RedisNode};

/// What Valkey 9.0–9.1 has.
const VALKEY: &str = "DELIFEQ + SET IFEQ";

/// A node's detected support, in words.
fn found(s: Option<NativeSupport>) -> String {
    match s {
        None => "not looked for".into(),
        Some(s) if s == NativeSupport::none() => "none".into(),
        Some(s) if s.compare_and_delete == Some(CompareAndDelete::DelIfEq) && s.set_ifeq => {
            VALKEY.into()
        }
        Some(other) => format!("{other:?}"),
    }
}

fn cluster_of(bins: &[&Path]) -> Cluster {
    Cluster::of(
        bins.iter()
            .map(|b| RedisNode::start_binary(b, &[], &[]))
            .collect(),
    )
}

fn handle(cluster: &Cluster, native: NativeCommands) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        // Every call answered on a loaded machine: the subject is the
        // commands, not a slow node.
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .native_commands(native)
        .build()
        .unwrap()
}

/// `calls=` of `cmdstat_<command>` in the node's `INFO commandstats`.
fn calls(node: &RedisNode, command: &str) -> u64 {
    let stats: String = node.raw(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Each node's detected support once every node's answer is in (it is
/// asked in the background after a connection opens), or what is known
/// once they must have answered.
async fn native_of(rl: &Redlock) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + timing::settled();
    loop {
        let infos = rl.check_nodes().await.unwrap();
        let known = infos.iter().all(|i| i.native.is_some());
        if known || tokio::time::Instant::now() >= deadline {
            return infos.into_iter().map(|i| found(i.native)).collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detection_on_redis_7_finds_none_and_the_scripts_run() {
    let Some(redis) = redis_without_native_or_skip("detection_on_redis_7_finds_none") else {
        return;
    };
    let cluster = cluster_of(&[&redis, &redis, &redis]);
    let rl = handle(&cluster, NativeCommands::ReleaseAndExtend);
    assert_eq!(native_of(&rl).await, vec!["none"; 3]);
    let mut lock = rl
        .mutex("nat-r7")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let evalsha: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|n| calls(n, "evalsha"))
        .collect();
    rl.extend(&mut lock, Duration::from_secs(20)).await.unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| n.pttl("nat-r7") > 10_000)
    }));
    rl.unlock(lock).await.unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("nat-r7") == 0));
    for (n, before) in cluster.nodes().iter().zip(evalsha) {
        assert_eq!(
            calls(n, "evalsha"),
            before + 2,
            "extend and release by script"
        );
    }

    // Off looks for nothing.
    let off = handle(&cluster, NativeCommands::Off);
    let infos = off.check_nodes().await.unwrap();
    assert!(
        infos
            .iter()
            .all(|i| i.error.is_none() && i.native.is_none()),
        "{infos:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detection_on_valkey_9_finds_delifeq_and_set_ifeq() {
    let Some(valkey) = valkey_or_skip("detection_on_valkey_9_finds_delifeq_and_set_ifeq") else {
        return;
    };
    let cluster = cluster_of(&[&valkey, &valkey, &valkey]);
    let rl = handle(&cluster, NativeCommands::default());
    assert_eq!(native_of(&rl).await, vec![VALKEY; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_release_and_extend_keep_the_compare_on_valkey() {
    let Some(valkey) = valkey_or_skip("native_release_and_extend_keep_the_compare_on_valkey")
    else {
        return;
    };
    let cluster = cluster_of(&[&valkey, &valkey, &valkey]);
    let rl = handle(&cluster, NativeCommands::ReleaseAndExtend);
    assert_eq!(native_of(&rl).await, vec![VALKEY; 3]);
    let count = |cmd: &str| -> Vec<u64> { cluster.nodes().iter().map(|n| calls(n, cmd)).collect() };
    let evalsha = count("evalsha");

    // A foreign holder on node 2: neither extended nor deleted there.
    let mut lock = rl
        .mutex("nat-a")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(cluster.wait_until(
        timing::settled(),
        |c| c.count_holding("nat-a", lock.token()) == 3
    ));
    cluster
        .node(2)
        .cmd(&["SET", "nat-a", "foreign", "PX", "60000"]);
    // Node 1 lost the key: the extend must not create it.
    cluster.node(1).cmd(&["DEL", "nat-a"]);
    let err = rl
        .extend(&mut lock, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(err, redlock_core::Error::NotHeld { .. }), "{err}");
    assert_eq!(cluster.node(2).get("nat-a").as_deref(), Some("foreign"));
    assert!(cluster.node(2).pttl("nat-a") <= 60_000);
    assert_eq!(cluster.node(1).raw::<i64>(&["EXISTS", "nat-a"]).unwrap(), 0);
    // The extend was decided without node 0's answer, maybe.
    assert!(
        cluster.wait_until(timing::settled(), |c| c.node(0).pttl("nat-a") > 10_000),
        "node 0 still held it"
    );
    cluster
        .node(1)
        .cmd(&["SET", "nat-a", lock.token(), "PX", "60000"]);
    let publish = count("publish");
    let released = rl.unlock(lock).await.unwrap();
    assert!(released.deleted <= 2, "{}", released.report());
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("nat-a") == 1));
    assert_eq!(cluster.node(2).get("nat-a").as_deref(), Some("foreign"));
    // The wake-up went out where the key was deleted, and only there.
    let expected: Vec<u64> = publish.iter().zip([1, 1, 0]).map(|(p, d)| p + d).collect();
    assert!(eventually(timing::settled(), || count("publish") == expected).await);

    // A release by a token nobody holds deletes nothing and announces nothing:
    // after it, one real release adds exactly one PUBLISH per node (the
    // connection is first-in first-out, so a stray one would come first).
    let publish = count("publish");
    let other = rl
        .mutex("nat-b")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let none = rl.release_token("nat-b", "not-the-token").await.unwrap();
    assert_eq!(none.deleted, 0);
    assert!(cluster.wait_until(
        timing::settled(),
        |c| c.count_holding("nat-b", other.token()) == 3
    ));
    rl.unlock(other).await.unwrap();
    let expected: Vec<u64> = publish.iter().map(|p| p + 1).collect();
    assert!(eventually(timing::settled(), || count("publish") >= expected).await);
    assert_eq!(count("publish"), expected);

    // The extend that succeeds sets the new expiry, by SET, with no script.
    let mut lock = rl
        .mutex("nat-c")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    rl.extend(&mut lock, Duration::from_secs(40)).await.unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| n.pttl("nat-c") > 30_000)
    }));
    rl.unlock(lock).await.unwrap();
    assert_eq!(count("evalsha"), evalsha, "no script ran");
    assert!(count("delifeq").iter().all(|&d| d >= 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_release_wakes_a_waiter_of_another_handle() {
    let Some(valkey) = valkey_or_skip("a_native_release_wakes_a_waiter_of_another_handle") else {
        return;
    };
    let cluster = cluster_of(&[&valkey, &valkey, &valkey]);
    let holder = handle(&cluster, NativeCommands::ReleaseAndExtend);
    let waiter = handle(&cluster, NativeCommands::ReleaseAndExtend);
    assert_eq!(native_of(&holder).await, vec![VALKEY; 3]);
    // A wake-up: the release announced and an attempt made.
    let woken_within = timing::liveness(2 * PATIENT_NODE_TIMEOUT);
    let far = 4 * woken_within;
    let lock = holder.mutex("nat-w").try_acquire(far).await.unwrap();
    // Polling and a holder far beyond the bound below: only the release's
    // PUBLISH can wake the waiter within it.
    let policy = RetryPolicy::deadline(2 * far)
        .with_delay(far)
        .with_jitter(Duration::ZERO);
    let wait = tokio::spawn(async move {
        waiter
            .mutex("nat-w")
            .acquire_with(Duration::from_secs(5), &policy)
            .await
    });
    // The waiter has subscribed once its first attempt found the key busy.
    assert!(
        eventually(timing::settled(), || {
            let subs: Vec<redis::Value> = cluster
                .node(0)
                .raw(&["PUBSUB", "NUMSUB", "redlock:released:0:{nat-w}"])
                .unwrap();
            matches!(subs.get(1), Some(redis::Value::Int(n)) if *n > 0)
        })
        .await
    );
    let evalsha: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|n| calls(n, "evalsha"))
        .collect();
    holder.unlock(lock).await.unwrap();
    let got = tokio::time::timeout(woken_within, wait)
        .await
        .expect("the waiter was not woken by the native release")
        .unwrap()
        .unwrap();
    for (n, before) in cluster.nodes().iter().zip(evalsha) {
        assert_eq!(calls(n, "evalsha"), before, "the release ran no script");
    }
    drop(got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_two_redis_7_and_one_valkey_9_locks_extends_and_releases() {
    let test = "a_cluster_of_two_redis_7_and_one_valkey_9";
    let (Some(redis), Some(valkey)) = (redis_without_native_or_skip(test), valkey_or_skip(test))
    else {
        return;
    };
    let cluster = cluster_of(&[&redis, &redis, &valkey]);
    let rl = handle(&cluster, NativeCommands::ReleaseAndExtend);
    let other = handle(&cluster, NativeCommands::ReleaseAndExtend);
    assert_eq!(native_of(&rl).await, vec!["none", "none", VALKEY]);
    for i in 0..20 {
        let key = format!("nat-mixed-{i}");
        let mut lock = rl
            .mutex(&key)
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap();
        // The acquire returned at quorum; the other's attempt must not take
        // the third node before this one's SET lands there.
        assert!(
            cluster.wait_until(timing::settled(), |c| c.count_holding(&key, lock.token())
                == 3)
        );
        assert!(matches!(
            other.mutex(&key).try_acquire(Duration::from_secs(5)).await,
            Err(redlock_core::Error::Busy { .. })
        ));
        rl.extend(&mut lock, Duration::from_secs(30)).await.unwrap();
        assert!(cluster.wait_until(timing::settled(), |c| {
            c.nodes()
                .iter()
                .all(|n| n.pttl(&key) > 20_000 && n.get(&key).as_deref() == Some(lock.token()))
        }));
        let released = rl.unlock(lock).await.unwrap();
        assert!(
            released
                .report()
                .nodes
                .iter()
                .all(|n| matches!(n.status, NodeStatus::Ok | NodeStatus::Pending)),
            "{}",
            released.report()
        );
        assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(&key) == 0));
        let lock = other
            .mutex(&key)
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap();
        other.unlock(lock).await.unwrap();
    }
    // The last release was decided at quorum: node 2's may land later.
    assert!(cluster.wait_until(timing::settled(), |c| calls(c.node(2), "delifeq") >= 40));
    assert_eq!(calls(cluster.node(0), "delifeq"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_as_another_server_is_asked_again() {
    let test = "a_node_back_as_another_server_is_asked_again";
    let (Some(redis), Some(valkey)) = (redis_without_native_or_skip(test), valkey_or_skip(test))
    else {
        return;
    };
    let cluster = cluster_of(&[&redis, &redis, &redis]);
    let rl = handle(&cluster, NativeCommands::ReleaseAndExtend);
    assert_eq!(native_of(&rl).await[2], "none");

    // Node 2 comes back on the same port as a Valkey, then as a Redis 7 again.
    for (bin, expected) in [(&valkey, VALKEY), (&redis, "none")] {
        cluster.node(2).restart_as(bin);
        // The first calls find the old connection broken; a new one is asked.
        let deadline = tokio::time::Instant::now() + timing::settled();
        let mut seen = native_of(&rl).await;
        while seen[2] != expected && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen = native_of(&rl).await;
        }
        assert_eq!(seen[2], expected, "node 2 after its restart: {seen:?}");
        // Every node takes, extends and releases the lock, node 2 included.
        let mut lock = rl
            .mutex("nat-back")
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap();
        rl.extend(&mut lock, Duration::from_secs(20)).await.unwrap();
        assert!(cluster.wait_until(timing::settled(), |c| c.node(2).pttl("nat-back") > 10_000));
        rl.unlock(lock).await.unwrap();
        assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("nat-back") == 0));
    }
}
