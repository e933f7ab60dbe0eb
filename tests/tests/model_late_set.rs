//! Model check (with [`stateright`]) of a held lock's late `SET` and its
//! release, on one node (`stragglers.rs`, `Late::deleted_by_release`). The
//! claim checked: **once everything has run, the node holds no key of the
//! released lock** — a late `SET` that lands after the release is released
//! again.
//!
//! # The protocol, on one node
//!
//! The lock was taken at quorum on the other nodes; this node's `SET` is
//! still on its way. Everything goes over one connection, and the node runs
//! the commands in the order they entered it, answering each in turn.
//!
//! 1. **the `SET` enters the connection**: at any moment. Its first poll may
//!    have found no room (redis' queue of 50 commands full, a concurrency
//!    limit), and it enters only when polled again.
//! 2. **the release starts**: the lock is abandoned, and its compare-and-delete
//!    is to be sent to every node.
//! 3. **the release enters the connection**: at any moment after it started;
//!    it may also have waited for room, and find it before the `SET` does.
//! 4. **the node runs** the command at the head: `SET NX` sets the key if it is
//!    free; the compare-and-delete deletes the key if it holds the lock's
//!    token and says whether it did.
//! 5. **the release's answer is read** and told to the late answers' task.
//! 6. **the late answers' task reads the `SET`'s answer**: before the release
//!    started, an `OK` joins the lock (the release follows it on the node);
//!    after, the rule under test decides whether to send a second
//!    compare-and-delete, which enters the connection like any command.
//!
//! Left out: timeouts and lost connections. A `SET` whose answer never comes
//! may still land after every release; that key expires with its TTL (the
//! distlock page's delayed-packet case), and no client-side rule can tell.
//!
//! # Negative controls
//!
//! - [`Rule::FirstPollOrder`]: the rule before this fix. The `SET` took a
//!   number at its first poll, and a late `OK` was judged covered when that
//!   number was below the node's count read as the release started, whether
//!   or not the `SET` had entered the connection: counterexample.
//! - [`Rule::Never`]: a late `OK` after the release is never released again:
//!   counterexample.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

const NO_KEY_LEFT: &str = "once all has run, the released lock leaves no key";
const OVERTAKEN: &str = "a release runs on the node before the late SET";

/// How the late answers' task judges a late `OK` read after the release started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// The library's: released again unless the release said it deleted the
    /// key on this node (waiting for that answer).
    DeletedByRelease,
    /// Negative control: covered when numbered at its first poll before the
    /// release started (always, here: the first poll came with the acquire).
    FirstPollOrder,
    /// Negative control: never released again.
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Cmd {
    Set,
    Release,
    /// The late answers' task's second compare-and-delete.
    Again,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// Whether the node holds the lock's key.
    key: bool,
    /// Commands on the connection, in the order the node runs them.
    queue: Vec<Cmd>,
    set_entered: bool,
    release_started: bool,
    release_entered: bool,
    /// The answers the node gave and nobody has read yet.
    set_answered: bool,
    /// `Some(deleted)`: the release's answer, not yet read.
    release_answer: Option<bool>,
    /// The release's answer as told to the late answers' task.
    release_read: Option<bool>,
    /// The late answers' task read the `SET`'s answer and acted on it.
    set_read: bool,
    /// The node ran the release before the `SET`.
    overtaken: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    SetEnters,
    ReleaseStarts,
    ReleaseEnters,
    NodeRuns,
    ReleaseAnswerRead,
    SetAnswerRead,
}

#[derive(Clone)]
struct LateSet {
    rule: Rule,
}

impl Model for LateSet {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            key: false,
            queue: Vec::new(),
            set_entered: false,
            release_started: false,
            release_entered: false,
            set_answered: false,
            release_answer: None,
            release_read: None,
            set_read: false,
            overtaken: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !s.set_entered {
            actions.push(Action::SetEnters);
        }
        if !s.release_started {
            actions.push(Action::ReleaseStarts);
        }
        if s.release_started && !s.release_entered {
            actions.push(Action::ReleaseEnters);
        }
        if !s.queue.is_empty() {
            actions.push(Action::NodeRuns);
        }
        if s.release_answer.is_some() && s.release_read.is_none() {
            actions.push(Action::ReleaseAnswerRead);
        }
        if s.set_answered && !s.set_read {
            // Waiting for the release's answer blocks the task (rule 1 only).
            let blocked = self.rule == Rule::DeletedByRelease
                && s.release_started
                && s.release_read.is_none();
            if !blocked {
                actions.push(Action::SetAnswerRead);
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::SetEnters => {
                s.set_entered = true;
                s.queue.push(Cmd::Set);
            }
            Action::ReleaseStarts => s.release_started = true,
            Action::ReleaseEnters => {
                s.release_entered = true;
                s.queue.push(Cmd::Release);
            }
            Action::NodeRuns => match s.queue.remove(0) {
                Cmd::Set => {
                    s.key = true;
                    s.set_answered = true;
                }
                Cmd::Release => {
                    s.overtaken |= !s.set_answered;
                    s.release_answer = Some(std::mem::take(&mut s.key));
                }
                Cmd::Again => s.key = false,
            },
            Action::ReleaseAnswerRead => s.release_read = s.release_answer,
            Action::SetAnswerRead => {
                s.set_read = true;
                let again = s.release_started
                    && match self.rule {
                        Rule::DeletedByRelease => s.release_read != Some(true),
                        Rule::FirstPollOrder | Rule::Never => false,
                    };
                if again {
                    s.queue.push(Cmd::Again);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_KEY_LEFT, |model: &LateSet, s: &State| {
                let mut next = Vec::new();
                model.actions(s, &mut next);
                !(next.is_empty() && s.key)
            }),
            Property::sometimes(OVERTAKEN, |_, s: &State| s.overtaken),
        ]
    }
}

fn trace(path: stateright::Path<State, Action>) -> String {
    path.into_actions()
        .iter()
        .map(|a| format!("  {a:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_late_set_is_released_again_unless_its_release_deleted_it() {
    let start = Instant::now();
    let checker = LateSet {
        rule: Rule::DeletedByRelease,
    }
    .checker()
    .threads(2)
    .spawn_bfs()
    .join();
    println!(
        "model_late_set: {} unique states, depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(NO_KEY_LEFT) {
        panic!("counterexample:\n{}", trace(path));
    }
    // Also asserts that the overtaking is reachable in the model.
    checker.assert_properties();
}

fn counterexample(rule: Rule) -> String {
    let checker = LateSet { rule }
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([NO_KEY_LEFT].into()))
        .spawn_bfs()
        .join();
    trace(checker.assert_any_discovery(NO_KEY_LEFT))
}

#[test]
fn judging_by_the_first_poll_leaves_an_overtaken_set() {
    let path = counterexample(Rule::FirstPollOrder);
    println!("negative control (order of the first polls):\n{path}");
}

#[test]
fn never_releasing_again_leaves_an_overtaken_set() {
    let path = counterexample(Rule::Never);
    println!("negative control (no second release):\n{path}");
}
