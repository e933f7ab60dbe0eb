//! Once per tick: five replicas, each with its own handle (own connections,
//! own local queue), fire every tick at a random offset of up to 500 ms.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redlock_core::{JobOptions, LockOptions};
use redlock_tests::Cluster;
use redlock_tests::timing;

const REPLICAS: usize = 5;
const TICKS: usize = 6;
const PERIOD: Duration = Duration::from_millis(2000);
const SKEW: Duration = Duration::from_millis(500);

/// One call to `run_job` that ran the job: when the call began and returned.
#[derive(Debug, Clone, Copy)]
struct Run {
    called: Instant,
    returned: Instant,
}

/// Runs `TICKS` ticks of `job` on `REPLICAS` replicas and returns, per tick,
/// the calls that ran the job.
async fn ticks(cluster: &Cluster, job: &str, options: JobOptions) -> Vec<Vec<Run>> {
    let runs: Arc<Mutex<Vec<Vec<Run>>>> = Arc::new(Mutex::new(vec![Vec::new(); TICKS]));
    let start = Instant::now() + Duration::from_millis(300);
    let mut tasks = Vec::new();
    for _ in 0..REPLICAS {
        // The subject is the minimum hold, not a slow node: every call answered.
        let redlock = cluster.patient_redlock();
        let (runs, options, job) = (Arc::clone(&runs), options.clone(), job.to_owned());
        tasks.push(tokio::spawn(async move {
            for tick in 0..TICKS {
                let skew = SKEW.mul_f64(rand::rng().random_range(0.0..1.0));
                let fire = start + PERIOD * tick as u32 + skew;
                tokio::time::sleep_until(fire.into()).await;
                let called = Instant::now();
                let ran = redlock
                    .run_job(&job, &options, |_lock| async {
                        // A short job: it ends long before the skew does.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    })
                    .await
                    .unwrap_or_else(|e| panic!("tick {tick}: {e}"));
                if ran.is_some() {
                    let returned = Instant::now();
                    runs.lock().unwrap()[tick].push(Run { called, returned });
                }
            }
        }));
    }
    // Each replica's ticks take `TICKS` periods, and each call at most its
    // node timeout for the acquire and one for the hold's end.
    let allowed = PERIOD * TICKS as u32 + timing::PATIENT_NODE_TIMEOUT * 2 * TICKS as u32;
    for t in tasks {
        tokio::time::timeout(timing::liveness(allowed), t)
            .await
            .expect("the replicas finish their ticks")
            .unwrap();
    }
    runs.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_replicas_with_500ms_of_skew_run_each_tick_once() {
    let cluster = Cluster::start(3);
    let with_minimum =
        JobOptions::new(Duration::from_secs(5)).at_least(Duration::from_millis(1200));
    let runs = ticks(&cluster, "tick-job", with_minimum).await;
    let counts: Vec<usize> = runs.iter().map(Vec::len).collect();
    println!("runs per tick with --at-least 1200ms: {counts:?}");
    // Every tick ran. A second run in one tick is only allowed when its call
    // returned 1200 ms or more after the first run's call began (a replica the
    // scheduler woke that late): the key is held at least that long from
    // the first acquire, which began no earlier than its call. With the 500 ms
    // of skew and a prompt scheduler, that is one run per tick.
    for (tick, tick_runs) in runs.iter().enumerate() {
        assert!(!tick_runs.is_empty(), "tick {tick} did not run: {counts:?}");
        let mut by_call = tick_runs.clone();
        by_call.sort_by_key(|r| r.called);
        for pair in by_call.windows(2) {
            assert!(
                pair[1].returned >= pair[0].called + Duration::from_millis(1200),
                "tick {tick}: a second run inside the first one's minimum hold: {pair:?}"
            );
        }
        if by_call.len() > 1 {
            println!("tick {tick}: a replica woken late ran it again: {by_call:?}");
        }
    }

    // Negative control: no minimum, the key goes with the 10 ms job, and a
    // replica firing later runs the same tick again.
    let without = JobOptions::new(Duration::from_secs(5));
    let runs = ticks(&cluster, "tick-job-control", without).await;
    let counts: Vec<usize> = runs.iter().map(Vec::len).collect();
    println!("runs per tick without a minimum hold: {counts:?}");
    assert!(
        counts.iter().sum::<usize>() > TICKS,
        "the control should run some tick more than once: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_end_keeps_the_key_for_the_rest_of_the_minimum() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let key = redlock.key_for("at-least");
    let guard = redlock
        .mutex("at-least")
        .guard(&LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let called = Instant::now();
    let ended = guard
        .release_at_least(Duration::from_millis(1500))
        .await
        .unwrap();
    // The shortening was sent after `called` and reached each node before
    // this: a key may outlive the minimum by that transit (and the rounding
    // millisecond), as it is set to live `until - now` from the send.
    let transit = called.elapsed();
    // `Kept` waited for every node's answer: their PTTLs can be read now.
    let until = match ended {
        redlock_core::Ended::Kept { nodes: 3, until } => until,
        other => panic!("{other:?}"),
    };
    for n in cluster.nodes() {
        let before = Instant::now();
        let pttl = n.pttl(&key);
        let after = Instant::now();
        if pttl == -2 {
            // Gone: only allowed once the minimum had passed.
            assert!(after >= until, "the key went {:?} early", until - after);
            continue;
        }
        // Never longer than the minimum (plus the rounding millisecond), and
        // never past its end (and the transit): the key expires no earlier
        // than `before + pttl`.
        assert!((1..=1501).contains(&pttl), "PTTL {pttl} ms");
        assert!(
            before + Duration::from_millis(pttl as u64)
                <= until + transit + Duration::from_millis(2),
            "PTTL {pttl} ms outlives the minimum by {:?}",
            (before + Duration::from_millis(pttl as u64)) - until
        );
    }
    // Busy until the minimum has passed, then free without a release: a lock
    // taken now must have been taken (before it returned) after the minimum.
    let asked = Instant::now();
    match redlock
        .mutex("at-least")
        .try_acquire(Duration::from_secs(5))
        .await
    {
        Err(redlock_core::Error::Busy { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(lock) => {
            let returned = Instant::now();
            assert!(
                returned >= until,
                "taken {:?} before the minimum ended",
                until - returned
            );
            println!(
                "asked {:?} after the minimum ended",
                asked.saturating_duration_since(until)
            );
            redlock.unlock(lock).await.unwrap();
        }
    }
    let freed = redlock_tests::util::eventually(
        timing::liveness(until.saturating_duration_since(Instant::now())),
        || cluster.count_with_key(&key) == 0,
    )
    .await;
    assert!(freed, "the key outlived its minimum");
    assert!(
        Instant::now() >= until,
        "freed {:?} early",
        until - Instant::now()
    );

    // Past the minimum, the end is a release.
    let guard = redlock
        .mutex("at-least")
        .guard(&LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let ended = guard.release_at_least(Duration::ZERO).await.unwrap();
    assert!(
        matches!(ended, redlock_core::Ended::Released(_)),
        "{ended:?}"
    );
    assert_eq!(cluster.settled_count(&key, 0).await, 0);
}
