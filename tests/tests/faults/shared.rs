//! The semaphore and read/write-lock workloads under the seeded nemesis
//! (issue 41): one test, `shared_locks_under_faults`, on 3 real nodes behind
//! fault proxies (kills, pauses, proxy faults, clock jumps on the permit and
//! writer keys, holder stalls past the validity).
//!
//! * **Semaphore**: 4 clients take one of 2 permits of `sem` (manual permits
//!   and auto-extended guards), hold it a while, release.
//! * **Read/write**: 4 clients take `rw` shared (70%) or exclusive (30%).
//!
//! Each hold is recorded as the interval the holder was told it held
//! (`redlock_tests::history::shared`): from the acquire's return to the
//! earliest of its release and the end of its validity (`valid_until`, or a
//! guard's `valid_until − loss margin`, where `is_lost()` turns true). The
//! checker must see at most 2 holders of `sem` at any instant and no writer
//! meeting a reader or a writer of `rw`; as negative controls, the same
//! histories with a planted extra holder must be flagged. Each workload
//! prints one summary line (`fault-suite semaphore seed=…`,
//! `fault-suite rwlock seed=…`). `REDLOCK_SEED` replays the fault schedule.
//!
//! ```sh
//! cargo test -p redlock-tests --test faults shared -- --nocapture
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::{Access, LockOptions, Redlock, RetryPolicy};
use redlock_tests::history::shared::{Hold, HoldKind, check_permits, check_rw};
use redlock_tests::history::{HistoryLog, instant_ns};
use redlock_tests::nemesis::{Nemesis, NemesisConfig, Rig, StallTarget, meta, redlock_for};

const PERMITS: u32 = 2;
const TTL: Duration = Duration::from_millis(300);
const RUN_FOR: Duration = Duration::from_secs(15);
const SEM: &str = "sem";
const RW: &str = "rw";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn retry() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(1))
        .with_delay(ms(10))
        .with_jitter(ms(20))
}

/// What a client takes.
#[derive(Debug, Clone, Copy)]
enum Work {
    Permit,
    Rw,
}

type Holds = Arc<Mutex<Vec<Hold>>>;

/// Takes a pending stall request from the nemesis, if any.
fn take_stall(stalls: &AtomicU32) -> bool {
    stalls
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn rand_dur(rng: &mut StdRng, max: Duration) -> Duration {
    let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rng.random_range(0..=us))
}

/// One client: take, hold (a manual lock or a guard), release, until `until`.
async fn client(
    rl: Redlock,
    name: String,
    work: Work,
    until: Instant,
    seed: u64,
    stalls: Arc<AtomicU32>,
    holds: Holds,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        let access = if rng.random_bool(0.3) {
            Access::Exclusive
        } else {
            Access::Shared
        };
        let kind = match (work, access) {
            (Work::Permit, _) => HoldKind::Permit,
            (Work::Rw, Access::Shared) => HoldKind::Read,
            (Work::Rw, Access::Exclusive) => HoldKind::Write,
        };
        let stall = take_stall(&stalls);
        let hold = if rng.random_bool(0.3) {
            let options = LockOptions::new(TTL).retry(retry());
            let guard = match work {
                Work::Permit => rl.semaphore(SEM, PERMITS).unwrap().guard(&options).await,
                Work::Rw => rl.rw_lock(RW, access).guard(&options).await,
            };
            let Ok(guard) = guard else {
                tokio::time::sleep(rand_dur(&mut rng, ms(30))).await;
                continue;
            };
            let start = Instant::now();
            let h = guard.handle();
            let steps = if stall { 1 } else { rng.random_range(1..=4) };
            for _ in 0..steps {
                let pause = if stall {
                    TTL.mul_f64(1.5)
                } else {
                    rand_dur(&mut rng, TTL / 3)
                };
                tokio::time::sleep(pause).await;
                if h.is_lost() {
                    break;
                }
            }
            let told = h.valid_until().checked_sub(h.loss_margin());
            let end = told.map_or(start, |t| t.min(Instant::now()));
            let _ = guard.release().await;
            (start, end)
        } else {
            let lock = match work {
                Work::Permit => {
                    rl.semaphore(SEM, PERMITS)
                        .unwrap()
                        .acquire_with(TTL, &retry())
                        .await
                }
                Work::Rw => rl.rw_lock(RW, access).acquire_with(TTL, &retry()).await,
            };
            let Ok(lock) = lock else {
                tokio::time::sleep(rand_dur(&mut rng, ms(30))).await;
                continue;
            };
            let start = Instant::now();
            let pause = if stall {
                TTL.mul_f64(1.5)
            } else {
                rand_dur(&mut rng, TTL / 2)
            };
            tokio::time::sleep(pause).await;
            let end = lock.valid_until().min(Instant::now());
            let _ = rl.unlock(lock).await;
            (start, end)
        };
        holds.lock().expect("holds").push(Hold {
            client: name.clone(),
            kind,
            start: instant_ns(hold.0),
            end: instant_ns(hold.1),
        });
        tokio::time::sleep(rand_dur(&mut rng, ms(20))).await;
    }
}

fn seed() -> u64 {
    std::env::var("REDLOCK_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| rand::rng().random_range(1..1_000_000_000))
}

fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_locks_under_faults() {
    let _turn = crate::HEAVY.write().await;
    let seed = seed();
    println!("shared-lock workloads: seed {seed} (replay with REDLOCK_SEED={seed})");
    let log = HistoryLog::new();
    log.push(meta("shared-locks", seed, 3, false));
    let rig = Rig::start(3, &log).await;
    let stalls = Arc::new(AtomicU32::new(0));
    let (sem_holds, rw_holds): (Holds, Holds) = Default::default();
    let until = Instant::now() + RUN_FOR;
    let tasks: Vec<_> = (0..8u64)
        .map(|i| {
            let (work, holds) = if i < 4 {
                (Work::Permit, Arc::clone(&sem_holds))
            } else {
                (Work::Rw, Arc::clone(&rw_holds))
            };
            tokio::spawn(client(
                redlock_for(&rig.urls()),
                format!("s{i}"),
                work,
                until,
                seed.wrapping_mul(53).wrapping_add(i),
                Arc::clone(&stalls),
                holds,
            ))
        })
        .collect();
    let mut keys: Vec<String> = (0..PERMITS)
        .map(|s| format!("{{{SEM}}}:redlock-permit:{s}"))
        .collect();
    keys.push(RW.into());
    let mut nemesis = Nemesis::new(
        &rig,
        NemesisConfig {
            seed,
            ttl_max: TTL,
            keys,
            gap: (ms(100), ms(400)),
            stall: StallTarget::InProcess(Arc::clone(&stalls)),
            ttl_longest: TTL,
            holder_stalls: None,
        },
        log.clone(),
    );
    nemesis.run_until(until).await;
    nemesis.heal_all().await;
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("a client did not finish")
            .expect("client task");
    }
    let faults = log
        .snapshot()
        .iter()
        .filter(|e| matches!(e, redlock_tests::history::Event::Fault { .. }))
        .count();

    let sem = sem_holds.lock().expect("holds").clone();
    let v = check_permits(&sem, PERMITS as usize);
    let mut planted = sem.clone();
    if let Some(first) = sem.iter().find(|h| h.end > h.start) {
        planted.extend(std::iter::repeat_n(first.clone(), PERMITS as usize));
    }
    let sem_control = check_permits(&planted, PERMITS as usize).over_limit > 0;
    say(&format!(
        "fault-suite semaphore seed={seed} permits={PERMITS} faults={faults} acquisitions={} \
         max_holders={} over_limit={} negative_control_caught={sem_control}",
        v.holds, v.max_holders, v.over_limit
    ));

    let rw = rw_holds.lock().expect("holds").clone();
    let r = check_rw(&rw);
    let mut planted = rw.clone();
    if let Some(read) = rw
        .iter()
        .find(|h| h.kind == HoldKind::Read && h.end > h.start)
    {
        planted.push(Hold {
            kind: HoldKind::Write,
            client: "planted".into(),
            ..read.clone()
        });
    }
    let rw_control = !check_rw(&planted).overlaps.is_empty();
    say(&format!(
        "fault-suite rwlock seed={seed} faults={faults} reads={} writes={} max_readers={} \
         overlaps={} negative_control_caught={rw_control}",
        r.reads,
        r.writes,
        r.max_readers,
        r.overlaps.len()
    ));

    assert_eq!(
        v.over_limit, 0,
        "more than {PERMITS} holders of the semaphore (seed {seed})"
    );
    let described: Vec<String> = r
        .overlaps
        .iter()
        .take(5)
        .map(|&(a, b)| format!("{:?} meets {:?}", rw[a], rw[b]))
        .collect();
    assert!(
        r.overlaps.is_empty(),
        "writer overlaps (seed {seed}): {described:?}"
    );
    assert!(sem_control, "the permit checker missed a planted holder");
    assert!(rw_control, "the read/write checker missed a planted writer");
    // Coverage, not a property: each side ran under the faults.
    assert!(
        v.holds >= 10 && r.reads >= 5 && r.writes >= 2,
        "the workloads barely ran: permits={} reads={} writes={}",
        v.holds,
        r.reads,
        r.writes
    );
}
