//! Safety properties of `redlock-core` on real `redis-server` processes: the
//! quorum rule for every subset of busy nodes (N = 1, 3, 5), with no key of a
//! failed or released attempt left behind, and mutual exclusion between 16
//! concurrent clients.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Error, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::timing;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const FOREIGN: &str = "held-by-someone-else";

/// Every node holds either the foreign value (if it is in `busy`) or nothing.
fn only_foreign_values_left(cluster: &Cluster, key: &str, busy: &[usize]) -> Result<(), String> {
    for (i, node) in cluster.nodes().iter().enumerate() {
        let value = node.get(key);
        let expected = busy.contains(&i).then(|| FOREIGN.to_owned());
        if value != expected {
            return Err(format!("node {i}: {value:?}, expected {expected:?}"));
        }
    }
    Ok(())
}

/// [`only_foreign_values_left`], allowing [`settled`](timing::settled) (below
/// every TTL used) for the background release of an answer that came after
/// the outcome was decided.
fn eventually_only_foreign_values(
    cluster: &Cluster,
    key: &str,
    busy: &[usize],
) -> Result<(), String> {
    let mut last = Ok(());
    cluster.wait_until(timing::settled(), |c| {
        last = only_foreign_values_left(c, key, busy);
        last.is_ok()
    });
    last
}

async fn check_every_subset(n: usize) {
    let cluster = Cluster::start(n);
    // Every node answers: the subject is the quorum rule, not a slow node.
    let rl = cluster.patient_redlock();
    // Connect and load the scripts, so every later call is one ordered EVALSHA.
    rl.check_nodes().await.unwrap();
    let lock = rl
        .mutex("warm-up")
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
    assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key("warm-up") == 0));

    let quorum = n / 2 + 1;
    assert_eq!(rl.quorum(), quorum);
    let (mut successes, mut failures) = (0, 0);
    for mask in 0u32..(1 << n) {
        let key = format!("subset:{n}:{mask:05b}");
        let busy: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &busy {
            // Outlives the case (checked at its end, up to `settled` later).
            cluster.node(i).cmd(&["SET", &key, FOREIGN, "PX", "120000"]);
        }
        let free = n - busy.len();
        let case = format!("N={n}, busy nodes {busy:?}");
        match rl.mutex(&key).try_acquire(Duration::from_secs(10)).await {
            Ok(lock) => {
                assert!(free >= quorum, "{case}: locked with only {free} free nodes");
                successes += 1;
                // The nodes that made the quorum hold the token; a late one may too.
                let holding = cluster.count_holding(&key, lock.token());
                assert!(
                    holding >= quorum && holding <= free,
                    "{case}: {holding} nodes hold the token"
                );
                for &i in &busy {
                    assert_eq!(
                        cluster.node(i).get(&key).as_deref(),
                        Some(FOREIGN),
                        "{case}"
                    );
                }
                // Decided at quorum: the free nodes' keys are all deleted in
                // the end (checked below), not all by the time it returns.
                let released = rl.unlock(lock).await.unwrap();
                assert!(
                    released.deleted <= free
                        && released.deleted
                            + released.report().pending_count()
                            + (free - quorum.min(free))
                            >= quorum.min(free),
                    "{case}: {released:?}"
                );
                eventually_only_foreign_values(&cluster, &key, &busy)
                    .unwrap_or_else(|e| panic!("{case}: after unlock, {e}"));
            }
            Err(e) => {
                assert!(free < quorum, "{case}: refused with {free} free nodes: {e}");
                assert!(matches!(e, Error::Busy { .. }), "{case}: {e:?}");
                failures += 1;
                eventually_only_foreign_values(&cluster, &key, &busy)
                    .unwrap_or_else(|e| panic!("{case}: after the failed attempt, {e}"));
            }
        }
    }
    assert_eq!(successes + failures, 1 << n);
    assert!(successes > 0 && failures > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_a_majority_is_free_one_node() {
    check_every_subset(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_a_majority_is_free_three_nodes() {
    check_every_subset(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_a_majority_is_free_five_nodes() {
    check_every_subset(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_overlap() {
    const CLIENTS: usize = 16;
    // Each client's critical section: part of the scenario.
    const SECTION: Duration = Duration::from_millis(8);
    let cluster = Cluster::start(3);
    let counter = Arc::new(AtomicU64::new(0));
    let sections: Arc<Mutex<Vec<(usize, Instant, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let (delay, jitter) = (ms(10), ms(60));
    // A client's turn: the pause before its attempt, its acquire's round, its
    // section and its release's round. The last client waits for every
    // other's turn.
    let turn = delay + jitter + 2 * timing::PATIENT_NODE_TIMEOUT + SECTION;
    let waits = timing::liveness(turn * CLIENTS as u32);
    let policy = RetryPolicy::deadline(waits)
        .with_delay(delay)
        .with_jitter(jitter);
    // Its own turn after the wait.
    let hung = waits + timing::liveness(turn);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let rl = cluster.patient_redlock();
            let (counter, sections, policy) =
                (Arc::clone(&counter), Arc::clone(&sections), policy.clone());
            tokio::spawn(async move {
                let lock = match rl
                    .mutex("mutex")
                    .acquire_with(Duration::from_secs(5), &policy)
                    .await
                {
                    Ok(lock) => lock,
                    Err(e) => return Err(e),
                };
                let enter = Instant::now();
                // A non-atomic read-modify-write: lost updates if two overlap.
                let seen = counter.load(Ordering::SeqCst);
                tokio::time::sleep(SECTION).await;
                counter.store(seen + 1, Ordering::SeqCst);
                let exit = Instant::now();
                assert!(lock.is_valid(), "client {client} outlived its validity");
                sections.lock().unwrap().push((client, enter, exit));
                rl.unlock(lock).await.map(|_| ())
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        let result = tokio::time::timeout(hung, task)
            .await
            .expect("a client hung")
            .expect("a client panicked");
        match result {
            Ok(()) => ok += 1,
            Err(e) => panic!("a client failed: {e}"),
        }
    }
    let mut sections = sections.lock().unwrap().clone();
    assert_eq!(ok, CLIENTS);
    assert_eq!(sections.len(), CLIENTS);
    assert_eq!(
        counter.load(Ordering::SeqCst),
        sections.len() as u64,
        "lost updates: critical sections overlapped"
    );
    sections.sort_by_key(|s| s.1);
    for pair in sections.windows(2) {
        let ((a, _, a_exit), (b, b_enter, _)) = (pair[0], pair[1]);
        assert!(
            a_exit <= b_enter,
            "clients {a} and {b} overlapped by {:?}",
            a_exit - b_enter
        );
    }
}
