//! Permit and share waiters woken by releases (issue 41): a waiter whose
//! poll is 10 s away is served within moments of the release that frees it,
//! and the same waiter with wake-ups off waits for its poll.

use std::time::{Duration, Instant};

use tracing::instrument::WithSubscriber;

use redlock_core::{Access, Error, Lock, Redlock, RetryPolicy};
use redlock_tests::{Cluster, timing};

use super::{lock_calls, ms};
use redlock_tests::util::LogCapture as Capture;

/// The permits of the semaphores here: a permit's attempt runs one script on
/// each node per permit slot.
const PERMITS: u64 = 2;

/// The slow poll's delay: only a wake-up serves a waiter before it.
const SLOW_POLL: Duration = Duration::from_secs(10);

/// Long enough that only a wake-up serves a waiter before its second poll.
fn slow_poll() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(30))
        .with_delay(SLOW_POLL)
        .with_jitter(Duration::ZERO)
}

/// No test here is about a slow node: every call must be answered.
fn handle(cluster: &Cluster, wake: bool) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .wake_on_release(wake)
        .build()
        .unwrap()
}

/// The waiters flag of lock key `key`: its tag (`{…}`, or the key itself
/// braced), then `:redlock-waiters`.
fn waiters_flag(key: &str) -> String {
    let tag = match key.strip_prefix('{').and_then(|rest| rest.find('}')) {
        Some(end) => key[..end + 2].to_owned(),
        None => format!("{{{key}}}"),
    };
    format!("{tag}:redlock-waiters")
}

/// When a waiter began and was served, when the last release began, and the
/// waiter's debug log (its attempts and wake-ups), shown when a test fails.
struct Served {
    began: Instant,
    released: Instant,
    served: Instant,
    log: Capture,
}

impl Served {
    /// How long after the last release the waiter was served.
    fn after_release(&self) -> Duration {
        self.served.saturating_duration_since(self.released)
    }

    /// Whether it was served before its first poll after a failed first
    /// attempt (`delay` after it began) could have served it.
    fn before_poll(&self, delay: Duration) -> bool {
        self.served < self.began + delay
    }

    /// What the waiter logged.
    fn log(&self) -> String {
        self.log.text()
    }
}

/// Starts `waiter`, waits until its first attempt has run on every node (it
/// fails: everything is held), releases `held` (from `holder`) one by one with
/// a pause between, and returns when it was served. `calls`: how many
/// scripts one attempt runs on each node (a permit's tries every slot, one
/// script each): the first attempt has run everywhere once each node counts
/// that many more, and only then may a release not be seen by it.
async fn served_after<F>(
    cluster: &Cluster,
    holder: &Redlock,
    held: Vec<Lock>,
    (wakes, calls): (bool, u64),
    waiter: F,
) -> Served
where
    F: Future<Output = Result<Lock, Error>> + Send + 'static,
{
    // The holder's acquires returned at quorum: their last answers land
    // first, so that they are not taken for the waiter's attempt.
    for lock in &held {
        assert_eq!(cluster.settled_count(lock.key(), 3).await, 3);
    }
    let before = lock_calls(cluster);
    let log = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("redlock_core=debug")
        .with_ansi(false)
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .finish();
    let began = Instant::now();
    let task = tokio::spawn(
        async move {
            let lock = waiter.await;
            (Instant::now(), lock)
        }
        .with_subscriber(subscriber),
    );
    let attempted = redlock_tests::util::eventually(timing::settled(), || {
        lock_calls(cluster)
            .iter()
            .zip(&before)
            .all(|(now, was)| *now >= was + calls)
    })
    .await;
    assert!(
        attempted,
        "the waiter's first attempt never reached every node: {before:?} then {:?}",
        lock_calls(cluster)
    );
    // A release announces itself only where a waiter's flag is: the waiter
    // subscribes after its first attempt, then flags the resource with its
    // next one. Released before that (a loaded machine), it is served only
    // at its poll, which is not this test's subject.
    // (`wakes`: the waiter's handle has wake-ups on; a poller flags nothing.)
    let flag = held
        .first()
        .filter(|_| wakes)
        .map(|l| waiters_flag(l.key()));
    if let Some(flag) = flag {
        let flagged = redlock_tests::util::eventually(timing::settled(), || {
            cluster.nodes().iter().all(|n| n.pttl(&flag) > 0)
        })
        .await;
        assert!(flagged, "the waiter never flagged {flag} on every node");
    }
    let mut released = Instant::now();
    for (i, lock) in held.into_iter().enumerate() {
        if i > 0 {
            // Part of the scenario: a pause between the releases.
            tokio::time::sleep(ms(300)).await;
        }
        assert!(!task.is_finished(), "served while it was still held");
        released = Instant::now();
        holder.unlock(lock).await.unwrap();
    }
    let (served, lock) = tokio::time::timeout(timing::liveness(Duration::from_secs(30)), task)
        .await
        .expect("the waiter hung")
        .unwrap();
    let _ = lock.expect("the waiter gave up");
    assert!(served >= released, "served before the release began");
    Served {
        began,
        released,
        served,
        log,
    }
}

/// Both permits held for 20 s: the waiter (another handle) is served when one
/// is released, not at its poll; with wake-ups off, at its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_released_wakes_its_waiter_long_before_its_poll() {
    let cluster = Cluster::start(3);
    let holder = handle(&cluster, true);
    let ttl = Duration::from_secs(20);
    // Both permits, the second taken once the first is on every node: it
    // returned at quorum, and its last `SET` could otherwise find the
    // second's key in its slot (refused there, it holds a bare quorum).
    let hold = |key: &'static str| {
        let holder = holder.clone();
        let cluster = &cluster;
        async move {
            let mut held = Vec::new();
            for _ in 0..PERMITS {
                let lock = holder
                    .semaphore(key, 2)
                    .unwrap()
                    .try_acquire(ttl)
                    .await
                    .unwrap();
                assert_eq!(cluster.settled_count(lock.key(), 3).await, 3);
                held.push(lock);
            }
            held
        }
    };

    let waiter = handle(&cluster, true);
    let mut held = hold("wake:permits").await;
    let _kept = held.pop();
    let woken = served_after(&cluster, &holder, held, (true, PERMITS), async move {
        waiter
            .semaphore("wake:permits", 2)?
            .acquire_with(ttl, &slow_poll())
            .await
    })
    .await;
    println!(
        "permit waiter served {:?} after the release; its log:\n{}",
        woken.after_release(),
        woken.log()
    );
    assert!(
        woken.before_poll(SLOW_POLL),
        "served {:?} after the release, at its poll; the waiter's log:\n{}",
        woken.after_release(),
        woken.log()
    );

    // The control: the same wait, polling every 1.5 s.
    let polling = handle(&cluster, false);
    let mut held = hold("wake:polled").await;
    let _kept = held.pop();
    let poll = ms(1500);
    let retry = RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(poll)
        .with_jitter(Duration::ZERO);
    let polled = served_after(&cluster, &holder, held, (false, PERMITS), async move {
        polling
            .semaphore("wake:polled", 2)?
            .acquire_with(ttl, &retry)
            .await
    })
    .await;
    println!(
        "polling permit waiter served {:?} after the release",
        polled.after_release()
    );
    // Its first attempt failed: only its poll, a delay later, serves it.
    assert!(
        !polled.before_poll(poll),
        "a polling waiter was served {:?} after the release, before its poll",
        polled.after_release()
    );
}

/// A writer waiting on two readers is served when the second leaves (the
/// first one's leave wakes it too, and it finds the second still there), and
/// a reader waiting on a writer when the writer leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reader_or_the_writer_leaving_wakes_the_waiting_side() {
    let cluster = Cluster::start(3);
    let holder = handle(&cluster, true);
    let ttl = Duration::from_secs(20);

    let readers = vec![
        holder
            .rw_lock("wake:rw", Access::Shared)
            .try_acquire(ttl)
            .await
            .unwrap(),
        holder
            .rw_lock("wake:rw", Access::Shared)
            .try_acquire(ttl)
            .await
            .unwrap(),
    ];
    let writer = handle(&cluster, true);
    let w = writer.clone();
    let woken = served_after(&cluster, &holder, readers, (true, 1), async move {
        w.rw_lock("wake:rw", Access::Exclusive)
            .acquire_with(ttl, &slow_poll())
            .await
    })
    .await;
    println!(
        "writer served {:?} after the last reader left",
        woken.after_release()
    );
    assert!(
        woken.before_poll(SLOW_POLL),
        "writer served {:?} after the last reader left, at its poll; its log:\n{}",
        woken.after_release(),
        woken.log()
    );

    let held = holder
        .rw_lock("wake:rw2", Access::Exclusive)
        .try_acquire(ttl)
        .await
        .unwrap();
    let woken = served_after(&cluster, &holder, vec![held], (true, 1), async move {
        writer
            .rw_lock("wake:rw2", Access::Shared)
            .acquire_with(ttl, &slow_poll())
            .await
    })
    .await;
    println!(
        "reader served {:?} after the writer left",
        woken.after_release()
    );
    assert!(
        woken.before_poll(SLOW_POLL),
        "reader served {:?} after the writer left, at its poll; its log:\n{}",
        woken.after_release(),
        woken.log()
    );

    // The control: a reader polling every 1.5 s waits for its poll.
    let polling = handle(&cluster, false);
    let held = holder
        .rw_lock("wake:rw3", Access::Exclusive)
        .try_acquire(ttl)
        .await
        .unwrap();
    let poll = ms(1500);
    let retry = RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(poll)
        .with_jitter(Duration::ZERO);
    let polled = served_after(&cluster, &holder, vec![held], (false, 1), async move {
        polling
            .rw_lock("wake:rw3", Access::Shared)
            .acquire_with(ttl, &retry)
            .await
    })
    .await;
    println!(
        "polling reader served {:?} after the writer left",
        polled.after_release()
    );
    // Its first attempt failed: only its poll, a delay later, serves it.
    assert!(
        !polled.before_poll(poll),
        "a polling reader was served {:?} after the writer left, before its poll",
        polled.after_release()
    );
}

/// Issue 48, item 3: a permit waiter must not be woken by its own clean-up.
/// An attempt walks the slots; on a slot where it took some nodes but not a
/// quorum it releases them, and that release was announced on the
/// resource's one channel, where the same waiter heard it as a release of
/// a node it had found busy on another slot: it tried again at once, over
/// and over. Slot 0 is held on nodes 0 and 1, slot 1 on nodes 1 and 2 (keys
/// set by hand, for longer than the wait): every attempt takes node 2 on
/// slot 0 and node 0 on slot 1, and releases both, until the keys expire
/// (2 s; a busy key that outlives the wait makes the waiter give up at
/// once). Nothing is released by anyone else meanwhile, so the waiter may
/// not try more often than its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_is_not_woken_by_its_own_clean_up() {
    let cluster = Cluster::start(3);
    let rl = handle(&cluster, true);
    let resource = "own-clean-up";
    let slot = |i: u32| format!("{{{resource}}}:redlock-permit:{i}");
    for (node, held) in [(0, 0), (1, 0), (1, 1), (2, 1)] {
        let () = cluster
            .node(node)
            .raw(&["SET", &slot(held), "someone-else", "PX", "2000"])
            .unwrap();
    }
    let held_for = Duration::from_secs(2);
    let wait = timing::liveness(held_for);
    let delay = Duration::from_millis(250);
    // Every attempt takes slot 1 on node 0 and deletes it again: node 0's
    // `DEL`s (run by the release scripts) count the attempts.
    let _: () = cluster.node(0).raw(&["CONFIG", "RESETSTAT"]).unwrap();
    let start = Instant::now();
    let result = rl
        .semaphore(resource, 2)
        .unwrap()
        .acquire_with(
            ms(5000),
            &RetryPolicy::deadline(wait)
                .with_delay(delay)
                .with_jitter(Duration::ZERO),
        )
        .await;
    let served = start.elapsed();
    assert!(result.is_ok(), "{result:?}");
    let stats: String = cluster.node(0).raw(&["INFO", "commandstats"]).unwrap();
    let attempts = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_del:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse::<u128>().unwrap());
    // Polling alone makes one attempt per delay until it is served; and
    // the first attempt, the one right after subscribing (a release between
    // the two is not missed), the one at the keys' expiry, the rounding of
    // the last delay, and one per node whose subscription is confirmed late
    // (a change wakes the waiter: 13 in 2 s on a loaded machine; 24 with
    // self-wakes on a quiet one).
    let bound = served.as_millis() / delay.as_millis() + 4 + cluster.len() as u128;
    assert!(
        attempts <= bound,
        "{attempts} attempts in {served:?} (at most {bound} by the delay of {delay:?}): \
         the waiter woke itself"
    );
}
