//! `Redlock::inspect_permits` and `Redlock::inspect_rw` on real nodes: what
//! each node holds and the verdict, after known acquires and releases.

use std::time::Duration;

use redlock_core::{
    Access, PermitsVerdict, Redlock, RwInspection, RwVerdict, Verdict, token_fingerprint,
};
use redlock_tests::{Cluster, timing};

use super::{ms, redlock};

/// Polls `inspect_rw(resource)` until `done` holds on it, or a read of node
/// state may take ([`timing::settled`]); returns the last inspection.
async fn inspect_rw_until(
    rl: &Redlock,
    resource: &str,
    done: fn(&RwInspection) -> bool,
) -> RwInspection {
    let began = std::time::Instant::now();
    loop {
        let seen = rl.inspect_rw(resource).await.unwrap();
        if done(&seen) || began.elapsed() > timing::settled() {
            return seen;
        }
        tokio::time::sleep(ms(20)).await;
    }
}

fn counted(held: u32, free: u32) -> impl Fn(&PermitsVerdict) -> bool {
    move |v| v.held == held && v.free == free && v.unclear == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspecting_permits_shows_each_slot_and_counts_the_held() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    let ttl = Duration::from_secs(20);
    let seen = rl.inspect_permits("insp:sem", 3).await.unwrap();
    assert!(counted(0, 3)(&seen.verdict), "{seen:?}");
    let asked = std::time::Instant::now();
    let a = rl
        .semaphore("insp:sem", 3)
        .unwrap()
        .try_acquire(ttl)
        .await
        .unwrap();
    let b = rl
        .semaphore("insp:sem", 3)
        .unwrap()
        .try_acquire(ttl)
        .await
        .unwrap();
    // An acquire returns at quorum: wait for the third node's `SET`.
    let began = std::time::Instant::now();
    let seen = loop {
        let seen = rl.inspect_permits("insp:sem", 3).await.unwrap();
        let everywhere = seen
            .slots
            .iter()
            .all(|s| matches!(s.verdict, Verdict::Free | Verdict::Held { nodes: 3, .. }));
        if everywhere || began.elapsed() > timing::settled() {
            break seen;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert!(counted(2, 1)(&seen.verdict), "{seen:?}");
    assert_eq!(seen.slots.len(), 3);
    for lock in [&a, &b] {
        let slot = seen
            .slots
            .iter()
            .find(|s| s.key == lock.key())
            .expect("the permit's slot is inspected");
        let fingerprint = token_fingerprint(lock.token());
        match &slot.verdict {
            Verdict::Held {
                holder,
                nodes,
                validity,
            } => {
                assert_eq!(holder, &fingerprint);
                assert_eq!(*nodes, 3);
                // No more than the TTL, and no less than what is left of it
                // since the acquire was asked for (less a second for drift).
                let left = ttl.saturating_sub(asked.elapsed() + Duration::from_secs(1));
                assert!(
                    *validity > left && *validity <= ttl,
                    "validity {validity:?}, at least {left:?} expected"
                );
            }
            other => panic!("slot {} is {other:?}", slot.key),
        }
        for n in &slot.nodes {
            let state = n.state.as_ref().unwrap();
            assert_eq!(state.holder.as_deref(), Some(fingerprint.as_str()));
            assert!(state.pttl.is_some_and(|p| p <= ttl));
        }
    }
    rl.unlock(a).await.unwrap();
    // An unlock returns at quorum: the last node's delete may be on its way.
    let began = std::time::Instant::now();
    let seen = loop {
        let seen = rl.inspect_permits("insp:sem", 3).await.unwrap();
        if counted(1, 2)(&seen.verdict) || began.elapsed() > timing::settled() {
            break seen;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert!(counted(1, 2)(&seen.verdict), "{seen:?}");
    rl.unlock(b).await.unwrap();
    assert!(rl.inspect_permits("insp:sem", 0).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspecting_a_rw_lock_shows_readers_a_waiting_writer_and_the_writer() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    let ttl = Duration::from_secs(20);
    let seen = rl.inspect_rw("insp:rw").await.unwrap();
    assert_eq!(seen.verdict, RwVerdict::Free, "{seen:?}");
    assert_eq!(seen.writer_waiting, 0);

    let r1 = rl
        .rw_lock("insp:rw", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    let r2 = rl
        .rw_lock("insp:rw", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    // The readers' keys are on every node once their last `SET`s land:
    // waited for before the writer comes, whose intent refuses a reader's
    // `SET` that lands after it (seen: one reader on a node).
    let on_every_node = |seen: &redlock_core::RwInspection| {
        seen.nodes
            .iter()
            .all(|n| n.state.as_ref().is_ok_and(|s| s.readers == 2))
    };
    let began = std::time::Instant::now();
    while !on_every_node(&rl.inspect_rw("insp:rw").await.unwrap()) {
        assert!(
            began.elapsed() <= timing::settled(),
            "the readers never reached every node"
        );
        tokio::time::sleep(ms(20)).await;
    }
    // A writer waiting on the readers leaves its intent on every node it
    // reaches (until it holds or gives up).
    let writer = tokio::spawn({
        let rl = rl.clone();
        async move {
            let retry = redlock_core::RetryPolicy::deadline(Duration::from_secs(20));
            rl.rw_lock("insp:rw", Access::Exclusive)
                .acquire_with(ttl, &retry)
                .await
        }
    });
    let began = std::time::Instant::now();
    let seen = loop {
        let seen = rl.inspect_rw("insp:rw").await.unwrap();
        let settled = seen.verdict
            == RwVerdict::Read {
                readers: 2,
                nodes: 3,
            }
            && seen.writer_waiting == 3;
        if settled || began.elapsed() > timing::settled() {
            break seen;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert_eq!(
        seen.verdict,
        RwVerdict::Read {
            readers: 2,
            nodes: 3
        },
        "{seen:?}"
    );
    assert_eq!(seen.writer_waiting, 3, "{seen:?}");
    for n in &seen.nodes {
        let s = n.state.as_ref().unwrap();
        assert_eq!(s.readers, 2);
        assert!(s.readers_pttl.is_some_and(|p| p <= ttl), "{s:?}");
        assert!(s.intent_pttl.is_some(), "{s:?}");
        assert!(!s.writer.exists);
    }
    assert!(!writer.is_finished(), "the writer held beside readers");
    rl.unlock(r1).await.unwrap();
    rl.unlock(r2).await.unwrap();

    let w = writer.await.unwrap().unwrap();
    let fingerprint = token_fingerprint(w.token());
    let began = std::time::Instant::now();
    let seen = loop {
        let seen = rl.inspect_rw("insp:rw").await.unwrap();
        if matches!(seen.verdict, RwVerdict::Written { nodes: 3, .. })
            || began.elapsed() > timing::settled()
        {
            break seen;
        }
        tokio::time::sleep(ms(20)).await;
    };
    match &seen.verdict {
        RwVerdict::Written { holder, nodes, .. } => {
            assert_eq!(holder, &fingerprint);
            assert_eq!(*nodes, 3);
        }
        other => panic!("{other:?}"),
    }
    rl.unlock(w).await.unwrap();
    let began = std::time::Instant::now();
    let seen = loop {
        let seen = rl.inspect_rw("insp:rw").await.unwrap();
        if seen.verdict == RwVerdict::Free || began.elapsed() > timing::settled() {
            break seen;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert_eq!(seen.verdict, RwVerdict::Free, "{seen:?}");
}

/// The turns in sight: a reader a writer refused, waiting to try again, is
/// marked on every node it reached (owed the next read phase); once it has
/// held, its mark and its place in the read phase are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspecting_a_rw_lock_shows_the_readers_a_writer_keeps_waiting() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    let ttl = Duration::from_secs(20);
    let writer = rl
        .rw_lock("insp:turns", Access::Exclusive)
        .try_acquire(ttl)
        .await
        .unwrap();
    let inspect_until = |done| inspect_rw_until(&rl, "insp:turns", done);
    let seen = inspect_until(|s| matches!(s.verdict, RwVerdict::Written { nodes: 3, .. })).await;
    assert!(
        matches!(seen.verdict, RwVerdict::Written { nodes: 3, .. }),
        "{seen:?}"
    );
    let reader = tokio::spawn({
        let rl = rl.clone();
        async move {
            // Far from both bounds: it waits for the writer's release.
            let retry = redlock_core::RetryPolicy::deadline(Duration::from_secs(60))
                .with_delay(Duration::from_secs(30));
            rl.rw_lock("insp:turns", Access::Shared)
                .acquire_with(ttl, &retry)
                .await
        }
    });
    let marked = |s: &redlock_core::RwInspection| {
        s.nodes
            .iter()
            .all(|n| n.state.as_ref().is_ok_and(|s| s.readers_waiting == 1))
    };
    let seen = inspect_until(marked).await;
    assert!(
        marked(&seen),
        "the waiting reader is not marked everywhere: {seen:?}"
    );
    assert_eq!(seen.read_phase_open, 0, "{seen:?}");
    assert!(!reader.is_finished(), "the reader held beside the writer");
    rl.unlock(writer).await.unwrap();
    let shared = reader.await.unwrap().unwrap();
    let cleared = |s: &redlock_core::RwInspection| {
        s.read_phase_open == 0
            && s.nodes.iter().all(|n| {
                n.state
                    .as_ref()
                    .is_ok_and(|s| s.readers_waiting == 0 && s.phase_readers == 0)
            })
    };
    let seen = inspect_until(cleared).await;
    assert!(
        cleared(&seen),
        "the held reader's turn is still listed: {seen:?}"
    );
    rl.unlock(shared).await.unwrap();
}

/// A reader that gives up waiting leaves no mark: otherwise the writer's
/// release opened a read phase for nobody, and the next writer was refused
/// for the phase's whole window (seen as a `Busy` of a writer in the
/// combination matrix on a loaded machine). Its mark would have outlived
/// the bound below (a 30 s delay keeps it for more than 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_gives_up_leaves_no_turn_behind() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    let ttl = Duration::from_secs(20);
    let writer = rl
        .rw_lock("insp:gave-up", Access::Exclusive)
        .try_acquire(ttl)
        .await
        .unwrap();
    let inspect_until = |done| inspect_rw_until(&rl, "insp:gave-up", done);
    let seen = inspect_until(|s| matches!(s.verdict, RwVerdict::Written { nodes: 3, .. })).await;
    assert!(
        matches!(seen.verdict, RwVerdict::Written { nodes: 3, .. }),
        "{seen:?}"
    );
    // Two attempts: refused (marked), then given up at its deadline.
    let gave_up = rl
        .rw_lock("insp:gave-up", Access::Shared)
        .acquire_with(
            ttl,
            &redlock_core::RetryPolicy::deadline(ms(300)).with_delay(Duration::from_secs(30)),
        )
        .await;
    assert!(
        matches!(gave_up, Err(redlock_core::Error::Busy { .. })),
        "{gave_up:?}"
    );
    let unmarked = |s: &redlock_core::RwInspection| {
        s.nodes
            .iter()
            .all(|n| n.state.as_ref().is_ok_and(|s| s.readers_waiting == 0))
    };
    let seen = inspect_until(unmarked).await;
    assert!(
        unmarked(&seen),
        "the reader that gave up is still marked: {seen:?}"
    );
    rl.unlock(writer).await.unwrap();
    // No reader waits: the next writer is not held back by a read phase.
    let next = rl
        .rw_lock("insp:gave-up", Access::Exclusive)
        .try_acquire(ttl)
        .await;
    assert!(
        next.is_ok(),
        "a read phase for nobody refused the writer: {next:?}"
    );
    rl.unlock(next.unwrap()).await.unwrap();
}
