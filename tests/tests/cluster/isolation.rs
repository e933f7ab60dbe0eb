//! Issue 49, item 1: a cluster node is as available as its slots. One master
//! of a cluster stopped (`SIGSTOP`) for 2 s, shorter than its cluster's
//! `cluster-node-timeout`, so the cluster stays `ok`: the calls for the other
//! masters' slots go on, the stopped master's slots fail as a node error, and
//! once it resumes every call succeeds again, without the connection to the
//! cluster being made anew over and over.
//!
//! Each handle has this one cluster as its only node (a quorum of one), so a
//! call's outcome is that node's answer for the call's slot.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Error, NodeStatus, Redlock, RetryPolicy};
use redlock_tests::{RedisCluster, RedisNode};

/// Every call is bounded by this; a healthy master answers well within it,
/// even on a loaded machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the master is stopped.
const STOP: Duration = Duration::from_secs(3);
/// The locks' TTL. A `SET` sent to the stopped master runs when it resumes,
/// after its call timed out: that key stays until it expires.
const TTL: Duration = Duration::from_millis(1500);
/// Resources per master, one for each worker (and its handle).
const PER_MASTER: usize = 3;

/// One call: which master serves its resource, when it started and ended,
/// and whether it took the lock (else what the node said).
struct Call {
    master: usize,
    started: Instant,
    ended: Instant,
    outcome: Result<(), String>,
}

/// `n` resources whose keys each master of `cluster` serves, by master.
fn resources_by_master(cluster: &RedisCluster, handle: &Redlock, n: usize) -> Vec<Vec<String>> {
    let masters: Vec<u16> = cluster.masters().iter().map(|m| m.port()).collect();
    let mut out = vec![Vec::new(); masters.len()];
    for i in 0..10_000 {
        if out.iter().all(|r: &Vec<String>| r.len() >= n) {
            return out;
        }
        let resource = format!("isolation:{i}");
        let slot = cluster.slot_of(handle.key_for(&resource).as_bytes());
        let owner = cluster.owner(slot).expect("every slot is served");
        let m = masters
            .iter()
            .position(|&p| p == owner.port())
            .expect("the owner is a master");
        if out[m].len() < n {
            out[m].push(resource);
        }
    }
    panic!("no {n} resources on every master in 10000 names");
}

/// The connections `node` has accepted so far (`INFO stats`).
fn connections_received(node: &RedisNode) -> u64 {
    let info: String = node.raw(&["INFO", "stats"]).expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

/// Why a call failed, if it failed on the cluster node (`Failed` in its
/// report), else the error itself.
fn why(e: &Error) -> String {
    let node = e
        .report()
        .and_then(|r| r.nodes.first())
        .map(|n| match &n.status {
            NodeStatus::Failed(err) => format!("node error: {err}"),
            other => format!("{other:?}"),
        });
    node.unwrap_or_else(|| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_master_fails_only_its_own_slots() {
    // Judged down only after 15 s: the cluster stays `ok` through the stop.
    let cluster = RedisCluster::start_judging(3, 0, Duration::from_secs(15));
    // One handle per worker, as one per process.
    let handles: Vec<Redlock> = (0..PER_MASTER)
        .map(|_| {
            Redlock::builder()
                .cluster(cluster.seeds())
                .node_timeout(NODE_TIMEOUT)
                .retry(RetryPolicy::no_retry())
                .wake_on_release(false)
                .build()
                .expect("build the handle")
        })
        .collect();
    let resources = resources_by_master(&cluster, &handles[0], PER_MASTER);
    // The connections are made while every master answers.
    for (worker, handle) in handles.iter().enumerate() {
        for names in &resources {
            let lock = handle
                .mutex(&names[worker])
                .try_acquire(TTL)
                .await
                .expect("warm-up");
            handle.unlock(lock).await.expect("warm-up unlock");
        }
    }
    let stopped = Arc::clone(&cluster.masters()[0]);
    let healthy: Vec<Arc<RedisNode>> = cluster.masters()[1..].to_vec();
    let received_before: Vec<u64> = healthy.iter().map(|n| connections_received(n)).collect();

    let calls = Arc::new(Mutex::new(Vec::<Call>::new()));
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // Workers, each with a handle of its own and taking its resources one at
    // a time in turn, as a process serving one request after another does:
    // while it waits on the stopped master, nothing else is in flight on its
    // connection.
    // Each worker has a resource of its own on every master: they never
    // contend with each other.
    let mut tasks = Vec::new();
    for (worker, handle) in handles.iter().enumerate() {
        let handle = handle.clone();
        let calls = Arc::clone(&calls);
        let running = Arc::clone(&running);
        let all: Vec<(usize, String)> = resources
            .iter()
            .enumerate()
            .map(|(m, names)| (m, names[worker].clone()))
            .collect();
        tasks.push(tokio::spawn(async move {
            // Bounded: the test ends the loop; each call is bounded by the
            // node timeout.
            let mut next = worker;
            while running.load(std::sync::atomic::Ordering::SeqCst) {
                let (master, resource) = &all[next % all.len()];
                next += 1;
                let started = Instant::now();
                let outcome = match handle.mutex(resource).try_acquire(TTL).await {
                    Ok(lock) => {
                        // A release that times out is the stopped master's;
                        // the key then expires.
                        let _ = handle.unlock(lock).await;
                        Ok(())
                    }
                    Err(e) => Err(why(&e)),
                };
                let ended = Instant::now();
                calls.lock().unwrap().push(Call {
                    master: *master,
                    started,
                    ended,
                    outcome,
                });
                // Pacing: a few dozen calls per second.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    let paused = Instant::now();
    stopped.pause();
    tokio::time::sleep(STOP).await;
    stopped.resume();
    let resumed = Instant::now();
    // Recovery: the stopped master's queued calls are answered, and the next
    // calls on its slots succeed. Then a stretch in which every call must.
    let recovered = resumed + TTL + NODE_TIMEOUT;
    tokio::time::sleep(TTL + NODE_TIMEOUT + Duration::from_secs(2)).await;
    running.store(false, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.expect("a workload task panicked");
    }
    let calls = std::mem::take(&mut *calls.lock().unwrap());

    // The other masters' calls while the master was stopped, and the second
    // after it: at least 95 % took their lock.
    let others: Vec<&Call> = calls
        .iter()
        .filter(|c| c.master != 0 && c.started >= paused && c.started < resumed + STOP / 2)
        .collect();
    let others_ok = others.iter().filter(|c| c.outcome.is_ok()).count();
    let failed: Vec<String> = others
        .iter()
        .filter_map(|c| {
            let e = c.outcome.as_ref().err()?;
            Some(format!(
                "{e} ({:?} after the stop, for {:?})",
                c.started - paused,
                c.ended - c.started
            ))
        })
        .take(5)
        .collect();
    println!(
        "other masters: {others_ok} of {} calls succeeded during the stop and the second \
         after; failures: {failed:?}",
        others.len()
    );
    assert!(
        others.len() >= 20,
        "too few calls on the other masters to judge: {}",
        others.len()
    );
    // The issue asks for 95 %. Each worker's connection used to be dropped
    // by its first silent call and made anew, which could not finish while
    // the master was stopped: its calls on every slot failed until then
    // (2 % to 4 % of these calls with a 2 s stop, each worker's first
    // calls after the drop). 99 % leaves room for one call slowed past the
    // node timeout by a loaded machine, and none for that.
    assert!(
        others_ok * 100 >= others.len() * 99,
        "only {others_ok} of {} calls for the other masters' slots succeeded while one \
         master was stopped; first failures: {failed:?}",
        others.len()
    );

    // The stopped master's calls that began and ended within the stop: none
    // took a lock, and each failed as a node error.
    let on_stopped: Vec<&Call> = calls
        .iter()
        .filter(|c| c.master == 0 && c.started >= paused && c.ended < resumed)
        .collect();
    assert!(
        !on_stopped.is_empty(),
        "no call on the stopped master's slots ended during the stop"
    );
    for c in &on_stopped {
        match &c.outcome {
            Ok(()) => panic!("a lock was taken on a stopped master"),
            Err(why) => assert!(why.starts_with("node error"), "{why}"),
        }
    }

    // After it resumed, its queued calls were answered and the keys their
    // late `SET`s left expired: every call on every master succeeds.
    let after: Vec<&Call> = calls.iter().filter(|c| c.started >= recovered).collect();
    assert!(
        after.iter().any(|c| c.master == 0),
        "no call on the resumed master's slots after it resumed"
    );
    let after_failed: Vec<(usize, &String)> = after
        .iter()
        .filter_map(|c| c.outcome.as_ref().err().map(|e| (c.master, e)))
        .take(5)
        .collect();
    assert!(
        after_failed.is_empty(),
        "calls failed after the master resumed: {after_failed:?}"
    );

    // No rebuild storm: each handle made its cluster connection anew at most
    // once (a new one connects to a seed for the slot map, then to each
    // master: at most two connections on each healthy master).
    let received_after: Vec<u64> = healthy.iter().map(|n| connections_received(n)).collect();
    println!(
        "connections accepted by the healthy masters: {received_before:?} then {received_after:?}"
    );
    for (before, after) in received_before.iter().zip(&received_after) {
        assert!(
            after - before <= 2 * PER_MASTER as u64,
            "a healthy master accepted {} connections during the run, from {PER_MASTER} handles",
            after - before
        );
    }
}
