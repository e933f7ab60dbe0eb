//! Permit and share waiters woken by releases (issue 41): a waiter whose
//! poll is 10 s away is served within moments of the release that frees it,
//! and the same waiter with wake-ups off waits for its poll.

use std::time::{Duration, Instant};

use redlock_core::{Access, Error, Lock, Redlock, RetryPolicy};
use redlock_tests::Cluster;

use super::ms;

/// Well under the waiters' poll, well over a loaded machine's round trips.
const SOON: Duration = Duration::from_secs(2);

/// Long enough that only a wake-up serves a waiter before it.
fn slow_poll() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(30))
        .with_delay(Duration::from_secs(10))
        .with_jitter(Duration::ZERO)
}

fn handle(cluster: &Cluster, wake: bool) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(ms(500))
        .wake_on_release(wake)
        .build()
        .unwrap()
}

/// Starts `waiter`, checks that it is still waiting once it has had time to
/// fail and go to sleep, releases `held` (from `holder`) one by one with a
/// pause between, and returns how long after the last release the waiter was
/// served.
async fn served_after<F>(holder: &Redlock, held: Vec<Lock>, waiter: F) -> Duration
where
    F: Future<Output = Result<Lock, Error>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        let lock = waiter.await;
        (Instant::now(), lock)
    });
    let mut released = Instant::now();
    for lock in held {
        tokio::time::sleep(ms(300)).await;
        assert!(!task.is_finished(), "served while it was still held");
        holder.unlock(lock).await.unwrap();
        released = Instant::now();
    }
    let (served, lock) = tokio::time::timeout(Duration::from_secs(40), task)
        .await
        .expect("the waiter hung")
        .unwrap();
    let _ = lock.expect("the waiter gave up");
    served.saturating_duration_since(released)
}

/// Both permits held for 20 s: the waiter (another handle) is served when one
/// is released, not at its poll; with wake-ups off, at its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_released_wakes_its_waiter_long_before_its_poll() {
    let cluster = Cluster::start(3);
    let holder = handle(&cluster, true);
    let ttl = Duration::from_secs(20);
    let hold = |key: &'static str| {
        let holder = holder.clone();
        async move {
            vec![
                holder.try_permit(key, 2, ttl).await.unwrap(),
                holder.try_permit(key, 2, ttl).await.unwrap(),
            ]
        }
    };

    let waiter = handle(&cluster, true);
    let mut held = hold("wake:permits").await;
    let _kept = held.pop();
    let woken = served_after(&holder, held, async move {
        waiter
            .permit_with("wake:permits", 2, ttl, &slow_poll())
            .await
    })
    .await;
    println!("permit waiter served {woken:?} after the release");
    assert!(woken < SOON, "served {woken:?} after the release");

    // The control: the same wait, polling every 1.5 s.
    let polling = handle(&cluster, false);
    let mut held = hold("wake:polled").await;
    let _kept = held.pop();
    let retry = RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(ms(1500))
        .with_jitter(Duration::ZERO);
    let polled = served_after(&holder, held, async move {
        polling.permit_with("wake:polled", 2, ttl, &retry).await
    })
    .await;
    println!("polling permit waiter served {polled:?} after the release");
    assert!(
        polled > ms(900),
        "a polling waiter was served {polled:?} after the release"
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
            .try_rw_lock("wake:rw", Access::Shared, ttl)
            .await
            .unwrap(),
        holder
            .try_rw_lock("wake:rw", Access::Shared, ttl)
            .await
            .unwrap(),
    ];
    let writer = handle(&cluster, true);
    let w = writer.clone();
    let woken = served_after(&holder, readers, async move {
        w.rw_lock_with("wake:rw", Access::Exclusive, ttl, &slow_poll())
            .await
    })
    .await;
    println!("writer served {woken:?} after the last reader left");
    assert!(
        woken < SOON,
        "writer served {woken:?} after the last reader left"
    );

    let held = holder
        .try_rw_lock("wake:rw2", Access::Exclusive, ttl)
        .await
        .unwrap();
    let woken = served_after(&holder, vec![held], async move {
        writer
            .rw_lock_with("wake:rw2", Access::Shared, ttl, &slow_poll())
            .await
    })
    .await;
    println!("reader served {woken:?} after the writer left");
    assert!(
        woken < SOON,
        "reader served {woken:?} after the writer left"
    );

    // The control: a reader polling every 1.5 s waits for its poll.
    let polling = handle(&cluster, false);
    let held = holder
        .try_rw_lock("wake:rw3", Access::Exclusive, ttl)
        .await
        .unwrap();
    let retry = RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(ms(1500))
        .with_jitter(Duration::ZERO);
    let polled = served_after(&holder, vec![held], async move {
        polling
            .rw_lock_with("wake:rw3", Access::Shared, ttl, &retry)
            .await
    })
    .await;
    println!("polling reader served {polled:?} after the writer left");
    assert!(
        polled > ms(900),
        "a polling reader was served {polled:?} after the writer left"
    );
}
