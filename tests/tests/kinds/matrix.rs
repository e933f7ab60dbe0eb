//! The combination matrix of issue 47 through the core API (the web
//! adapters' is `web_matrix.rs`): each primitive (the mutex on one resource
//! and on a set, a semaphore of 2, a read/write lock's readers and writers
//! together) × fencing (off, Hybrid, Durable) × how a holder ends (release,
//! drop of the guard, cancellation of the work, a panic in the work). Each
//! case runs three contenders on real nodes and is judged from the intervals
//! they recorded (not from anything the library counts):
//!
//! - **exclusion:** at most one holder at once of a mutex (of any key of a
//!   set), at most two of the semaphore, no writer beside anyone;
//! - **order:** with fencing, the tokens of the exclusive holders grow in
//!   the order they held;
//! - **hygiene:** every key the library wrote has an expiry, and once the
//!   lock TTL has passed only the fence counters (which outlive the locks
//!   by design, each with its own expiry here) are left.
//!
//! The combinations with no primitive behind them (a set of resources with
//! permits or a shared side) are refused when the value is made, with
//! nothing written.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{
    Access, Error, FencingMode, Kind, LockOptions, Primitive, Redlock, RetryPolicy,
};
use redlock_tests::{Cluster, timing};

use super::without_expiry;

/// How a holder ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Release,
    Drop,
    Cancel,
    Panic,
}

const ENDINGS: [Ending; 4] = [Ending::Release, Ending::Drop, Ending::Cancel, Ending::Panic];

/// What a case takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    MutexOne,
    MutexSet,
    Permits2,
    ReadWrite,
}

pub(super) const SHAPES: [Shape; 4] = [
    Shape::MutexOne,
    Shape::MutexSet,
    Shape::Permits2,
    Shape::ReadWrite,
];

/// A section a contender ran while it held: when, whether it was
/// exclusive, and its fencing token for each resource.
#[derive(Debug, Clone)]
pub(super) struct Section {
    pub(super) enter: Instant,
    pub(super) exit: Instant,
    pub(super) exclusive: bool,
    pub(super) tokens: Tokens,
}

/// Fencing tokens, per resource.
pub(super) type Tokens = Vec<(String, u64)>;

/// A holder's fencing tokens, per resource.
pub(super) fn tokens(handle: &redlock_core::LockHandle) -> Tokens {
    handle
        .fencing_tokens()
        .into_iter()
        .map(|(r, t)| (r.to_owned(), t.get()))
        .collect()
}

/// The lock TTL of every case: three patient node timeouts (the loss margin
/// is one), long enough that no renewal is starved on a
/// loaded machine (the subject is the combination, not a slow node).
pub(super) const TTL: Duration = Duration::from_secs(6);
/// How long each holder works.
pub(super) const WORK: Duration = Duration::from_millis(15);
/// Sections per contender.
pub(super) const ROUNDS: usize = 3;
/// Contenders per case.
pub(super) const CONTENDERS: usize = 3;

pub(super) fn handle(cluster: &Cluster, fencing: Option<FencingMode>) -> Redlock {
    let builder = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT);
    match fencing {
        Some(mode) => builder.fencing(mode),
        None => builder,
    }
    .build()
    .unwrap()
}

/// The primitive contender `c` of a case takes, on resources named after
/// `case`.
fn primitive(rl: &Redlock, shape: Shape, case: &str, c: usize) -> Primitive {
    match shape {
        Shape::MutexOne => rl.mutex(format!("{case}/r")),
        // Every two of {a, b}, {b, c}, {a, c} share a resource.
        Shape::MutexSet => {
            let names = ["a", "b", "c"];
            rl.mutex_many([
                format!("{case}/{}", names[c % 3]),
                format!("{case}/{}", names[(c + 1) % 3]),
            ])
            .unwrap()
        }
        Shape::Permits2 => rl.semaphore(format!("{case}/r"), 2).unwrap(),
        // Contender 0 writes, the others read.
        Shape::ReadWrite => rl.rw_lock(
            format!("{case}/r"),
            if c == 0 {
                Access::Exclusive
            } else {
                Access::Shared
            },
        ),
    }
}

/// One section under `p`, ended by `ending`; records it in `log`.
async fn hold(
    p: &Primitive,
    options: &LockOptions,
    ending: Ending,
    log: &Arc<Mutex<Vec<Section>>>,
) {
    let exclusive = matches!(p.kind(), Kind::Mutex | Kind::Write);
    let record = |enter: Instant, tokens: Tokens| {
        log.lock().unwrap().push(Section {
            enter,
            exit: Instant::now(),
            exclusive,
            tokens,
        });
    };
    match ending {
        Ending::Release | Ending::Drop => {
            let guard = p.guard(options).await.unwrap();
            let (enter, held) = (Instant::now(), tokens(&guard.handle()));
            tokio::time::sleep(WORK).await;
            assert!(!guard.is_lost(), "{:?}: lost while held", p.kind());
            record(enter, held);
            if ending == Ending::Release {
                guard.release().await.unwrap();
            } else {
                drop(guard);
            }
        }
        Ending::Cancel => {
            // The work is dropped half way: its section ends no sooner than
            // the timeout, and the lock is released after that.
            let entered: Arc<Mutex<Option<(Instant, Tokens)>>> = Arc::default();
            let seen = Arc::clone(&entered);
            let work = p.run(options, move |handle| async move {
                *seen.lock().unwrap() = Some((Instant::now(), tokens(&handle)));
                tokio::time::sleep(Duration::from_secs(3600)).await;
            });
            // Long enough to be inside the work on a loaded machine: the
            // acquire is not cut short (it would hold nothing).
            let until_inside = async {
                loop {
                    if entered.lock().unwrap().is_some() {
                        tokio::time::sleep(WORK).await;
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            };
            tokio::select! {
                _ = work => panic!("the work ended by itself"),
                () = until_inside => {}
            }
            let (enter, held) = entered.lock().unwrap().take().expect("inside the work");
            record(enter, held);
        }
        Ending::Panic => {
            let (p, options, log) = (p.clone(), options.clone(), Arc::clone(log));
            let task = tokio::spawn(async move {
                p.run(&options, move |handle| async move {
                    let (enter, held) = (Instant::now(), tokens(&handle));
                    tokio::time::sleep(WORK).await;
                    log.lock().unwrap().push(Section {
                        enter,
                        exit: Instant::now(),
                        exclusive,
                        tokens: held,
                    });
                    panic!("the work panics (on purpose)");
                })
                .await
            });
            assert!(task.await.unwrap_err().is_panic());
        }
    }
}

/// Judges one case's sections.
pub(super) fn judge(case: &str, shape: Shape, fencing: Option<FencingMode>, sections: &[Section]) {
    assert_eq!(
        sections.len(),
        CONTENDERS * ROUNDS,
        "{case}: every contender held every round"
    );
    let limit = match shape {
        Shape::Permits2 => 2,
        _ => 1,
    };
    for (i, a) in sections.iter().enumerate() {
        let beside = sections
            .iter()
            .enumerate()
            .filter(|&(j, b)| j != i && b.enter < a.exit && a.enter < b.exit)
            .map(|(_, b)| b)
            .collect::<Vec<_>>();
        match shape {
            Shape::ReadWrite => assert!(
                !a.exclusive || beside.is_empty(),
                "{case}: a writer beside {} other holders",
                beside.len()
            ),
            _ => {
                // At the moment `a` began, how many others were inside.
                let at_enter = sections
                    .iter()
                    .enumerate()
                    .filter(|&(j, b)| j != i && b.enter <= a.enter && a.enter < b.exit)
                    .count();
                assert!(
                    at_enter < limit,
                    "{case}: {} holders at once (limit {limit})",
                    at_enter + 1
                );
            }
        }
    }
    // Per resource, the exclusive holders' tokens for it grow in the order
    // they held (a set's holder has a token per resource).
    if fencing.is_some() && shape != Shape::Permits2 {
        let mut exclusive: Vec<&Section> = sections.iter().filter(|s| s.exclusive).collect();
        exclusive.sort_by_key(|s| s.enter);
        let mut resources: Vec<&str> = exclusive
            .iter()
            .flat_map(|s| s.tokens.iter().map(|(r, _)| r.as_str()))
            .collect();
        resources.sort_unstable();
        resources.dedup();
        assert!(
            exclusive.iter().all(|s| !s.tokens.is_empty()),
            "{case}: an exclusive holder without a token"
        );
        for resource in resources {
            let of: Vec<u64> = exclusive
                .iter()
                .filter_map(|s| {
                    s.tokens
                        .iter()
                        .find(|(r, _)| r == resource)
                        .map(|&(_, t)| t)
                })
                .collect();
            assert!(
                of.windows(2).all(|w| w[0] < w[1]),
                "{case}: tokens for {resource} not growing in the order held: {of:?}"
            );
        }
    }
}

async fn run_cases(fencing: Option<FencingMode>, tag: &str) {
    let cluster = Cluster::start(3);
    let rl = handle(&cluster, fencing);
    // Every contender must hold every round: each waits as long as the
    // settings under test may make it (the default policy's 1.5 s ran out on
    // a loaded machine), not the default.
    let options = LockOptions::new(TTL)
        .fence_retention(Duration::from_secs(600))
        .retry(RetryPolicy::deadline(wait()));
    let mut cases = Vec::new();
    for shape in SHAPES {
        for ending in ENDINGS {
            let case = format!("{tag}/{shape:?}/{ending:?}");
            let log: Arc<Mutex<Vec<Section>>> = Arc::default();
            let contenders: Vec<_> = (0..CONTENDERS)
                .map(|c| {
                    let p = primitive(&rl, shape, &case, c);
                    let (options, log) = (options.clone(), Arc::clone(&log));
                    async move {
                        for _ in 0..ROUNDS {
                            hold(&p, &options, ending, &log).await;
                        }
                    }
                })
                .collect();
            cases.push(async move {
                futures_util::future::join_all(contenders).await;
                let sections = log.lock().unwrap().clone();
                std::panic::catch_unwind(|| judge(&case, shape, fencing, &sections))
                    .err()
                    .map(|e| {
                        e.downcast_ref::<String>()
                            .cloned()
                            .unwrap_or_else(|| format!("{case}: failed"))
                    })
            });
        }
    }
    all_passed(cases).await;

    assert_hygiene(&cluster, tag);
}

/// How long a contender of the core matrix may wait for its turn: as long
/// as the settings under test may make it, on a loaded machine.
fn wait() -> Duration {
    timing::liveness(TTL)
}

/// The longest a waiters flag of these cases may live: a waiter's whole
/// wait, a TTL, three node timeouts and a second (the library's
/// `flag_ttl`). Flags outlive the locks by design, as fence counters do.
fn flag_bound() -> Duration {
    wait() + TTL + timing::PATIENT_NODE_TIMEOUT * 3 + Duration::from_secs(1)
}

/// Hygiene, once every holder of `cluster` has ended: every key has an
/// expiry now, and once the TTL has passed only fence counters and waiters
/// flags are left, each with its own expiry, the flags' within their
/// bound.
pub(super) fn assert_hygiene(cluster: &Cluster, tag: &str) {
    assert_eq!(
        without_expiry(cluster),
        Vec::<String>::new(),
        "{tag}: keys without an expiry"
    );
    let flag = |k: &[u8]| k.ends_with(redlock_core::__WAITERS_SUFFIX.as_bytes());
    let only_counters = cluster.wait_until(timing::liveness(TTL), |c| {
        c.nodes().iter().all(|n| {
            super::raw_keys(n)
                .iter()
                .all(|k| k.first() == Some(&0xff) || flag(k))
        })
    });
    assert!(
        only_counters,
        "{tag}: keys left after the TTL: {:?}",
        super::all_keys(cluster)
    );
    for n in cluster.nodes() {
        for k in super::raw_keys(n).into_iter().filter(|k| flag(k)) {
            let pttl: i64 = n.raw_bytes(&[b"PTTL", &k]).unwrap();
            assert!(
                u128::try_from(pttl).is_ok_and(|p| p <= flag_bound().as_millis()),
                "{tag}: waiters flag {} lives {pttl} ms, beyond {:?}",
                String::from_utf8_lossy(&k),
                flag_bound()
            );
        }
    }
    assert_eq!(
        without_expiry(cluster),
        Vec::<String>::new(),
        "{tag}: fence counters without an expiry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_and_ending_without_fencing() {
    run_cases(None, "plain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_and_ending_with_hybrid_fencing() {
    run_cases(Some(FencingMode::Hybrid), "hybrid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_and_ending_with_durable_fencing() {
    run_cases(Some(FencingMode::Durable), "durable").await;
}

/// A set of resources has no semaphore and no read/write lock: refused when
/// the value is made, with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_permits_or_a_shared_side_is_refused_when_made() {
    let cluster = Cluster::start(3);
    let rl = handle(&cluster, Some(FencingMode::Hybrid));
    for kind in [Kind::Permits(2), Kind::Read, Kind::Write] {
        let made = rl.primitive(["x/a", "x/b"], kind);
        assert!(
            matches!(made, Err(Error::InvalidConfig(ref m)) if m.contains("only the mutex")),
            "{kind:?}: {made:?}"
        );
    }
    // One resource of each kind is fine, and so is a set under the mutex.
    for kind in [Kind::Mutex, Kind::Permits(2), Kind::Read, Kind::Write] {
        assert_eq!(rl.primitive(["x/a"], kind).unwrap().kind(), kind);
    }
    assert_eq!(
        rl.primitive(["x/a", "x/b"], Kind::Mutex)
            .unwrap()
            .resources(),
        ["x/a", "x/b"]
    );
    // Permits out of range are refused when made too.
    for n in [0, redlock_core::MAX_PERMITS + 1] {
        assert!(matches!(
            rl.semaphore("x/a", n),
            Err(Error::InvalidConfig(_))
        ));
    }
    assert_eq!(super::all_keys(&cluster), Vec::<String>::new());
}

/// Runs `cases` at once (each `Some(why)` when it failed) and fails with
/// every failed case's message.
pub(super) async fn all_passed<F>(cases: Vec<F>)
where
    F: std::future::Future<Output = Option<String>>,
{
    let failed: Vec<String> = futures_util::future::join_all(cases)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(
        failed.is_empty(),
        "{} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
