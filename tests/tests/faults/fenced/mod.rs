//! The fenced workload: holders that stall past their validity *between* their
//! check and their write (the case no client-side check can catch) write
//! through the fence, and the store refuses what is stale.
//!
//! Four client threads, each on its own current-thread runtime, increment a
//! counter in a separate store node: take the lock, claim the store record
//! with the token (`fence::set_if_fresh`, so the claim itself refuses older
//! holders), read the counter, sometimes stall the thread for two TTLs, write
//! the counter through the fence. Checked: no lost update (the counter equals
//! the writes the store accepted), no stale write accepted (two accepted writes
//! never carry the same value, which they would if one was computed from a
//! read another holder had already overwritten), tokens strictly increasing in
//! the order the holds began, and stale writes refused. Each workload has a
//! negative control: the same stalls and faults with plain writes (fencing off
//! at the store), which must lose updates.
//!
//! The workloads, one test each (they run beside each other, never beside the
//! fault suite: see [`crate::HEAVY`]):
//!
//! * **Durable**, with persistence: three lock nodes with `appendonly yes` +
//!   `appendfsync always` (`FencingMode::Durable`), one of them killed and
//!   restarted from its AOF again and again.
//! * **Hybrid**, without persistence: three lock nodes with `--save ""
//!   --appendonly no` (`FencingMode::Hybrid`), each running under libfaketime
//!   with its own constant wall-clock offset (0, +20 ms, −30 ms: up to 50 ms of
//!   skew between two nodes, checked with `TIME` at start and after every
//!   restart), each behind a [`FaultProxy`]. One node at a time is `kill -9`'d
//!   and restarted *empty* after 450 ms, longer than the skew (the Hybrid
//!   assumption) and the TTL (Redlock's), then gets a bounded proxy fault for
//!   350 ms: latency straddling the node timeout, a blackhole, or hold then
//!   flush of both directions; a TTL of quiet follows before the next node.
//! * **The Hybrid assumption, broken on purpose** (a deterministic negative
//!   control, not a workload): nodes A (+2.5 s), R (−30 ms), C (0). Holder 1
//!   locks on A and R while C is blackholed, so its token comes from A's clock
//!   and only A and R keep it; it then stalls without writing. R is killed and
//!   restarted empty after 350 ms (past the TTL, as Redlock wants, but *within*
//!   the skew), A is blackholed, and holder 2 locks on R and C, whose clocks are
//!   behind A's: its token is smaller than holder 1's, and holder 1's stalled
//!   write is *accepted* after holder 2's. The same steps with R down for 3 s
//!   (longer than the skew) give holder 2 the larger token, and the stalled
//!   write is refused.
//!
//! One summary line per test goes to stderr:
//! `fault-fenced mode=durable acquisitions=… stalls=… accepted=… refused_stale=… stale_accepted=0 lost_updates=0 token_order_violations=0 kills=… proxy_faults=0 control_lost_updates=… (caught)`,
//! the same with `mode=hybrid … proxy_faults=… proxy_dropped_chunks=… skew_ms=[0,20,-30] down_ms=450`
//! (the Hybrid run must also see ≥ 3 restarts, ≥ 3 proxy faults and chunks
//! dropped by a blackhole), and
//! `fault-fenced mode=hybrid-restart-within-skew … (caught)`.
//!
//! Clock emulation needs libfaketime (`apt-get install faketime`): on Linux,
//! without it the Hybrid tests fail with that command, they never skip; off
//! Linux they say they are skipped. It is preloaded
//! after glibc's `libc_malloc_debug.so.0`, since it cannot start inside a
//! jemalloc-linked `redis-server` on its own (see
//! [`redlock_tests::cluster::LIBC_MALLOC`]).
//!
//! Why the read is fenced too: a holder that stalls *before* the next holder
//! writes, and writes before it, is still newer than the last token the store
//! saw, so a write-only fence would accept it and the next holder would then
//! overwrite it from a stale read. Claiming the record before reading raises
//! the store's last token first, so the stalled write is refused.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::fence::{Outcome, set_if_fresh};
use redlock_core::{FencingMode, FencingToken, Redlock, RetryPolicy};
use redlock_tests::RedisNode;

mod backwards;
mod durable;
mod hybrid;
use hybrid::*;

const TTL: Duration = Duration::from_millis(300);
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const RESOURCE: &str = "fenced-counter";
const RECORD: &str = "fence-record";
const COUNTER: &str = "counter";

/// The Hybrid workload's clock offsets per node: up to 50 ms of skew.
const SKEW_MS: [i64; 3] = [0, 20, -30];
/// How long a killed Hybrid node stays down: longer than the skew and the TTL.
const HYBRID_DOWN: Duration = Duration::from_millis(450);
/// How long one proxy fault lasts.
const PROXY_FAULT: Duration = Duration::from_millis(350);

#[derive(Default)]
struct Tally {
    acquisitions: AtomicUsize,
    stalls: AtomicUsize,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    /// (when the hold began, its token), for the order check.
    holds: Mutex<Vec<(Instant, FencingToken)>>,
    /// The value of every write the store accepted.
    values: Mutex<Vec<u64>>,
}

/// One client thread: `rounds` lock-claim-read-(stall)-write rounds, bounded by
/// `until`. Every `stall_every`-th round stalls its thread between the read and
/// the write for two TTLs.
fn client(
    urls: Vec<String>,
    store: String,
    mode: FencingMode,
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
                .node_timeout(NODE_TIMEOUT)
                .fencing(mode)
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
                let Ok(lock) = rl.mutex(RESOURCE).acquire_with(TTL, &retry).await else {
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
                let applied = if fenced {
                    match set_if_fresh(&mut store, RECORD, token, COUNTER, next).await {
                        Ok(Outcome::Applied) => true,
                        Ok(_) => false,
                        Err(e) => panic!("store: {e}"),
                    }
                } else {
                    let _: () = redis::cmd("SET")
                        .arg(COUNTER)
                        .arg(next)
                        .query_async(&mut store)
                        .await
                        .unwrap();
                    true
                };
                if applied {
                    tally.accepted.fetch_add(1, Ordering::SeqCst);
                    tally.values.lock().unwrap().push(next);
                } else {
                    tally.refused.fetch_add(1, Ordering::SeqCst);
                }
                let _ = rl.unlock(lock).await;
            }
        });
    })
}

/// What one run of the workload left.
struct Run {
    tally: Arc<Tally>,
    counter: u64,
    kills: usize,
    proxy_faults: usize,
    /// Chunks the proxies' blackholes dropped: the faults met traffic.
    proxy_dropped: u64,
}

impl Run {
    fn acquisitions(&self) -> usize {
        self.tally.acquisitions.load(Ordering::SeqCst)
    }

    fn stalls(&self) -> usize {
        self.tally.stalls.load(Ordering::SeqCst)
    }

    fn accepted(&self) -> u64 {
        self.tally.accepted.load(Ordering::SeqCst) as u64
    }

    fn refused(&self) -> usize {
        self.tally.refused.load(Ordering::SeqCst)
    }

    /// Accepted writes the counter does not show.
    fn lost(&self) -> u64 {
        self.accepted().saturating_sub(self.counter)
    }

    /// Accepted writes whose value another accepted write already carried:
    /// each was computed from a read that was stale by the time it landed.
    fn stale_accepted(&self) -> usize {
        let values = self.tally.values.lock().unwrap();
        values.len() - values.iter().collect::<HashSet<_>>().len()
    }

    /// Holds whose token is not above the token of the hold that began just
    /// before.
    fn order_violations(&self) -> usize {
        let mut holds = self.tally.holds.lock().unwrap().clone();
        holds.sort_by_key(|(at, _)| *at);
        holds.windows(2).filter(|w| w[1].1 <= w[0].1).count()
    }
}

/// Starts the four clients against `urls`, bounded by `until`.
fn spawn_clients(
    urls: &[String],
    store: &RedisNode,
    mode: FencingMode,
    fenced: bool,
    until: Instant,
    tally: &Arc<Tally>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..4)
        .map(|i| {
            client(
                urls.to_vec(),
                store.url(),
                mode,
                fenced,
                5 + i,
                until,
                Arc::clone(tally),
            )
        })
        .collect()
}

fn join_clients(clients: Vec<std::thread::JoinHandle<()>>) {
    for c in clients {
        c.join().expect("a client thread panicked");
    }
}

fn counter_of(store: &RedisNode) -> u64 {
    let counter: Option<u64> = store.raw(&["GET", COUNTER]).unwrap();
    counter.unwrap_or(0)
}

/// `[0,20,-30]`: one word for the summary line.
fn list(ms: &[i64]) -> String {
    let items: Vec<String> = ms.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(","))
}

fn caught(control_lost: u64) -> &'static str {
    if control_lost > 0 {
        "caught"
    } else {
        "NOT CAUGHT"
    }
}

/// The assertions every fenced workload must pass, and its control must fail.
fn assert_fenced(run: &Run, control: &Run) {
    assert!(run.acquisitions() >= 20, "too few holds to judge");
    assert!(run.stalls() >= 2, "no stalls happened");
    assert_eq!(run.lost(), 0, "lost updates through the fence");
    assert_eq!(
        run.stale_accepted(),
        0,
        "the store accepted writes computed from stale reads"
    );
    assert_eq!(
        run.order_violations(),
        0,
        "tokens not increasing in hold order"
    );
    assert!(
        run.refused() >= 1,
        "the stalled writers were never refused: the scenario did not happen"
    );
    assert!(
        control.lost() > 0,
        "negative control: plain writes with the same stalls lost no update"
    );
}
