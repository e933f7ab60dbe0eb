//! Once per tick: five replicas, each with its own handle (own connections,
//! own local queue), fire every tick at a random offset of up to 500 ms.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redlock_core::{JobOptions, LockOptions, Redlock};
use redlock_tests::Cluster;

const REPLICAS: usize = 5;
const TICKS: usize = 6;
const PERIOD: Duration = Duration::from_millis(2000);
const SKEW: Duration = Duration::from_millis(500);

/// Runs `TICKS` ticks of `job` on `REPLICAS` replicas and returns how many
/// times the job ran in each tick.
async fn ticks(cluster: &Cluster, job: &str, options: JobOptions) -> Vec<usize> {
    let runs: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(vec![0; TICKS]));
    let start = Instant::now() + Duration::from_millis(300);
    let mut tasks = Vec::new();
    for _ in 0..REPLICAS {
        let redlock = Redlock::from_urls(cluster.urls()).unwrap();
        let (runs, options, job) = (Arc::clone(&runs), options.clone(), job.to_owned());
        tasks.push(tokio::spawn(async move {
            for tick in 0..TICKS {
                let skew = SKEW.mul_f64(rand::rng().random_range(0.0..1.0));
                let fire = start + PERIOD * tick as u32 + skew;
                tokio::time::sleep_until(fire.into()).await;
                let ran = redlock
                    .run_job(&job, &options, |_lock| async {
                        // A short job: it ends long before the skew does.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    })
                    .await
                    .unwrap_or_else(|e| panic!("tick {tick}: {e}"));
                if ran.is_some() {
                    runs.lock().unwrap()[tick] += 1;
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(PERIOD * (TICKS as u32 + 5), t)
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
    println!("runs per tick with --at-least 1200ms: {runs:?}");
    assert_eq!(runs, vec![1; TICKS], "runs per tick");

    // Negative control: no minimum, the key goes with the 10 ms job, and a
    // replica firing later runs the same tick again.
    let without = JobOptions::new(Duration::from_secs(5));
    let runs = ticks(&cluster, "tick-job-control", without).await;
    println!("runs per tick without a minimum hold: {runs:?}");
    assert!(
        runs.iter().sum::<usize>() > TICKS,
        "the control should run some tick more than once: {runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_end_keeps_the_key_for_the_rest_of_the_minimum() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::from_urls(cluster.urls()).unwrap();
    let key = redlock.key_for("at-least");
    let guard = redlock
        .lock_guard("at-least", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let taken = Instant::now();
    let ended = guard
        .release_at_least(Duration::from_millis(1500))
        .await
        .unwrap();
    assert!(
        matches!(ended, redlock_core::Ended::Kept { nodes: 3, .. }),
        "{ended:?}"
    );
    for n in cluster.nodes() {
        let pttl = n.pttl(&key);
        assert!(
            (1..=1501).contains(&pttl),
            "PTTL {pttl} ms after {:?}",
            taken.elapsed()
        );
    }
    // Busy until the minimum has passed, then free without a release.
    assert!(
        redlock
            .try_lock("at-least", Duration::from_secs(1))
            .await
            .is_err()
    );
    let freed = redlock_tests::util::eventually(Duration::from_secs(3), || {
        cluster.count_with_key(&key) == 0
    })
    .await;
    assert!(freed, "the key outlived its minimum");
    assert!(
        taken.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        taken.elapsed()
    );

    // Past the minimum, the end is a release.
    let guard = redlock
        .lock_guard("at-least", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let ended = guard.release_at_least(Duration::ZERO).await.unwrap();
    assert!(
        matches!(ended, redlock_core::Ended::Released(_)),
        "{ended:?}"
    );
    assert_eq!(cluster.count_with_key(&key), 0);
}
