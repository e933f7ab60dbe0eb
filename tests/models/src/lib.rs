//! The model checks (stateright) of the protocols `redlock-core`
//! implements: each is a test target of this package (`tests/`). They are
//! their own package so that the test build can optimize them alone (the
//! workspace's `[profile.dev.package.redlock-models]`): a debug build
//! explores their state spaces several times slower, and they were a
//! quarter of the test command's time.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

/// A path of a model as its actions, one per line.
pub fn actions<S, A: Debug>(path: Path<S, A>) -> String {
    path.into_actions()
        .iter()
        .map(|a| format!("  {a:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Explores the whole state space of `model` (breadth first, two threads)
/// and prints its size under `label`. Panics with the path of a
/// counterexample to `property`, then asserts every property (each
/// `sometimes` one reached: the check is not vacuous).
pub fn holds<M>(model: M, label: &str, property: &'static str)
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let start = Instant::now();
    let checker = model.checker().threads(2).spawn_bfs().join();
    println!(
        "{label}: {} unique states, depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(property) {
        panic!("counterexample:\n{}", actions(path));
    }
    checker.assert_properties();
}

/// The first path (breadth first, two threads) to a counterexample to
/// `property` in `model`, which must have one, as its actions; prints the
/// states explored under `label`.
pub fn counterexample<M>(model: M, label: &str, property: &'static str) -> String
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let start = Instant::now();
    let checker = model
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    println!(
        "{label}: counterexample after {} unique states, {:.2?}",
        checker.unique_state_count(),
        start.elapsed()
    );
    actions(checker.assert_any_discovery(property))
}
