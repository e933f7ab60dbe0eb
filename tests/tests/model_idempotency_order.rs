//! Model check (with [`stateright`]) of the order of idempotency records
//! without fencing (`idempotency/redis_store.rs`, `RedisStore::generation`;
//! issue 37, item 10). The claim checked: **once a client has received a
//! response for a key, every later answer for that key is that response** —
//! a record whose write missed its quorum never outranks the record of a
//! later holder that ran the work again.
//!
//! # The protocol, on three nodes
//!
//! Requests with one key come one after another; each runs under the lock,
//! whose mutual exclusion is taken as given (checked elsewhere), and every
//! write of a holder is checked against its lock token on the node, so no
//! holder's call lands once its turn is over. A node answers or not
//! (timeout); a call may apply on a node whose answer is not heard.
//!
//! 1. **fast read**: the records of a quorum (or all) of the nodes; if a
//!    quorum of them return the same record, it is the answer.
//! 2. **read under the lock**: every node that answers (at least a quorum,
//!    else 503): the newest record by the rule under test is the answer. If
//!    fewer than a quorum of the answers held it, it is first written back:
//!    with a generation of this holder's (steps 3 and 4, the same response),
//!    and answered only once on a quorum (else 503).
//! 3. none found: **the generation** (rule [`Rule::Generation`]): each node's
//!    counter goes up by one where the call applies; `g` is the largest value
//!    heard (a quorum must answer, else 503); nodes heard at `g` or more
//!    count; if fewer than a quorum, the others are raised to `g`
//!    (`max(v + 1, g)`) and counted where heard; fewer than a quorum: 503.
//! 4. **the work runs** (or, for a write-back, the found response is
//!    taken) and the record (order `g`) is written to some nodes; on a
//!    quorum the client gets it, else 503 (the record stays where it
//!    landed).
//!
//! Each run's record has other bytes; an earlier run's are the larger, the
//! case where comparing bytes goes wrong.
//!
//! Left out: nodes that forget (a restart without persistence): a node that
//! loses its counter and its records can break the quorum intersection, as
//! it can for the lock itself; the README says so.
//!
//! # Negative control
//!
//! - [`Rule::Bytes`]: the rule before this fix: every record's order is 1,
//!   so the larger bytes win, and a found record is answered whether or not
//!   its write-back reached a quorum: counterexample.
//! - [`Rule::AnswerBeforeWriteBack`]: generations, but a found record is
//!   answered whatever its write-back did, and written back with its own
//!   order (what the first version of the fix did): counterexample (a
//!   record on one node is answered, its write-back fails, and a later holder
//!   that does not hear that node runs the work and answers another).

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

const SAME_ANSWER: &str = "a key keeps the answer its first client received";
const RAN_TWICE: &str = "the work runs again after a write that missed its quorum";

const N: usize = 3;
const Q: usize = 2;
/// Requests with the key, one after another.
const REQUESTS: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// The library's: a record's order is the generation its writer took.
    Generation,
    /// Negative control: every order is 1; the larger bytes win.
    Bytes,
    /// Negative control: generations, but a found record is answered before
    /// its write-back, which keeps its order.
    AnswerBeforeWriteBack,
}

/// A record: its order, and which run wrote it (a later run's bytes are
/// the smaller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Rec {
    order: u64,
    run: u8,
}

impl Rec {
    /// Newest first: the larger order, then the larger bytes (an earlier run).
    fn key(&self) -> (u64, u8) {
        (self.order, u8::MAX - self.run)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// The next request has not started.
    Idle,
    /// Read under the lock.
    LockRead,
    /// A record found with too few copies, answered already: written back
    /// as it is (negative controls).
    Repair(Rec),
    /// The generation's first step; `found`: the run whose response is
    /// written back, or `None` for a run of the work.
    Generation { found: Option<u8> },
    /// The generation's second step, raising the nodes below `g`; `at_g`
    /// bit i: node i is heard at `g` or more.
    Raise { g: u64, at_g: u8, found: Option<u8> },
    /// The record is written.
    Write { g: u64, found: Option<u8> },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    records: [Option<Rec>; N],
    counters: [u64; N],
    phase: Phase,
    /// Requests started.
    started: u8,
    /// Runs of the work.
    runs: u8,
    /// The first answer a client received, and whether a later one differed.
    first: Option<u8>,
    differed: bool,
}

/// What a call did on each node: bit i of `applied`, bit i of `heard` (a
/// subset of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// A request starts with its fast read of the nodes in `heard`.
    Start {
        heard: u8,
    },
    LockRead {
        heard: u8,
    },
    Repair {
        applied: u8,
    },
    Generation {
        applied: u8,
        heard: u8,
    },
    Raise {
        applied: u8,
        heard: u8,
    },
    Write {
        applied: u8,
    },
}

fn nodes(mask: u8) -> impl Iterator<Item = usize> {
    (0..N).filter(move |i| mask & (1 << i) != 0)
}

fn count(mask: u8) -> usize {
    mask.count_ones() as usize
}

/// Every (applied, heard ⊆ applied) pair over the nodes in `of`.
fn calls(of: u8) -> Vec<(u8, u8)> {
    let mut out = Vec::new();
    for applied in 0..(1u8 << N) {
        if applied & !of != 0 {
            continue;
        }
        for heard in 0..(1u8 << N) {
            if heard & !applied == 0 {
                out.push((applied, heard));
            }
        }
    }
    out
}

#[derive(Clone)]
struct Records {
    rule: Rule,
}

impl State {
    fn answer(&mut self, run: u8) {
        match self.first {
            None => self.first = Some(run),
            Some(first) => self.differed |= first != run,
        }
    }
}

impl Model for Records {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            records: [None; N],
            counters: [0; N],
            phase: Phase::Idle,
            started: 0,
            runs: 0,
            first: None,
            differed: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let all = (1u8 << N) - 1;
        match s.phase {
            Phase::Idle if s.started < REQUESTS => {
                for heard in 0..=all {
                    if count(heard) >= Q {
                        actions.push(Action::Start { heard });
                    }
                }
            }
            Phase::Idle => {}
            Phase::LockRead => {
                for heard in 0..=all {
                    actions.push(Action::LockRead { heard });
                }
            }
            Phase::Repair(_) => {
                for applied in 0..=all {
                    actions.push(Action::Repair { applied });
                }
            }
            Phase::Generation { .. } => {
                for (applied, heard) in calls(all) {
                    actions.push(Action::Generation { applied, heard });
                }
            }
            Phase::Raise { at_g, .. } => {
                for (applied, heard) in calls(all & !at_g) {
                    actions.push(Action::Raise { applied, heard });
                }
            }
            Phase::Write { .. } => {
                for applied in 0..=all {
                    actions.push(Action::Write { applied });
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match (s.phase, action) {
            (Phase::Idle, Action::Start { heard }) => {
                s.started += 1;
                // Vouched: a quorum of the answers are the same record.
                let vouched = nodes(heard).find_map(|i| {
                    let r = s.records[i]?;
                    let same = nodes(heard).filter(|&j| s.records[j] == Some(r)).count();
                    (same >= Q).then_some(r)
                });
                match vouched {
                    Some(r) => s.answer(r.run),
                    None => s.phase = Phase::LockRead,
                }
            }
            (Phase::LockRead, Action::LockRead { heard }) => {
                if count(heard) < Q {
                    // 503: too few nodes answered.
                    s.phase = Phase::Idle;
                    return Some(s);
                }
                let newest = nodes(heard)
                    .filter_map(|i| s.records[i])
                    .max_by_key(Rec::key);
                s.phase = match newest {
                    Some(r) => {
                        let copies = nodes(heard).filter(|&i| s.records[i] == Some(r)).count();
                        if copies >= Q {
                            s.answer(r.run);
                            Phase::Idle
                        } else if self.rule == Rule::Generation {
                            Phase::Generation { found: Some(r.run) }
                        } else {
                            s.answer(r.run);
                            Phase::Repair(r)
                        }
                    }
                    None => match self.rule {
                        Rule::Generation | Rule::AnswerBeforeWriteBack => {
                            Phase::Generation { found: None }
                        }
                        Rule::Bytes => Phase::Write { g: 1, found: None },
                    },
                };
            }
            (Phase::Repair(r), Action::Repair { applied }) => {
                for i in nodes(applied) {
                    s.records[i] = Some(r);
                }
                s.phase = Phase::Idle;
            }
            (Phase::Generation { found }, Action::Generation { applied, heard }) => {
                for i in nodes(applied) {
                    s.counters[i] += 1;
                }
                if count(heard) < Q {
                    s.phase = Phase::Idle;
                    return Some(s);
                }
                let g = nodes(heard).map(|i| s.counters[i]).max().unwrap_or(0);
                let at_g = nodes(heard)
                    .filter(|&i| s.counters[i] >= g)
                    .fold(0u8, |m, i| m | (1 << i));
                s.phase = if count(at_g) >= Q {
                    Phase::Write { g, found }
                } else {
                    Phase::Raise { g, at_g, found }
                };
            }
            (Phase::Raise { g, at_g, found }, Action::Raise { applied, heard }) => {
                for i in nodes(applied) {
                    s.counters[i] = (s.counters[i] + 1).max(g);
                }
                let raised = nodes(heard).filter(|&i| s.counters[i] >= g).count();
                s.phase = if count(at_g) + raised >= Q {
                    Phase::Write { g, found }
                } else {
                    Phase::Idle
                };
            }
            (Phase::Write { g, found }, Action::Write { applied }) => {
                let run = match found {
                    Some(run) => run,
                    None => {
                        s.runs += 1;
                        s.runs
                    }
                };
                let r = Rec { order: g, run };
                for i in nodes(applied) {
                    s.records[i] = Some(r);
                }
                if count(applied) >= Q {
                    s.answer(r.run);
                }
                s.phase = Phase::Idle;
            }
            _ => return None,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SAME_ANSWER, |_, s: &State| !s.differed),
            Property::sometimes(RAN_TWICE, |_, s: &State| s.runs >= 2),
        ]
    }
}

fn trace(path: stateright::Path<State, Action>) -> String {
    path.into_vec()
        .iter()
        .map(|(s, a)| format!("  {:?} {:?} -> {a:?}", s.records, s.counters))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn with_generations_a_key_keeps_its_first_answer() {
    let start = Instant::now();
    let checker = Records {
        rule: Rule::Generation,
    }
    .checker()
    .threads(2)
    .spawn_bfs()
    .join();
    println!(
        "model_idempotency_order: {} unique states, depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(SAME_ANSWER) {
        panic!("counterexample:\n{}", trace(path));
    }
    // Also asserts that a second run of the work is reachable.
    checker.assert_properties();
}

fn counterexample(rule: Rule) -> String {
    let checker = Records { rule }
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([SAME_ANSWER].into()))
        .spawn_bfs()
        .join();
    trace(checker.assert_any_discovery(SAME_ANSWER))
}

#[test]
fn comparing_bytes_changes_an_answer_a_client_received() {
    let path = counterexample(Rule::Bytes);
    println!("negative control (order 1, larger bytes win):\n{path}");
}

#[test]
fn answering_before_the_write_back_changes_an_answer_a_client_received() {
    let path = counterexample(Rule::AnswerBeforeWriteBack);
    println!("negative control (answered before the write-back):\n{path}");
}
