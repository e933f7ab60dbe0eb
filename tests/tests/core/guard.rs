//! Locks held over time on real `redis-server` processes: auto-extension keeps
//! other clients out past the TTL, a lost lock is signalled before its validity
//! ends (and `with_lock` drops the work), and dropping a `Lock` or `LockGuard`
//! without an explicit release still frees every node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Error, LockOptions, Redlock};
use redlock_tests::Cluster;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extension_holds_the_lock_past_its_ttl() {
    let cluster = Cluster::start(3);
    // Every renewal and every probe answered: the subject is the renewal,
    // not a slow node (the holder's node timeout a third of its TTL).
    let ttl = ms(2_000);
    let holder = redlock(
        &cluster,
        redlock_tests::timing::patient_node_timeout_for(ttl),
    );
    let other = cluster.patient_redlock();
    // The probe's own TTL is not the subject: above the patient node timeout.
    let probe_ttl = Duration::from_secs(10);
    let key = "guard-extend";
    let guard = holder
        .mutex(key)
        .guard(&LockOptions::new(ttl))
        .await
        .unwrap();
    let handle = guard.handle();
    let held_since = Instant::now();
    let mut polls = 0;
    // Poll every 50 ms for more than 3 TTLs (part of the scenario); bounded
    // by count and time.
    while held_since.elapsed() < 3 * ttl + ms(100) && polls < 1_000 {
        match other.mutex(key).try_acquire(probe_ttl).await {
            Err(Error::Busy { .. }) => {}
            other => panic!(
                "second client got {other:?} after {:?} while the guard held the lock",
                held_since.elapsed()
            ),
        }
        assert!(!guard.is_lost(), "lost after {:?}", held_since.elapsed());
        polls += 1;
        tokio::time::sleep(ms(50)).await;
    }
    assert!(held_since.elapsed() >= 3 * ttl);
    assert!(polls >= 5, "only {polls} polls");
    assert!(
        handle.extensions() >= 2,
        "{} renewals in three TTLs of {ttl:?}",
        handle.extensions()
    );
    assert!(cluster.count_holding(key, handle.token()) >= 2);
    let released = guard.release().await.unwrap();
    assert!(
        released.deleted + released.report().pending_count() >= 2,
        "{released:?}"
    );
    let lock = other
        .mutex(key)
        .try_acquire(probe_ttl)
        .await
        .expect("the lock is free right after release");
    other.unlock(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_is_signalled_before_its_validity_ends() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(200));
    let key = "guard-lost";
    let guard = rl
        .mutex(key)
        .guard(&LockOptions::new(Duration::from_secs(1)))
        .await
        .unwrap();
    let handle = guard.handle();
    let token = handle.token().to_owned();
    // Every node's SET has landed before two keys are deleted: a SET still in
    // flight to node 1 (slow on a loaded machine) would land after the DEL,
    // and nodes 1 and 2 would then hold the lock after all (lost() rightly
    // did not fire within 3 s in one run, with `>= 2` here).
    assert!(
        cluster.wait_until(redlock_tests::timing::settle(ms(200)), |c| c
            .count_holding(key, &token)
            == 3)
    );
    cluster.node(0).cmd(&["DEL", key]);
    cluster.node(1).cmd(&["DEL", key]);
    // Read after the deletes: a renewal that landed before them (a loaded
    // machine may be past the first renewal point by now) counts; none can
    // succeed after them.
    let deadline = handle.valid_until();
    // The bound only matters for a failing test: the assertion is on when.
    let lost = tokio::time::timeout(
        redlock_tests::timing::liveness(Duration::from_secs(1)),
        guard.lost(),
    )
    .await;
    let lost_at = Instant::now();
    assert!(lost.is_ok(), "lost() did not fire");
    assert!(
        lost_at < deadline,
        "lost fired {:?} after the old validity ended",
        lost_at - deadline
    );
    assert!(handle.is_lost());
    assert_eq!(handle.remaining(), Duration::ZERO);
    let _ = guard.release().await;
    // Nothing of ours is left on any node.
    assert!(
        cluster.wait_until(redlock_tests::timing::settle(ms(200)), |c| c
            .count_holding(key, &token)
            == 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_drops_the_work_when_the_lock_is_lost() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(200));
    let key = "with-lock-lost";
    let finished = Arc::new(AtomicBool::new(false));
    let (n0, n1) = (Arc::clone(cluster.node(0)), Arc::clone(cluster.node(1)));
    let t0 = Instant::now();
    // Lost before the 1 s validity ends; the bound only matters for a
    // failing test.
    let bound = redlock_tests::timing::liveness(Duration::from_secs(1));
    let result = tokio::time::timeout(
        bound,
        rl.mutex(key)
            .run(&LockOptions::new(Duration::from_secs(1)), {
                let finished = Arc::clone(&finished);
                move |handle| async move {
                    let (key, token) = (handle.key().to_owned(), handle.token().to_owned());
                    tokio::task::spawn_blocking(move || {
                        // The acquire returned at quorum: a SET still on its way
                        // would land after the DEL and keep the lock held.
                        let end = Instant::now() + redlock_tests::timing::settle(ms(200));
                        while [&n0, &n1]
                            .iter()
                            .any(|n| n.get(&key).as_deref() != Some(&token))
                            && Instant::now() < end
                        {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        n0.cmd(&["DEL", &key]);
                        n1.cmd(&["DEL", &key]);
                    })
                    .await
                    .unwrap();
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    finished.store(true, Ordering::SeqCst);
                }
            }),
    )
    .await
    .expect("with_lock did not return within its bound");
    let took = t0.elapsed();
    assert!(
        matches!(result, Err(Error::Lost { .. })),
        "expected Lost, got {result:?}"
    );
    // The work (10 s) was dropped: it never finished, now or later.
    assert!(took < bound, "took {took:?}");
    tokio::time::sleep(ms(200)).await;
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work ran on after the loss"
    );
    assert!(cluster.wait_until(
        redlock_tests::timing::settle(ms(200)),
        |c| c.count_with_key(key) == 0
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_lock_is_released_in_the_background() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(200));
    let key = "drop-lock";
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(redlock_tests::timing::settle(ms(200)), |c| c
            .count_holding(key, &token)
            >= 2)
    );
    drop(lock);
    assert!(
        cluster.wait_until(redlock_tests::timing::settle(ms(200)), |c| c
            .count_with_key(key)
            == 0),
        "a dropped 30 s lock still has keys"
    );
    // And the resource is free for the next holder.
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guard_is_released_in_the_background() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster, ms(200));
    let key = "drop-guard";
    let guard = rl
        .mutex(key)
        .guard(&LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let token = guard.handle().token().to_owned();
    assert!(
        cluster.wait_until(redlock_tests::timing::settle(ms(200)), |c| c
            .count_holding(key, &token)
            >= 2)
    );
    drop(guard);
    assert!(
        cluster.wait_until(redlock_tests::timing::settle(ms(200)), |c| c
            .count_with_key(key)
            == 0),
        "a dropped 30 s guard still has keys"
    );
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(30))
        .await
        .unwrap();
    rl.unlock(lock).await.unwrap();
}
