//! The renewal schedule on real `redis-server` processes: a handle's guarded
//! locks are renewed in batches (one script call per node for many locks), and
//! each lock is still judged on its own: one stolen or expired among many is
//! lost while the others stay held, and paused nodes do not make a batch
//! overstate any lock's validity.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redlock_core::{LockGuard, LockOptions, Redlock};
use redlock_tests::Cluster;
use redlock_tests::timing::{self, patient_node_timeout_for};
use redlock_tests::util::eventually;

/// The guards' TTL: long enough for a patient node timeout (a third of it),
/// so that every renewal is answered on a loaded machine.
const TTL: Duration = Duration::from_secs(3);

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

/// Takes `n` guards on `prefix:i`, 100 at a time.
async fn take(rl: &Redlock, prefix: &str, n: usize, options: &LockOptions) -> Vec<LockGuard> {
    let mut guards = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(100) {
        let futs = (chunk * 100..n.min(chunk * 100 + 100)).map(|i| {
            let key = format!("{prefix}:{i}");
            async move { rl.mutex(&key).guard(options).await }
        });
        for g in join_all(futs).await {
            guards.push(g.unwrap());
        }
    }
    guards
}

/// Scripts run by each node so far (`EVALSHA` and `EVAL`), by `INFO commandstats`.
fn scripts_run(cluster: &Cluster) -> Vec<u64> {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            let info: String = n.raw(&["INFO", "commandstats"]).unwrap();
            info.lines()
                .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
                .filter_map(|l| {
                    l.split("calls=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum()
        })
        .collect()
}

fn extensions(guards: &[LockGuard]) -> u64 {
    guards
        .iter()
        .map(|g| u64::from(g.handle().extensions()))
        .sum()
}

/// 300 guards of one handle, renewed twice each: each node runs a few script
/// calls per renewal round, not one per lock. Before the schedule, every lock
/// had its own renewal task and each renewal cost every node one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_guards_are_renewed_by_few_calls() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, patient_node_timeout_for(TTL));
    rl.check_nodes().await.unwrap();
    let guards = take(&rl, "batch-few", 300, &LockOptions::new(TTL)).await;
    let before = scripts_run(&cluster);
    let renewed_before = extensions(&guards);
    let firsts: Vec<u32> = guards.iter().map(|g| g.handle().extensions()).collect();
    assert!(
        eventually(timing::liveness(2 * TTL), || guards
            .iter()
            .zip(&firsts)
            .all(|(g, &f)| g.handle().extensions() >= f + 2))
        .await,
        "not every lock was renewed twice"
    );
    let after = scripts_run(&cluster);
    let renewals = extensions(&guards) - renewed_before;
    assert_eq!(guards.iter().filter(|g| g.is_lost()).count(), 0);
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let calls = a - b;
        assert!(
            calls * 10 <= renewals,
            "node {i} ran {calls} script calls for {renewals} renewals (at least 10 locks per call expected)"
        );
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Among 200 guards renewed together, one lock's key is taken over by another
/// value on a quorum of nodes and another's key is deleted everywhere (as if
/// it expired): those two are told "lost", the other 198 stay held and keep
/// being renewed, and the foreign value is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lock_stolen_among_many_is_lost_alone() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, patient_node_timeout_for(TTL));
    rl.check_nodes().await.unwrap();
    let guards = take(&rl, "batch-steal", 200, &LockOptions::new(TTL)).await;
    let (stolen, expired) = (57, 123);
    let stolen_key = guards[stolen].handle().key().to_owned();
    let expired_key = guards[expired].handle().key().to_owned();
    // Every node has both keys before they are touched.
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key(&stolen_key) == 3
            && c.count_with_key(&expired_key) == 3)
    );
    for n in &cluster.nodes()[..2] {
        // Outlives the scenario: it is checked at the end.
        n.cmd(&["SET", &stolen_key, "someone-else", "PX", "600000"]);
    }
    for n in cluster.nodes() {
        n.cmd(&["DEL", &expired_key]);
    }
    let marks: Vec<u32> = guards.iter().map(|g| g.handle().extensions()).collect();
    assert!(
        eventually(timing::liveness(TTL), || guards[stolen].is_lost()
            && guards[expired].is_lost())
        .await,
        "the stolen and the expired lock were not reported lost"
    );
    // The others are renewed after the losses, and none of them is lost.
    assert!(
        eventually(timing::liveness(2 * TTL), || guards
            .iter()
            .zip(&marks)
            .enumerate()
            .filter(|(i, _)| *i != stolen && *i != expired)
            .all(|(_, (g, &m))| g.handle().extensions() >= m + 2))
        .await,
        "the other locks were not renewed twice after the losses"
    );
    let lost: Vec<usize> = (0..guards.len()).filter(|&i| guards[i].is_lost()).collect();
    assert_eq!(lost, vec![stolen, expired]);
    assert!(!guards[stolen].handle().is_released());
    for n in &cluster.nodes()[..2] {
        assert_eq!(n.get(&stolen_key).as_deref(), Some("someone-else"));
    }
    drop(guards);
}

/// Two of five nodes paused while 200 guards are renewed: renewals go on at
/// the quorum of three, and no holder is told more validity than the keys
/// have left on a quorum of nodes (the paused nodes' keys count as gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_nodes_do_not_make_a_batch_overstate_validity() {
    let cluster = Cluster::start(5);
    // The paused nodes stay pending whatever the node timeout; the three
    // others answer every renewal.
    let rl = redlock(&cluster, patient_node_timeout_for(TTL));
    rl.check_nodes().await.unwrap();
    let guards = take(&rl, "batch-paused", 200, &LockOptions::new(TTL)).await;
    cluster.node(3).pause();
    cluster.node(4).pause();
    let marks: Vec<u32> = guards.iter().map(|g| g.handle().extensions()).collect();
    let renewed = eventually(timing::liveness(2 * TTL), || {
        guards
            .iter()
            .zip(&marks)
            .all(|(g, &m)| g.handle().extensions() >= m + 2)
    })
    .await;
    let mut overstated = Vec::new();
    for g in &guards {
        let handle = g.handle();
        let asked = Instant::now();
        let remaining = handle.remaining();
        // The quorum's earliest expiry: the third longest PTTL of five, with
        // the two paused nodes' keys counted as gone.
        let mut pttls: Vec<i64> = cluster.nodes()[..3]
            .iter()
            .map(|n| n.pttl(handle.key()))
            .collect();
        pttls.sort_unstable();
        let read = asked.elapsed();
        let quorum_left = Duration::from_millis(pttls[0].max(0) as u64);
        // The holder's validity (remaining + margin) ends no later than the
        // keys on the quorum; PTTL is whole milliseconds.
        if remaining + handle.loss_margin() > quorum_left + read + ms(1) && !g.is_lost() {
            overstated.push((handle.key().to_owned(), remaining, pttls));
        }
    }
    cluster.node(3).resume();
    cluster.node(4).resume();
    assert!(renewed, "renewals did not go on at the quorum of three");
    assert_eq!(guards.iter().filter(|g| g.is_lost()).count(), 0);
    assert!(
        overstated.is_empty(),
        "{} holders told more than their keys have left: {:?}",
        overstated.len(),
        &overstated[..overstated.len().min(3)]
    );
    drop(guards);
}
