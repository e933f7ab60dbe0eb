//! The quorum semaphore and the read/write lock of issue 41 on real
//! `redis-server` processes: the limits judged from intervals the clients
//! record (not from counters the library keeps), a node down, a dead
//! holder's share freed at expiry, and writer preference.

mod inspect;
mod intent;
mod leftovers;
mod permits;
mod rwlock;
mod wake;

use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_tests::{Cluster, timing};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// No test here is about a slow node: every call must be answered.
fn redlock(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// A section a client ran under what it held: who, and when it began and ended.
#[derive(Debug, Clone, Copy)]
struct Section {
    client: usize,
    enter: Instant,
    exit: Instant,
}

/// The most sections that were open at one moment, from their recorded
/// intervals (an exit at the instant of an enter counts as before it).
fn most_at_once(sections: &[Section]) -> usize {
    let mut events: Vec<(Instant, i32)> = sections
        .iter()
        .flat_map(|s| [(s.enter, 1), (s.exit, -1)])
        .collect();
    events.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        open += delta;
        most = most.max(open);
    }
    most as usize
}

/// Acquire attempts each node has run so far: the scripts it ran (`INFO
/// commandstats`), one per try of a permit's slot or of a share's side, not
/// what a new connection sends: a waiter's attempt shows up here once it
/// ran on a node. Not the commands a script runs (`SET`, `TYPE`, which
/// commandstats counts too): with them, a permit's first slot's try alone
/// made an attempt's count while its second slot's was still on its way,
/// and the release that followed let that try in (the polling control of
/// `wake::a_permit_released_wakes_its_waiter_long_before_its_poll` served
/// 1.7 ms after the release, once in a cold CI run).
fn lock_calls(cluster: &Cluster) -> Vec<u64> {
    const ATTEMPTS: [&str; 6] = [
        "evalsha",
        "eval",
        "evalsha_ro",
        "eval_ro",
        "fcall",
        "fcall_ro",
    ];
    cluster
        .nodes()
        .iter()
        .map(|n| {
            let info: String = n.raw(&["INFO", "commandstats"]).unwrap_or_default();
            info.lines()
                .filter_map(|l| {
                    let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                    if !ATTEMPTS.contains(&name) {
                        return None;
                    }
                    rest.strip_prefix("calls=")?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum()
        })
        .collect()
}

/// Runs `f` on a thread of its own with its own runtime, then drops that
/// runtime without running anything more: what the holder leaked inside
/// `f` is never renewed nor released, as if its process were killed.
fn on_a_runtime_that_dies<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f());
        // Dropping the runtime drops its tasks (the renewals) unrun.
        drop(rt);
    })
    .join()
    .unwrap();
}

#[test]
fn most_at_once_counts_overlaps() {
    let t = Instant::now();
    let s = |client, a: u64, b: u64| Section {
        client,
        enter: t + ms(a),
        exit: t + ms(b),
    };
    assert_eq!(most_at_once(&[s(0, 0, 10), s(1, 10, 20)]), 1);
    assert_eq!(most_at_once(&[s(0, 0, 10), s(1, 5, 20), s(2, 6, 7)]), 3);
    assert_eq!(s(0, 0, 1).client, 0);
}
