//! Model check (with [`stateright`]) of a held lock's late `SET` and the
//! lock's end, on one node (`protocol/stragglers.rs`, `Late` and
//! `Redlock::drive_stragglers`), for both ends a lock has:
//!
//! - **the release** (`protocol/release.rs`, a compare-and-delete on every
//!   node, its answers told to the late answers' task,
//!   `Late::deleted_by_release`);
//! - **the at-least keep** (issue 47, item 6: `guard/at_least.rs`,
//!   `LockGuard::release_at_least` before its minimum, and a dropped job's
//!   guard; `guard/keep.rs`, `keep_until`): a compare-and-pexpire (`EXTEND`)
//!   to the keep point on every node, and no release; once every node's
//!   call has settled, `late.release_answers(&settled)` and
//!   `late.release_never_sent()`.
//!
//! The claims checked, once everything has run: **no key of the lock
//! outlives its end** — a late `SET` that landed is released, or (keep) its
//! key was shortened by the keep and expires at the keep point; **the late
//! answers' task has ended** — it never waits for a release that is never
//! sent; and (keep) **a key the keep reported kept is not released before
//! the keep point**.
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
//! 2. **the end starts**: `Lock::abandon` marks the lock abandoned and
//!    "released everywhere" (`Late::releasing_everywhere`), for the keep as
//!    for the release; the end's command (the compare-and-delete, or the
//!    keep's compare-and-pexpire) is to be sent to every node.
//! 3. **the end's command enters the connection**: at any moment after it
//!    started; it may also have waited for room, and find it before the
//!    `SET` does.
//! 4. **the node runs** the command at the head: `SET NX` sets the key if it
//!    is free (with the lock's TTL); the compare-and-delete deletes the key
//!    if it holds the lock's token and says whether it did; the keep sets a
//!    key holding the token to expire at the keep point and says whether it
//!    did (`EXTEND`, 1 or 0).
//! 5. **the end's answer is read** and told to the late answers' task. The
//!    keep's call may instead give up (its node timeout): then it is told
//!    as not kept; a keep still waiting for room is dropped and never
//!    enters, one on the connection still runs, unheard. (`keep_until`
//!    settles every node's call before it tells the task anything.)
//! 6. **the late answers' task reads the `SET`'s answer**: before the end
//!    started, an `OK` joins the lock (the end follows it on the node);
//!    after, it waits until the end's answer for this node is told, then
//!    the rule under test decides whether to send a second
//!    compare-and-delete (`Redlock::release_on`), which enters the
//!    connection like any command. The task ends with it.
//!
//! What the library does on the keep path, read from `keep_until` and
//! `deleted_by_release`: the keep's answers are told as the release's would
//! be, "kept" standing for "deleted", so a late `OK` on a node whose keep
//! shortened the key (its `SET` ran before the keep) is left alone: that key
//! expires at the keep point, with the lock's other keys. A late `OK`
//! anywhere else (the keep found no key: the `SET` ran after it, or the
//! keep failed) is released where it landed. `release_never_sent` then
//! marks every node done, so the task never waits for more.
//!
//! # Abstractions, and why sound
//!
//! - One node: the late answers are judged per node (`Late`'s bits), and
//!   the other nodes' answers reach this node's judgement only through the
//!   end's answer here; the acquire was decided by a quorum without it.
//! - The key's expiries are not modelled: a key left with the lock's own TTL
//!   at the end is the failure ([`NO_KEY_LEFT`]); one the keep shortened
//!   expires at the keep point, which is what the keep promises
//!   (`Ended::Kept`), and which [`KEPT_UNTIL`] checks no release cuts
//!   short. Expiry before the end only removes a key earlier, which no rule
//!   here reads otherwise than "not there".
//! - A key that joined the lock (its `OK` read before the end started) and
//!   that the keep's call then missed (it gave up before it was sent) keeps
//!   the lock's TTL, as every key a failed end misses does (`Ended::Kept`
//!   counts only the nodes whose keep answered; `ReleaseIncomplete`): not a
//!   late `SET`'s failure, and [`NO_KEY_LEFT`] does not count it.
//! - `keep_until` tells the task only once every node's call has settled;
//!   the model tells it once this node's has, and the other nodes only
//!   delay that moment, which the task's wait covers.
//!
//! Left out: timeouts of the `SET` and lost connections. A `SET` whose
//! answer never comes may still land after every release; that key expires
//! with its TTL (the distlock page's delayed-packet case), and no
//! client-side rule can tell. The release's own give-up (`release.rs` tells
//! it as not deleted, like the keep's) is left to the keep path, where it is
//! checked.
//!
//! # Negative controls
//!
//! - [`Rule::FirstPollOrder`] (release): the rule before commit 792f5f7.
//!   The `SET` took a number at its first poll, and a late `OK` was judged
//!   covered when that number was below the node's count read as the
//!   release started, whether or not the `SET` had entered the connection:
//!   counterexample to [`NO_KEY_LEFT`].
//! - [`Rule::Never`] (release): a late `OK` after the release is never
//!   released again: counterexample to [`NO_KEY_LEFT`].
//! - [`Told::Nothing`] (keep): before item 6's fix, `keep_until` abandoned
//!   the lock and told the task nothing: counterexample to [`TASK_ENDS`]
//!   (the keep runs before the `SET`, the `SET` lands, and the task waits
//!   for ever for a release never sent, holding the handle and its
//!   connections; the key keeps the lock's TTL).
//! - [`Told::NeverSent`] (keep): the first fix of item 6 (commit 33e5da7),
//!   `release_never_sent` alone: every late `OK` is released, one the keep
//!   had kept too: counterexample to [`KEPT_UNTIL`] (the `SET` runs, the
//!   keep shortens its key and answers "kept", and the task releases it:
//!   gone before the keep point, as a loaded run saw: `Kept { nodes: 3 }`,
//!   then one node's key gone 1.49 s early).

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

const NO_KEY_LEFT: &str = "once all has run, no key of the lock outlives its end";
const TASK_ENDS: &str = "once nothing else can run, the late answers' task has ended";
const KEPT_UNTIL: &str = "a key the keep reported kept is not released before the keep point";
const OVERTAKEN: &str = "the end runs on the node before the late SET";
const LATE_KEPT: &str = "a late SET's key read after the keep started is kept to the keep point";

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

/// What `keep_until` tells the late answers' task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Told {
    /// The library's: each node's keep answer (`release_answers`), then that
    /// no more comes (`release_never_sent`).
    KeepAnswers,
    /// Negative control (commit 33e5da7): only that no more comes.
    NeverSent,
    /// Negative control (before item 6's fix): nothing.
    Nothing,
}

/// How the lock ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum End {
    Release(Rule),
    Keep(Told),
}

/// The lock's key on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Free,
    /// Set by the `SET`, with the lock's TTL.
    Set,
    /// Shortened by the keep: it expires at the keep point.
    Kept,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Cmd {
    Set,
    /// The release's compare-and-delete, or the keep's compare-and-pexpire.
    End,
    /// The late answers' task's second compare-and-delete.
    Again,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    key: Key,
    /// Commands on the connection, in the order the node runs them.
    queue: Vec<Cmd>,
    set_entered: bool,
    end_started: bool,
    /// The end's command entered the connection (or never will: its call
    /// gave up before it found room).
    end_entered: bool,
    /// The `SET`'s answer came back (not yet read).
    set_answered: bool,
    /// `Some(did)`: the end's answer (deleted, or kept), not yet read.
    end_answer: Option<bool>,
    /// The end's call settled: its answer (`false` for a call that gave up).
    end_settled: Option<bool>,
    /// The keep's call gave up.
    gave_up: bool,
    /// The late answers' task read the `SET`'s answer and acted on it:
    /// `Some(after the end started)`.
    set_read: Option<bool>,
    /// The node ran the end before the `SET`.
    overtaken: bool,
    /// A key the keep reported kept was released.
    kept_released: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    SetEnters,
    EndStarts,
    EndEnters,
    NodeRuns,
    EndAnswerRead,
    /// The keep's call gives up (its node timeout) before its answer.
    KeepGivesUp,
    SetAnswerRead,
}

#[derive(Clone)]
struct LateSet {
    end: End,
}

impl LateSet {
    /// The end's answer for this node as the late answers' task knows it:
    /// `Some(deleted)` once told (the keep's "kept" counts as deleted).
    fn told(&self, s: &State) -> Option<bool> {
        match self.end {
            End::Release(_) | End::Keep(Told::KeepAnswers) => s.end_settled,
            End::Keep(Told::NeverSent) => s.end_settled.map(|_| false),
            End::Keep(Told::Nothing) => None,
        }
    }

    /// Whether the task waits for the end's answer before it judges a late
    /// `OK` (`deleted_by_release`, once the lock is marked released
    /// everywhere).
    fn waits(&self) -> bool {
        !matches!(self.end, End::Release(Rule::FirstPollOrder | Rule::Never))
    }

    fn terminal(&self, s: &State) -> bool {
        let mut next = Vec::new();
        self.actions(s, &mut next);
        next.is_empty()
    }
}

impl Model for LateSet {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            key: Key::Free,
            queue: Vec::new(),
            set_entered: false,
            end_started: false,
            end_entered: false,
            set_answered: false,
            end_answer: None,
            end_settled: None,
            gave_up: false,
            set_read: None,
            overtaken: false,
            kept_released: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !s.set_entered {
            actions.push(Action::SetEnters);
        }
        if !s.end_started {
            actions.push(Action::EndStarts);
        }
        if s.end_started && !s.end_entered {
            actions.push(Action::EndEnters);
        }
        if !s.queue.is_empty() {
            actions.push(Action::NodeRuns);
        }
        if s.end_answer.is_some() && s.end_settled.is_none() {
            actions.push(Action::EndAnswerRead);
        }
        if matches!(self.end, End::Keep(_)) && s.end_started && s.end_settled.is_none() {
            actions.push(Action::KeepGivesUp);
        }
        if s.set_answered && s.set_read.is_none() {
            let blocked = self.waits() && s.end_started && self.told(s).is_none();
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
            Action::EndStarts => s.end_started = true,
            Action::EndEnters => {
                s.end_entered = true;
                s.queue.push(Cmd::End);
            }
            Action::NodeRuns => match s.queue.remove(0) {
                Cmd::Set => {
                    if s.key == Key::Free {
                        s.key = Key::Set;
                    }
                    s.set_answered = true;
                }
                Cmd::End => {
                    s.overtaken |= !s.set_answered;
                    let did = match self.end {
                        End::Release(_) => std::mem::replace(&mut s.key, Key::Free) != Key::Free,
                        End::Keep(_) => {
                            let held = s.key == Key::Set;
                            if held {
                                s.key = Key::Kept;
                            }
                            held
                        }
                    };
                    // Unheard once the call gave up.
                    if s.end_settled.is_none() {
                        s.end_answer = Some(did);
                    }
                }
                Cmd::Again => {
                    s.kept_released |= s.key == Key::Kept && s.end_settled == Some(true);
                    s.key = Key::Free;
                }
            },
            Action::EndAnswerRead => s.end_settled = s.end_answer.take(),
            Action::KeepGivesUp => {
                s.end_settled = Some(false);
                s.end_answer = None;
                s.gave_up = true;
                // Dropped before it found room: never sent.
                s.end_entered = true;
            }
            Action::SetAnswerRead => {
                s.set_read = Some(s.end_started);
                let again = s.end_started
                    && match self.end {
                        End::Release(Rule::DeletedByRelease) | End::Keep(_) => {
                            self.told(&s) != Some(true)
                        }
                        End::Release(Rule::FirstPollOrder | Rule::Never) => false,
                    };
                if again {
                    s.queue.push(Cmd::Again);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(NO_KEY_LEFT, |model: &LateSet, s: &State| {
                // A key that joined the lock, where the keep's call then
                // failed, expires with its TTL like any key of a failed end.
                let joined_unreached = s.set_read == Some(false) && s.gave_up;
                !(s.key == Key::Set && !joined_unreached && model.terminal(s))
            }),
            Property::always(TASK_ENDS, |model: &LateSet, s: &State| {
                !(s.set_read.is_none() && model.terminal(s))
            }),
            Property::always(KEPT_UNTIL, |_, s: &State| !s.kept_released),
            Property::sometimes(OVERTAKEN, |_, s: &State| s.overtaken),
        ];
        if matches!(self.end, End::Keep(_)) {
            properties.push(Property::sometimes(
                LATE_KEPT,
                |model: &LateSet, s: &State| {
                    s.key == Key::Kept && s.set_read == Some(true) && model.terminal(s)
                },
            ));
        }
        properties
    }
}

/// Each step as the node's key and connection before it, then the action
/// (`None`: the end, nothing else can happen).
fn trace(path: stateright::Path<State, Action>) -> String {
    path.into_vec()
        .iter()
        .map(|(s, a)| {
            let task = match s.set_read {
                None if s.set_answered => "the SET's answer unread",
                None => "-",
                Some(false) => "the SET joined the lock",
                Some(true) => "the SET judged after the end",
            };
            format!(
                "  key {:?}, queue {:?}, task: {task} -> {}",
                s.key,
                s.queue,
                a.map_or("None".into(), |a| format!("{a:?}"))
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks every state: no counterexample to any claim, and every
/// `sometimes` property reached.
fn passes(name: &str, end: End) {
    let start = Instant::now();
    let checker = LateSet { end }.checker().spawn_bfs().join();
    println!(
        "model_late_set, {name}: {} unique states, depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    for claim in [NO_KEY_LEFT, TASK_ENDS, KEPT_UNTIL] {
        if let Some(path) = checker.discovery(claim) {
            panic!("{name}: counterexample to '{claim}':\n{}", trace(path));
        }
    }
    // Also asserts that the overtaking (and a late key kept) is reachable.
    checker.assert_properties();
}

#[test]
fn a_late_set_is_released_again_unless_its_release_deleted_it() {
    passes("release", End::Release(Rule::DeletedByRelease));
}

#[test]
fn a_late_set_after_a_keep_is_released_or_kept_and_its_task_ends() {
    passes("at-least keep", End::Keep(Told::KeepAnswers));
}

fn counterexample(end: End, claim: &'static str) -> String {
    // One thread: the breadth-first order, and so the trace, is the same
    // at every run.
    let checker = LateSet { end }
        .checker()
        .finish_when(HasDiscoveries::AnyOf([claim].into()))
        .spawn_bfs()
        .join();
    trace(checker.assert_any_discovery(claim))
}

#[test]
fn judging_by_the_first_poll_leaves_an_overtaken_set() {
    let path = counterexample(End::Release(Rule::FirstPollOrder), NO_KEY_LEFT);
    println!("negative control (order of the first polls):\n{path}");
}

#[test]
fn never_releasing_again_leaves_an_overtaken_set() {
    let path = counterexample(End::Release(Rule::Never), NO_KEY_LEFT);
    println!("negative control (no second release):\n{path}");
}

#[test]
fn a_keep_that_tells_nothing_leaves_the_late_task_waiting() {
    let path = counterexample(End::Keep(Told::Nothing), TASK_ENDS);
    println!("negative control (keep abandons the lock, tells nothing):\n{path}");
}

#[test]
fn a_keep_that_only_says_never_sent_releases_a_kept_key_early() {
    let path = counterexample(End::Keep(Told::NeverSent), KEPT_UNTIL);
    println!("negative control (keep tells only 'never sent'):\n{path}");
}
