//! The fenced workload: holders that stall past their validity *between* their
//! check and their write (the case no client-side check can catch) write
//! through the fence, and the store refuses what is stale.
//!
//! Three lock nodes with `appendonly yes` + `appendfsync always`
//! (`FencingMode::Durable`), one of them killed and restarted from its AOF
//! again and again; four client threads, each on its own current-thread
//! runtime, increment a counter in a separate store node: take the lock, claim
//! the store record with the token (`fence::set_if_fresh`, so the claim itself
//! refuses older holders), read the counter, sometimes stall the thread for two
//! TTLs, write the counter through the fence. Checked: no lost update (the
//! counter equals the writes the store accepted), tokens strictly increasing in
//! the order the holds began, and stale writes refused. The negative control
//! runs the same stalls with plain writes and must lose updates.
//!
//! One summary line goes to stderr:
//! `fault-fenced acquisitions=… stalls=… accepted=… refused_stale=… lost_updates=0 token_order_violations=0 kills=… control_lost_updates=… (caught)`.
//!
//! Why the read is fenced too: a holder that stalls *before* the next holder
//! writes, and writes before it, is still newer than the last token the store
//! saw, so a write-only fence would accept it and the next holder would then
//! overwrite it from a stale read. Claiming the record before reading raises
//! the store's last token first, so the stalled write is refused.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::fence::{Outcome, set_if_fresh};
use redlock_core::{FencingMode, FencingToken, Redlock, RetryPolicy};
use redlock_tests::{Cluster, RedisNode};

const TTL: Duration = Duration::from_millis(300);
const RESOURCE: &str = "fenced-counter";
const RECORD: &str = "fence-record";
const COUNTER: &str = "counter";

#[derive(Default)]
struct Tally {
    acquisitions: AtomicUsize,
    stalls: AtomicUsize,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    /// (when the hold began, its token), for the order check.
    holds: Mutex<Vec<(Instant, FencingToken)>>,
}

/// One client thread: `rounds` lock-claim-read-(stall)-write rounds, bounded by
/// `until`. Every `stall_every`-th round stalls its thread between the read and
/// the write for two TTLs.
fn client(
    urls: Vec<String>,
    store: String,
    fenced: bool,
    stall_every: usize,
    until: Instant,
    tally: Arc<Tally>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let rl = Redlock::builder()
                .urls(urls)
                .node_timeout(Duration::from_millis(50))
                .fencing(FencingMode::Durable)
                .build()
                .unwrap();
            let mut store = redis::Client::open(store)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let retry = RetryPolicy::deadline(Duration::from_secs(1))
                .with_delay(Duration::from_millis(5))
                .with_jitter(Duration::from_millis(10));
            let mut round = 0usize;
            while Instant::now() < until && round < 400 {
                round += 1;
                let Ok(lock) = rl.lock_with(RESOURCE, TTL, &retry).await else {
                    continue;
                };
                let Some(token) = lock.fencing_token() else {
                    panic!("a fencing handle gave no token");
                };
                tally.acquisitions.fetch_add(1, Ordering::SeqCst);
                tally.holds.lock().unwrap().push((Instant::now(), token));
                if fenced {
                    match set_if_fresh(&mut store, RECORD, token, "claim", token.get()).await {
                        Ok(Outcome::Applied) => {}
                        Ok(_) => {
                            tally.refused.fetch_add(1, Ordering::SeqCst);
                            drop(lock);
                            continue;
                        }
                        Err(e) => panic!("store: {e}"),
                    }
                }
                let value: Option<u64> = redis::cmd("GET")
                    .arg(COUNTER)
                    .query_async(&mut store)
                    .await
                    .unwrap();
                let next = value.unwrap_or(0) + 1;
                if round.is_multiple_of(stall_every) {
                    // A GC pause between the check and the write: the lock
                    // runs out and another client takes it meanwhile.
                    tally.stalls.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(TTL * 2);
                }
                if fenced {
                    match set_if_fresh(&mut store, RECORD, token, COUNTER, next).await {
                        Ok(Outcome::Applied) => tally.accepted.fetch_add(1, Ordering::SeqCst),
                        Ok(_) => tally.refused.fetch_add(1, Ordering::SeqCst),
                        Err(e) => panic!("store: {e}"),
                    };
                } else {
                    let _: () = redis::cmd("SET")
                        .arg(COUNTER)
                        .arg(next)
                        .query_async(&mut store)
                        .await
                        .unwrap();
                    tally.accepted.fetch_add(1, Ordering::SeqCst);
                }
                let _ = rl.unlock(lock).await;
            }
        });
    })
}

/// Runs the workload for `secs`, killing and restarting lock nodes from their
/// AOF when `kills` is set. Returns the tally, the final counter and the kills.
fn run(fenced: bool, secs: u64, kills: bool) -> (Arc<Tally>, u64, usize) {
    let cluster = Cluster::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"]);
    let store = RedisNode::start();
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(secs);
    let clients: Vec<_> = (0..4)
        .map(|i| {
            client(
                cluster.urls(),
                store.url(),
                fenced,
                5 + i,
                until,
                Arc::clone(&tally),
            )
        })
        .collect();
    let killed = Arc::new(AtomicU64::new(0));
    if kills {
        let mut n = 0usize;
        while Instant::now() + Duration::from_millis(900) < until && n < 12 {
            std::thread::sleep(Duration::from_millis(500));
            let node = cluster.node(n % 3);
            node.kill();
            std::thread::sleep(Duration::from_millis(350));
            node.restart();
            killed.fetch_add(1, Ordering::SeqCst);
            n += 1;
        }
    }
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    let counter: Option<u64> = store.raw(&["GET", COUNTER]).unwrap();
    (
        tally,
        counter.unwrap_or(0),
        killed.load(Ordering::SeqCst) as usize,
    )
}

/// Holds whose token is not above every token of a hold that began earlier.
fn order_violations(tally: &Tally) -> usize {
    let mut holds = tally.holds.lock().unwrap().clone();
    holds.sort_by_key(|(at, _)| *at);
    holds.windows(2).filter(|w| w[1].1 <= w[0].1).count()
}

#[test]
fn stalled_writers_are_refused_by_the_fence_and_no_update_is_lost() {
    let (tally, counter, kills) = run(true, 8, true);
    let accepted = tally.accepted.load(Ordering::SeqCst) as u64;
    let lost = accepted.saturating_sub(counter);
    let violations = order_violations(&tally);
    let (control, control_counter, _) = run(false, 4, false);
    let control_lost =
        (control.accepted.load(Ordering::SeqCst) as u64).saturating_sub(control_counter);
    eprintln!(
        "fault-fenced acquisitions={} stalls={} accepted={accepted} refused_stale={} lost_updates={lost} token_order_violations={violations} kills={kills} control_lost_updates={control_lost} ({})",
        tally.acquisitions.load(Ordering::SeqCst),
        tally.stalls.load(Ordering::SeqCst),
        tally.refused.load(Ordering::SeqCst),
        if control_lost > 0 {
            "caught"
        } else {
            "NOT CAUGHT"
        },
    );
    assert!(
        tally.acquisitions.load(Ordering::SeqCst) >= 20,
        "too few holds to judge"
    );
    assert!(
        tally.stalls.load(Ordering::SeqCst) >= 2,
        "no stalls happened"
    );
    assert_eq!(counter, accepted, "lost updates through the fence");
    assert_eq!(violations, 0, "tokens not increasing in hold order");
    assert!(
        tally.refused.load(Ordering::SeqCst) >= 1,
        "the stalled writers were never refused: the scenario did not happen"
    );
    assert!(
        control_lost > 0,
        "negative control: plain writes with the same stalls lost no update"
    );
}
