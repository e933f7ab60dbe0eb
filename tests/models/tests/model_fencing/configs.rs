//! The checked configurations (Durable, Hybrid with delayed restarts, counter expiry) and the checker runs.

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use super::*;

/// Node clock offsets with spread `skew` (0 or 1), up to node permutation and
/// a common shift.
pub(super) fn offsets(skew: u8) -> Vec<[u8; N]> {
    match skew {
        0 => vec![[0, 0, 0]],
        1 => vec![[0, 0, 0], [1, 0, 0], [1, 1, 0]],
        _ => unimplemented!("skew above 1"),
    }
}

/// Assumption A: the two-phase counter rule on nodes with `appendfsync always`.
pub(super) fn durable(clients: usize, attempts: u8, crashes: u8) -> Fencing {
    Fencing {
        rule: Rule::Counter,
        persistence: Persistence::Fsync,
        restart_after_locks: false,
        min_down_ticks: 0,
        clients,
        attempts,
        crashes,
        max_time: 0,
        offsets: offsets(0),
        counter_expiry: None,
    }
}

/// Assumption B: the hybrid rule, no persistence, delayed restart past both the
/// node's locks and the clock skew.
pub(super) fn hybrid_delayed_restart(
    clients: usize,
    attempts: u8,
    crashes: u8,
    max_time: u8,
) -> Fencing {
    let skew = 1;
    Fencing {
        rule: Rule::Hybrid,
        persistence: Persistence::None,
        restart_after_locks: true,
        min_down_ticks: skew + 1,
        clients,
        attempts,
        crashes,
        max_time,
        offsets: offsets(skew),
        counter_expiry: None,
    }
}

/// The hybrid rule with counters that expire after `idle` ticks without a
/// fence (`FencingMode::Hybrid`'s counter TTL), and no crash: the expiry is
/// the only way a counter is lost.
pub(super) fn hybrid_counter_expiry(idle: u8, skew: u8, max_time: u8) -> Fencing {
    Fencing {
        crashes: 0,
        counter_expiry: Some(idle),
        offsets: offsets(skew),
        ..hybrid_delayed_restart(2, 1, 0, max_time)
    }
}

/// Whether the passing checks use the symmetry reduction (depth-first):
/// `REDLOCK_MODEL_SYMMETRY=0` turns it off (breadth-first, every state).
pub(super) fn symmetry() -> bool {
    std::env::var("REDLOCK_MODEL_SYMMETRY").map_or(true, |v| v != "0")
}

pub(super) fn threads() -> usize {
    std::env::var("REDLOCK_MODEL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

pub(super) struct Outcome {
    pub(super) unique: usize,
    pub(super) total: usize,
    pub(super) depth: usize,
    pub(super) elapsed: Duration,
    /// Symmetry-reduced (depth-first): `unique` counts representatives.
    pub(super) reduced: bool,
}

pub(super) fn report(name: &str, model: &Fencing, o: &Outcome) {
    println!(
        "{name}: {:?}/{:?}, {} clients x {} attempts, {} crashes, max_time {}, skew {}{}: \
         {} unique states ({} generated), max depth {}, {:.2?}{}",
        model.rule,
        model.persistence,
        model.clients,
        model.attempts,
        model.crashes,
        model.max_time,
        model.skew(),
        model.counter_expiry.map_or(String::new(), |i| format!(
            ", counters expire after {i} idle ticks"
        )),
        o.unique,
        o.total,
        o.depth,
        o.elapsed,
        if o.reduced {
            " (symmetry-reduced, depth-first)"
        } else {
            ""
        }
    );
}

/// Checks the whole bounded state space: no counterexample to [`MONOTONE`], and
/// an example of [`HOLDER_AFTER_RESTART`].
pub(super) fn check_passes(name: &str, model: Fencing) -> Outcome {
    let shown = model.clone();
    let start = Instant::now();
    let builder = model.checker().threads(threads());
    if symmetry() {
        let checker = builder.symmetry_fn(representative).spawn_dfs().join();
        passed(name, &shown, checker, start, true)
    } else {
        passed(name, &shown, builder.spawn_bfs().join(), start, false)
    }
}

pub(super) fn passed(
    name: &str,
    model: &Fencing,
    checker: impl Checker<Fencing>,
    start: Instant,
    reduced: bool,
) -> Outcome {
    let o = Outcome {
        unique: checker.unique_state_count(),
        total: checker.state_count(),
        depth: checker.max_depth(),
        elapsed: start.elapsed(),
        reduced,
    };
    report(name, model, &o);
    if let Some(path) = checker.discovery(MONOTONE) {
        panic!("{name}: counterexample:\n{}", model.trace(path));
    }
    checker.assert_properties();
    o
}

/// Checks until the first counterexample to [`MONOTONE`], asserts there is
/// one, prints it and returns its trace.
pub(super) fn check_fails(name: &str, model: Fencing) -> String {
    let shown = model.clone();
    let start = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([MONOTONE].into()))
        .spawn_bfs()
        .join();
    let o = Outcome {
        unique: checker.unique_state_count(),
        total: checker.state_count(),
        depth: checker.max_depth(),
        elapsed: start.elapsed(),
        reduced: false,
    };
    report(name, &shown, &o);
    let path = checker.assert_any_discovery(MONOTONE);
    let trace = shown.trace(path);
    println!("{name}: counterexample ({}):\n{trace}", MONOTONE);
    // The symmetry reduction the passing checks use must not hide it either.
    let start = Instant::now();
    let reduced = shown
        .clone()
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([MONOTONE].into()))
        .symmetry_fn(representative)
        .spawn_dfs()
        .join();
    assert!(
        reduced.discovery(MONOTONE).is_some(),
        "{name}: the symmetry-reduced depth-first check missed the counterexample"
    );
    println!(
        "{name}: also found symmetry-reduced, depth-first: {} states, {:.2?}",
        reduced.unique_state_count(),
        start.elapsed()
    );
    trace
}
