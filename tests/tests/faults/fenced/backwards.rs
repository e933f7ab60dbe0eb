//! The Hybrid assumption broken on purpose: a restart within the skew gives a smaller token, and the stalled write is accepted.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlock_core::fence::{Outcome, set_if_fresh};
use redlock_core::{FencingCheck, FencingMode, FencingToken, Redlock, RetryPolicy};
use redlock_tests::RedisNode;

use super::*;

pub(super) fn wall_us() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(d.as_micros()).unwrap()
}

/// What one pass of the broken-assumption scenario saw.
pub(super) struct Backwards {
    pub(super) t1: FencingToken,
    pub(super) t2: FencingToken,
    /// What the store did with holder 1's stalled write, after holder 2's.
    pub(super) late_write: Outcome,
    pub(super) down: Duration,
}

/// The Hybrid control's clocks: A far ahead, R (the one restarted) behind.
pub(super) const AHEAD_MS: i64 = 2500;
pub(super) const CONTROL_SKEW_MS: [i64; 3] = [AHEAD_MS, -30, 0];
pub(super) const A: usize = 0;
pub(super) const R: usize = 1;
pub(super) const C: usize = 2;

/// Holder 1 locks on A and R (C blackholed) and stalls; R restarts empty after
/// `down`; holder 2 locks on R and C (A blackholed) and writes; then holder 1's
/// stalled write arrives.
pub(super) async fn backwards(
    rig: &Rig,
    rl: &Redlock,
    store: &mut redis::aio::MultiplexedConnection,
    resource: &str,
    down: Duration,
) -> Backwards {
    let record = format!("{resource}:fence");
    let value = format!("{resource}:value");
    // Holder 1 needs A and R. A pass that came before healed A, which resets
    // the connections its blackhole held, and the handle's connection attempt
    // to A may be one of them: a call that joins that attempt gets its
    // "broken pipe". So the pass starts once every node answers again.
    let checks = every_node_answers(rl, Duration::from_secs(10)).await;
    eprintln!("{resource}: every node answered at check {checks}");
    rig.proxies[C].blackhole();
    let lock1 = rl
        .mutex(resource)
        .try_acquire(TTL)
        .await
        .expect("holder 1 locks on A and R while C is blackholed");
    let t1 = lock1.fencing_token().expect("a token");
    assert!(
        t1.get() > wall_us() + (AHEAD_MS as u64) * 1000 / 2,
        "holder 1's token {t1} should come from A's clock, {AHEAD_MS} ms ahead"
    );
    // Holder 1 stalls here: it neither writes nor releases.
    rig.proxies[C].heal();
    rig.proxies[A].blackhole();
    let killed = Instant::now();
    // This blocks the test's own thread only (it runs `block_on`): the proxies
    // and the handle's tasks run on the runtime's workers meanwhile.
    let node = rig.cluster.node(R);
    node.kill();
    std::thread::sleep(down);
    node.restart();
    let down = killed.elapsed();
    let retry = RetryPolicy::deadline(Duration::from_secs(2)).with_delay(Duration::from_millis(10));
    let lock2 = rl
        .mutex(resource)
        .acquire_with(TTL, &retry)
        .await
        .expect("holder 2 locks on R and C while A is blackholed");
    let t2 = lock2.fencing_token().expect("a token");
    for (key, v) in [("claim", t2.get()), (value.as_str(), 1)] {
        assert_eq!(
            set_if_fresh(store, &record, t2, key, v).await.unwrap(),
            Outcome::Applied,
            "holder 2 is the first to write"
        );
    }
    // Holder 1 wakes up and writes what it computed before holder 2 wrote.
    let late_write = set_if_fresh(store, &record, t1, &value, 100).await.unwrap();
    rig.proxies[A].heal();
    let _ = rl.unlock(lock2).await;
    drop(lock1);
    Backwards {
        t1,
        t2,
        late_write,
        down,
    }
}

/// Asks every node for `INFO` until all answer, at most for `limit`: the
/// number of the check that saw every node answer.
pub(super) async fn every_node_answers(rl: &Redlock, limit: Duration) -> u32 {
    let start = Instant::now();
    let mut check = 0;
    loop {
        check += 1;
        let infos = rl.check_nodes().await.expect("node infos");
        if infos.iter().all(|i| i.error.is_none()) {
            return check;
        }
        assert!(
            start.elapsed() < limit,
            "not every node answered within {limit:?}: {infos:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) fn delta_ms(b: &Backwards) -> f64 {
    (b.t2.get() as f64 - b.t1.get() as f64) / 1000.0
}

#[test]
pub(super) fn hybrid_tokens_go_backwards_when_a_node_restarts_within_the_skew() {
    if !redlock_tests::cluster::faketime_or_skip(
        "hybrid_tokens_go_backwards_when_a_node_restarts_within_the_skew",
    ) {
        return;
    }
    let _turn = crate::HEAVY.blocking_read();
    let rig = Rig::start(&CONTROL_SKEW_MS);
    let store = RedisNode::start();
    let (within, beyond) = rig.rt.block_on(async {
        let rl = Redlock::builder()
            .urls(rig.urls())
            .node_timeout(NODE_TIMEOUT)
            .fencing(FencingMode::Hybrid)
            .build()
            .unwrap();
        for info in rl.check_nodes().await.unwrap() {
            assert!(
                matches!(info.fencing, Some(FencingCheck::ClockBound { .. })),
                "a node without persistence is clock-bound in Hybrid mode: {info:?}"
            );
        }
        let mut conn = redis::Client::open(store.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        // Within the skew (past the TTL), then longer than the skew.
        let within = backwards(
            &rig,
            &rl,
            &mut conn,
            "ctl-within",
            Duration::from_millis(350),
        )
        .await;
        let beyond = backwards(
            &rig,
            &rl,
            &mut conn,
            "ctl-beyond",
            Duration::from_millis(3000),
        )
        .await;
        (within, beyond)
    });
    let seen = within.t2 <= within.t1 && within.late_write == Outcome::Applied;
    eprintln!(
        "fault-fenced mode=hybrid-restart-within-skew skew_ms={} within: down_ms={} t2-t1={:+.1}ms stalled_write={:?}; beyond: down_ms={} t2-t1={:+.1}ms stalled_write={:?} ({})",
        list(&CONTROL_SKEW_MS),
        within.down.as_millis(),
        delta_ms(&within),
        within.late_write,
        beyond.down.as_millis(),
        delta_ms(&beyond),
        beyond.late_write,
        if seen { "caught" } else { "NOT CAUGHT" },
    );
    assert!(
        within.down < Duration::from_millis(AHEAD_MS as u64),
        "the quick restart took longer than the skew: the scenario did not happen"
    );
    assert!(
        within.t2 <= within.t1,
        "negative control: a node restarted within the skew should hand out a token that is \
         not above the stalled holder's ({} then {})",
        within.t1,
        within.t2
    );
    assert_eq!(
        within.late_write,
        Outcome::Applied,
        "negative control: the stalled holder's write should slip past the fence"
    );
    assert!(
        beyond.down > Duration::from_millis(AHEAD_MS as u64),
        "the slow restart was shorter than the skew"
    );
    assert!(
        beyond.t2 > beyond.t1,
        "a node down longer than the skew must not hand out an older token ({} then {})",
        beyond.t1,
        beyond.t2
    );
    assert!(
        matches!(beyond.late_write, Outcome::Stale { last } if last == beyond.t2),
        "the stalled write must be refused when the restart waited out the skew"
    );
}
