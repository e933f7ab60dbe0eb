//! Holder-side safety on real `redis-server` processes: what a lock tells the code
//! that runs under it must hold on the nodes, even when the renewal task cannot
//! run (a blocked thread, a dead runtime), when an extend fails half-way, and for
//! every input the API accepts, `Duration::MAX` included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use redlock_core::request::{self, LockPolicy, Rejection};
use redlock_core::{Error, LockOptions, Redlock, RetryPolicy};
use redlock_tests::Cluster;
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT, patient_node_timeout_for};

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

/// A second client on its own thread and runtime, retrying until it takes `key`.
/// Sends the instant it got the lock on `took` while it holds it, then
/// releases it; returns that instant, or `None` after `budget`.
fn contender(
    urls: Vec<String>,
    key: &'static str,
    budget: Duration,
    took: std::sync::mpsc::Sender<Instant>,
) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            // Its subject is not a slow node: every call answered.
            let other = Redlock::builder()
                .urls(urls)
                .node_timeout(PATIENT_NODE_TIMEOUT)
                .build()
                .unwrap();
            let retry = RetryPolicy::deadline(budget)
                .with_delay(ms(10))
                .with_jitter(ms(10));
            let lock = other
                .mutex(key)
                .acquire_with(ms(5_000), &retry)
                .await
                .ok()?;
            let at = Instant::now();
            let _ = took.send(at);
            other.unlock(lock).await.ok();
            Some(at)
        })
    })
}

/// Reproduction from the issue: on a current-thread runtime, work that blocks its
/// thread past the TTL starves the renewal task. Before the fix the holder was
/// then told `is_lost() == false` while another client already held the lock,
/// and `with_lock` returned `Ok`.
#[test]
fn a_holder_whose_thread_blocked_past_the_ttl_is_told_it_lost_the_lock() {
    let cluster = Cluster::start(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = "holder-blocked";
    let ttl = ms(1_000);
    let rl = redlock(&cluster, patient_node_timeout_for(ttl));
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen2 = Arc::clone(&seen);
    let urls = cluster.urls();
    // The contender can take the lock once the holder's keys expired.
    let budget = timing::liveness(ttl);
    let result = rt.block_on(
        rl.mutex(key)
            .run(&LockOptions::new(ttl), |lock| async move {
                let (tx, took) = std::sync::mpsc::channel();
                let other = contender(urls, key, budget, tx);
                // A GC pause, a blocking call on the runtime's only thread: it
                // lasts until the second client holds the lock (bounded).
                let _ = took.recv_timeout(budget);
                let checked_at = Instant::now();
                *seen2.lock().unwrap() =
                    Some((lock.is_lost(), lock.remaining(), checked_at, other));
            }),
    );
    let (lost, remaining, checked_at, other) = seen.lock().unwrap().take().expect("the work ran");
    let other_at = other
        .join()
        .unwrap()
        .expect("the second client took the lock");
    assert!(
        other_at < checked_at,
        "the scenario needs the second client to hold the lock before the check"
    );
    assert!(
        lost,
        "is_lost() was false while another client held the lock"
    );
    assert_eq!(remaining, Duration::ZERO);
    assert!(
        matches!(result, Err(Error::Lost { .. })),
        "with_lock returned {result:?} for work that outlived its lock"
    );
}

/// The loss signal has its own timer: while the runtime that runs the renewal
/// task is blocked, `lost()` awaited elsewhere still completes by the deadline.
#[test]
fn lost_completes_by_the_deadline_while_the_renewal_runtime_is_blocked() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let ttl = ms(400);
    let (tx, rx) = std::sync::mpsc::channel();
    let (unblock_tx, unblock_rx) = std::sync::mpsc::channel::<()>();
    // Runtime 1 holds the guard, then blocks its only thread.
    let holder = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let rl = Redlock::builder()
                .urls(urls)
                .node_timeout(patient_node_timeout_for(ttl))
                .build()
                .unwrap();
            let guard = rl
                .mutex("holder-timer")
                .guard(&LockOptions::new(ttl))
                .await
                .unwrap();
            tx.send(guard.handle()).unwrap();
            // Blocked until the test has seen `lost()` complete (bounded
            // beyond the test's own wait, so that lost() cannot complete
            // through this runtime).
            let _ = unblock_rx.recv_timeout(2 * timing::liveness(ttl));
            drop(guard);
        });
    });
    let handle = rx.recv_timeout(timing::liveness(ttl)).unwrap();
    let deadline = handle.valid_until() - handle.loss_margin();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fired = rt.block_on(async {
        tokio::time::timeout(timing::liveness(ttl), handle.lost())
            .await
            .map(|()| Instant::now())
    });
    unblock_tx.send(()).unwrap();
    holder.join().unwrap();
    let fired = fired.expect("lost() did not complete while the renewal runtime was blocked");
    assert!(
        fired >= deadline,
        "lost() fired {:?} early",
        deadline - fired
    );
    // A timer's lateness on a loaded machine.
    assert!(
        fired <= deadline + timing::SCHEDULING_MARGIN,
        "lost() fired {:?} after the deadline",
        fired - deadline
    );
    assert!(handle.is_lost());
}

/// A runtime shut down under a held guard kills its renewal task: the holder is
/// told at once, not when the (far) deadline passes.
#[test]
fn a_renewal_task_that_dies_with_its_runtime_fires_lost() {
    let cluster = Cluster::start(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rl = cluster.patient_redlock();
    let guard = rt
        .block_on(
            rl.mutex("holder-shutdown")
                .guard(&LockOptions::new(Duration::from_secs(30))),
        )
        .unwrap();
    let handle = guard.handle();
    assert!(!handle.is_lost());
    drop(rt);
    assert!(
        handle.is_lost(),
        "the renewal task is gone with its runtime, yet the holder is told it holds the lock"
    );
    std::mem::forget(guard);
}

/// Reproduction from the issue: `max_hold(Duration::MAX)` made the renewal task
/// panic (`Instant + Duration` overflow), and nobody was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_of_duration_max_means_no_cap() {
    let cluster = Cluster::start(3);
    // Its subject is the cap, not a slow node: every renewal answered.
    let ttl = Duration::from_secs(3);
    let rl = redlock(&cluster, patient_node_timeout_for(ttl));
    let other = redlock(&cluster, patient_node_timeout_for(ttl));
    let key = "holder-max-hold";
    let guard = rl
        .mutex(key)
        .guard(&LockOptions::new(ttl).max_hold(Duration::MAX))
        .await
        .unwrap();
    // Two renewals (each about a third of the TTL apart).
    assert!(
        redlock_tests::util::eventually(timing::liveness(ttl), || guard.handle().extensions() >= 2)
            .await,
        "{} renewals with max_hold(MAX)",
        guard.handle().extensions()
    );
    assert!(
        !guard.is_lost(),
        "lost after two renewals with max_hold(MAX)"
    );
    assert!(matches!(
        other.mutex(key).try_acquire(ttl).await,
        Err(Error::Busy { .. })
    ));
    let released = guard.release().await.unwrap();
    assert!(
        released.deleted + released.report().pending_count() >= 2,
        "{released:?}"
    );
}

/// Every duration the API takes accepts `Duration::MAX` without panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_is_accepted_everywhere() {
    let cluster = Cluster::start(3);
    // Its subject is the inputs, not a slow node: every call answered.
    let node_timeout = patient_node_timeout_for(ms(500));
    let rl = redlock(&cluster, node_timeout);
    // A deadline past the end of time.
    let lock = rl
        .mutex("max-deadline")
        .acquire_with(ms(500), &RetryPolicy::deadline(Duration::MAX))
        .await
        .unwrap();
    // A busy lock and a retry delay past the end of time. Polling: no second
    // attempt.
    let retry = RetryPolicy::attempts(3)
        .with_delay(Duration::MAX)
        .with_jitter(Duration::MAX);
    let polling = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .wake_on_release(false)
        .build()
        .unwrap();
    let started = Instant::now();
    assert!(matches!(
        polling
            .mutex("max-deadline")
            .acquire_with(ms(500), &retry)
            .await,
        Err(Error::Busy { .. })
    ));
    // One attempt: its round and the release of what it took.
    assert!(started.elapsed() < timing::liveness(2 * node_timeout));
    // Woken by releases: the delay is only the safety-net poll, and the
    // holder's expiry (500 ms, never released) still wakes the waiter.
    let started = Instant::now();
    let next = rl
        .mutex("max-deadline")
        .acquire_with(ms(500), &retry)
        .await
        .unwrap();
    // The holder's 500 ms, then an attempt.
    assert!(started.elapsed() < timing::liveness(ms(500) + 2 * node_timeout));
    drop(lock);
    rl.unlock(next).await.unwrap();
    // The web adapters' wait mode.
    let policy = LockPolicy::default().wait(Duration::MAX);
    let held = request::acquire(Some(&rl), Some("max-wait".into()), &policy)
        .await
        .unwrap()
        .expect("locked");
    held.release().await;
    // A TTL bound lifted to the maximum: the node refuses the TTL, nothing panics.
    let unbounded = Redlock::builder()
        .urls(cluster.urls())
        .max_ttl(Duration::MAX)
        .fixed_drift(Duration::MAX)
        .build()
        .unwrap();
    assert!(
        unbounded
            .mutex("max-ttl")
            .try_acquire(Duration::MAX)
            .await
            .is_err()
    );
    assert!(
        unbounded
            .mutex("max-ttl")
            .guard(&LockOptions::new(Duration::MAX).loss_margin(Duration::MAX))
            .await
            .is_err()
    );
}

/// Issue item 1: an extend to a shorter TTL that fails still shortened the keys
/// on the nodes that applied it; the holder's validity must not stay longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shortening_extend_lowers_the_validity() {
    let cluster = Cluster::start(3);
    // The paused nodes time out whatever the node timeout: patient for the
    // shorter TTL, so that node 0 answers.
    let shorter = Duration::from_secs(3);
    let rl = redlock(&cluster, patient_node_timeout_for(shorter));
    let mut lock = rl
        .mutex("holder-shorten")
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(lock.remaining() > shorter);
    cluster.node(1).pause();
    cluster.node(2).pause();
    let result = rl.extend(&mut lock, shorter).await;
    cluster.node(1).resume();
    cluster.node(2).resume();
    assert!(matches!(result, Err(Error::NoQuorum { .. })), "{result:?}");
    // Node 0 applied `PEXPIRE 3000`: its key is gone within 3 s.
    assert!(
        lock.remaining() <= shorter,
        "the holder still counts on {:?} after keys were shortened to {shorter:?}",
        lock.remaining()
    );
}

/// Issue item 4: a release future dropped before it completes still releases.
// Current-thread: the connections cannot answer during the one poll.
#[tokio::test]
async fn a_dropped_unlock_future_still_releases_in_the_background() {
    let cluster = Cluster::start(3);
    let rl = cluster.patient_redlock();
    let key = "holder-cancel-unlock";
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    // Polled once, then dropped: a timeout around the release.
    let polled = rl.unlock(lock).now_or_never();
    assert!(polled.is_none(), "{polled:?}");
    // An async wait: the background release runs on this thread.
    assert!(
        redlock_tests::util::eventually(timing::settled(), || cluster.count_with_key(key) == 0)
            .await,
        "keys left after a cancelled unlock: {}",
        cluster.count_with_key(key)
    );
}

/// Issue item 6: keys live whole milliseconds; validity must not count the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_counts_only_the_whole_milliseconds_the_keys_live() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT)
        .drift_factor(0.0)
        .fixed_drift(Duration::ZERO)
        .build()
        .unwrap();
    // A TTL long enough that a loaded machine's first connects and the
    // release below fit in it: with 200 ms the test failed in CI.
    let lock = rl
        .mutex("holder-rounding")
        .try_acquire(ms(30_000) + Duration::from_micros(900))
        .await
        .unwrap();
    let granted = lock.valid_until() - lock.started_at();
    assert!(
        granted <= ms(30_000),
        "validity {granted:?} for keys set with PX 30000"
    );
    rl.unlock(lock).await.unwrap();
    // A sub-millisecond TTL floor would let an extend send `PEXPIRE 0`.
    let e = Redlock::builder()
        .urls(cluster.urls())
        .min_ttl(Duration::from_micros(500))
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
}

/// Issue item 7: near `max_hold`, a renewal shorter than the handle's `min_ttl`
/// was refused as `InvalidTtl` and turned into a false loss (and an early
/// release). It must stop renewing and keep the validity it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_below_min_ttl_stops_renewing_without_a_false_loss() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(patient_node_timeout_for(ms(2_000)))
        .min_ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let key = "holder-min-ttl";
    let guard = rl
        .mutex(key)
        .guard(
            // The margin the arithmetic below was made for (by default it is
            // the node timeout, patient here).
            &LockOptions::new(ms(2_000))
                .max_hold(ms(2_500))
                .loss_margin(ms(50)),
        )
        .await
        .unwrap();
    let handle = guard.handle();
    let started = Instant::now();
    let lost = tokio::time::timeout(timing::liveness(ms(2_500)), handle.lost())
        .await
        .map(|()| started.elapsed());
    let lost_after = lost.expect("the lock ends after max_hold");
    assert!(
        lost_after >= ms(2_200),
        "told lost after {lost_after:?}, long before the last validity ended"
    );
    assert!(handle.extensions() >= 1);
    drop(guard);
}

/// Issue item 8: the retry deadline also covers the release of the last failed
/// attempt. Node 0 is paused (every call to it takes the node timeout `T`),
/// node 1 is held by someone else, node 2 is free: each attempt fails after
/// one node timeout and its release takes another, `2T` in all. Attempts
/// start at 0, `3T` (after the first failure the waiter waits up to `T` for
/// its subscription, which the paused node never confirms) and `5T`. With the
/// release counted the last attempt starts by `D - 2T = 4.5T`, so the second
/// attempt is the last and the call ends near `5T`; without it, by `D - T`,
/// and the third attempt ends at `7T`, `T/2` past the deadline. Counted by
/// the attempts the free node saw, which a loaded machine can only make
/// fewer (each starts later), never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_deadline_counts_the_release_of_the_last_attempt() {
    let cluster = Cluster::start(3);
    let node_timeout = ms(200);
    let rl = redlock(&cluster, node_timeout);
    let key = "holder-deadline";
    cluster
        .node(1)
        .cmd(&["SET", key, "someone-else", "PX", "60000"]);
    cluster.node(0).pause();
    let deadline = node_timeout * 13 / 2;
    let retry = RetryPolicy::deadline(deadline)
        .with_delay(Duration::ZERO)
        .with_jitter(Duration::ZERO);
    let attempts = || type_calls(&cluster, 2);
    let before = attempts();
    let started = Instant::now();
    let result = rl
        .mutex(key)
        .acquire_with(Duration::from_secs(5), &retry)
        .await;
    let took = started.elapsed();
    cluster.node(0).resume();
    assert!(result.is_err(), "{result:?}");
    // A loaded machine only makes the attempts later, so fewer: a third
    // attempt (free node 2's count) is the release left uncounted.
    let made = attempts() - before;
    assert!(
        (1..=2).contains(&made),
        "{made} attempts within a deadline of {deadline:?} ({took:?})"
    );
    assert!(
        took <= timing::liveness(deadline),
        "lock_with took {took:?} for a deadline of {deadline:?}"
    );
}

/// How many acquire attempts `node` has run: each sends one `TYPE`, which
/// nothing else here does (`INFO commandstats`).
fn type_calls(cluster: &Cluster, node: usize) -> u64 {
    let info: String = cluster
        .node(node)
        .raw(&["INFO", "commandstats"])
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_type:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Issue item 10: fail-open must not run a request unlocked when a node said
/// another holder has the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_does_not_run_unlocked_when_another_holder_is_seen() {
    let cluster = Cluster::start(3);
    // The paused nodes time out whatever the node timeout; node 0's Busy
    // must be in (the subject is the decision, not a slow node).
    let rl = cluster.patient_redlock();
    let key = "redlock:holder-fail-open";
    cluster
        .node(0)
        .cmd(&["SET", key, "someone-else", "PX", "60000"]);
    // Paused, not killed: their calls time out, so every node's answer is in
    // when the attempt is decided.
    cluster.node(1).pause();
    cluster.node(2).pause();
    let policy = LockPolicy::default().fail_open();
    let outcome = request::acquire(Some(&rl), Some("holder-fail-open".into()), &policy).await;
    assert!(
        matches!(outcome, Err(Rejection::Busy { .. })),
        "fail-open with a holder seen: {:?}",
        outcome.map(|l| l.is_some())
    );
    // With no holder seen, fail-open still runs unlocked.
    let outcome = request::acquire(Some(&rl), Some("holder-fail-open-free".into()), &policy).await;
    assert!(
        matches!(outcome, Ok(None)),
        "{:?}",
        outcome.map(|l| l.is_some())
    );
    cluster.node(1).resume();
    cluster.node(2).resume();
}

/// A renewal that answers after the holder's deadline is of no use to the
/// holder: once told "lost", it stays lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_is_sticky() {
    let cluster = Cluster::start(3);
    let ttl = ms(300);
    let rl = redlock(&cluster, patient_node_timeout_for(ttl));
    let guard = rl
        .mutex("holder-sticky")
        .guard(&LockOptions::new(ttl))
        .await
        .unwrap();
    let handle = guard.handle();
    for n in cluster.nodes() {
        n.pause();
    }
    let was_lost = AtomicBool::new(false);
    tokio::time::timeout(timing::liveness(ttl), handle.lost())
        .await
        .unwrap();
    was_lost.store(handle.is_lost(), Ordering::SeqCst);
    for n in cluster.nodes() {
        n.resume();
    }
    tokio::time::sleep(ms(300)).await;
    assert!(was_lost.load(Ordering::SeqCst));
    assert!(handle.is_lost());
    assert_eq!(handle.remaining(), Duration::ZERO);
}
