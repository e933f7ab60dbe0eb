//! Resharding under load: while one slot moves between masters of each
//! cluster (by hand: `SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE`,
//! `SETSLOT ... NODE`, as `redis-cli --cluster reshard` does), clients take,
//! renew and release the lock on a resource of that slot. The holders'
//! intervals, recorded on one clock, never overlap.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{LockOptions, RetryPolicy};
use redlock_tests::RedisClusters;

use crate::handle;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_taken_and_renewed_while_their_slot_moves_never_overlap() {
    let clusters = Arc::new(RedisClusters::start(3, 3, 0));
    let rl = handle(&clusters);
    let resource = "reshard:hot";
    let key = rl.key_for(resource);
    let slot = clusters.cluster(0).slot_of(key.as_bytes());
    let moves = std::thread::spawn({
        let clusters = Arc::clone(&clusters);
        move || {
            let mut moved = 0;
            // Each cluster's slot goes round its three masters, one half-moved
            // stretch of 150 ms per batch of keys.
            for round in 1..=3 {
                for c in clusters.clusters() {
                    c.move_slot(slot, round % 3, 1, || {
                        std::thread::sleep(Duration::from_millis(150));
                    });
                    moved += 1;
                }
            }
            moved
        }
    });
    let intervals: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let lost = Arc::new(Mutex::new(0_usize));
    let renewals = Arc::new(Mutex::new(0_u32));
    let until = Instant::now() + Duration::from_secs(8);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (rl, intervals, lost, renewals) = (
                rl.clone(),
                Arc::clone(&intervals),
                Arc::clone(&lost),
                Arc::clone(&renewals),
            );
            tokio::spawn(async move {
                // A TTL of 600 ms held 700 ms: every hold is renewed.
                let options =
                    LockOptions::new(Duration::from_millis(600)).retry(RetryPolicy::no_retry());
                while Instant::now() < until {
                    let Ok(guard) = rl.mutex(resource).guard(&options).await else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    let end = Instant::now();
                    let handle = guard.handle();
                    *renewals.lock().unwrap() += handle.extensions();
                    if guard.is_lost() {
                        *lost.lock().unwrap() += 1;
                    } else {
                        intervals.lock().unwrap().push((start, end));
                    }
                    let _ = guard.release().await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let moved = tokio::task::spawn_blocking(move || moves.join().unwrap())
        .await
        .unwrap();
    let mut held = intervals.lock().unwrap().clone();
    held.sort();
    // Sorted by start: a hold overlaps an earlier one when it starts before
    // the latest end so far.
    let mut latest_end: Option<Instant> = None;
    let mut overlaps = 0;
    for &(start, end) in &held {
        if latest_end.is_some_and(|e| start < e) {
            overlaps += 1;
        }
        latest_end = latest_end.max(Some(end));
    }
    eprintln!(
        "reshard: slot {slot} moved {moved} times; {} holds, {} renewals, {} lost, {overlaps} overlaps",
        held.len(),
        renewals.lock().unwrap(),
        lost.lock().unwrap()
    );
    assert_eq!(moved, 9);
    assert_eq!(overlaps, 0, "{held:?}");
    assert!(held.len() >= 3, "too few holds: {}", held.len());
}
