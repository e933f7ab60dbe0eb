//! Model check (with [`stateright`]) of the quorum semaphore of issue 41
//! (`Redlock::acquire_permit`): `permits` slots, each a Redlock mutex, admit
//! at most `permits` holders; a per-node count of holders does not.
//!
//! # The protocol
//!
//! N = 3 independent masters (quorum Q = 2), P = 2 permits, three clients.
//! An attempt has a fresh token and sends its acquire to every node; on a
//! node the script runs atomically:
//!
//! * [`Rule::Slots`] (the library's): the attempt names one slot (in the
//!   model any slot, chosen at its start: the library's choice of slot only
//!   matters for how often attempts succeed, never for safety), and the node
//!   sets that slot's key to the token if it is free (`SET NX`), answering OK
//!   only then. That is the mutex's acquire on the slot's key.
//! * [`Rule::Count`], the negative control: the node admits the token if it
//!   holds fewer than P tokens of the resource, whichever they are.
//!
//! The client holds a permit once Q nodes answered OK; until then it may give
//! up at any moment, and a holder may stop holding at any moment. Messages are
//! delivered in any order, any time, including after their attempt died. As
//! in `model_many.rs`, TTLs are abstracted: an entry of a *dead* attempt may
//! vanish at any step (expiry, release), an entry of a *live* attempt never
//! does (Redlock's validity ends before any of its keys expires). Node crashes
//! are not modelled, for the reason `model_many.rs` gives (a node restarted
//! without data stays down past the TTL, which `Expire` covers).
//!
//! # The property
//!
//! [`AT_MOST_P`]: never more than P holders at once. [`FULL`] (sometimes)
//! keeps the check from passing vacuously: P holders at once is reachable.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

const N: usize = 3;
const Q: u32 = 2;
const P: usize = 2;
const CLIENTS: usize = 3;
const AT_MOST_P: &str = "never more than P holders at once";
const FULL: &str = "P holders at once";

/// What a node's acquire script does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// The attempt's own slot, set only if free.
    Slots,
    /// Negative control: admitted while the node holds fewer than P tokens.
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// Sent; `ok`: the nodes that answered OK so far.
    Acquiring {
        ok: u8,
    },
    Held,
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Attempt {
    phase: Phase,
    /// The slot it asks for (unused by [`Rule::Count`]).
    slot: u8,
    /// Nodes whose acquire has not been delivered yet.
    in_flight: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// `nodes[n][s]`: 0 for a free slot, else the holding attempt's index + 1.
    nodes: [[u8; P]; N],
    attempts: Vec<Attempt>,
    /// The most holders seen at once.
    most: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Attempt `a` starts, asking for slot `s`.
    Start(usize, u8),
    Deliver(usize, usize),
    Hold(usize),
    GiveUp(usize),
    Stop(usize),
    Expire(usize, usize),
}

#[derive(Clone)]
struct Semaphore {
    rule: Rule,
    per_client: usize,
}

impl Semaphore {
    fn live(s: &State, a: usize) -> bool {
        matches!(s.attempts[a].phase, Phase::Acquiring { .. } | Phase::Held)
    }

    /// The node runs attempt `a`'s acquire script; returns whether it said OK.
    fn run_script(&self, node: &mut [u8; P], a: usize, slot: u8) -> bool {
        let me = a as u8 + 1;
        match self.rule {
            Rule::Slots => {
                let s = &mut node[slot as usize];
                if *s != 0 {
                    return false;
                }
                *s = me;
                true
            }
            Rule::Count => match node.iter_mut().find(|v| **v == 0) {
                Some(free) => {
                    *free = me;
                    true
                }
                None => false,
            },
        }
    }

    fn name(&self, a: usize) -> String {
        format!("c{}#{}", a / self.per_client, a % self.per_client)
    }

    fn describe(&self, action: &Action) -> String {
        match *action {
            Action::Start(a, s) => match self.rule {
                Rule::Slots => format!("{} sends its acquire of slot {s}", self.name(a)),
                Rule::Count => format!("{} sends its acquire", self.name(a)),
            },
            Action::Deliver(a, n) => format!("node {n} runs {}'s acquire", self.name(a)),
            Action::Hold(a) => format!("{} has a quorum of OKs: holds", self.name(a)),
            Action::GiveUp(a) => format!("{} gives up", self.name(a)),
            Action::Stop(a) => format!("{} stops holding", self.name(a)),
            Action::Expire(n, s) => format!("node {n}: entry {s} expires"),
        }
    }

    fn summary(&self, s: &State) -> String {
        let nodes: Vec<String> = s
            .nodes
            .iter()
            .map(|node| {
                let e: Vec<String> = node
                    .iter()
                    .map(|&v| match v {
                        0 => "-".into(),
                        v => self.name(v as usize - 1),
                    })
                    .collect();
                format!("[{}]", e.join(" "))
            })
            .collect();
        let held: Vec<String> = (0..s.attempts.len())
            .filter(|&a| s.attempts[a].phase == Phase::Held)
            .map(|a| self.name(a))
            .collect();
        format!("nodes {} holders [{}]", nodes.join(" "), held.join(", "))
    }

    fn trace(&self, path: Path<State, Action>) -> String {
        let mut out = String::new();
        for (state, action) in path.into_vec() {
            out.push_str(&format!("        {}\n", self.summary(&state)));
            if let Some(action) = action {
                out.push_str(&format!("     -> {}\n", self.describe(&action)));
            }
        }
        out
    }
}

impl Model for Semaphore {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            nodes: [[0; P]; N],
            attempts: vec![
                Attempt {
                    phase: Phase::Idle,
                    slot: 0,
                    in_flight: 0,
                };
                CLIENTS * self.per_client
            ],
            most: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for c in 0..CLIENTS {
            let mine = c * self.per_client..(c + 1) * self.per_client;
            if mine.clone().all(|a| !Self::live(s, a))
                && let Some(a) = mine.clone().find(|&a| s.attempts[a].phase == Phase::Idle)
            {
                let slots = match self.rule {
                    Rule::Slots => P as u8,
                    Rule::Count => 1,
                };
                for slot in 0..slots {
                    actions.push(Action::Start(a, slot));
                }
            }
        }
        for (a, at) in s.attempts.iter().enumerate() {
            for n in 0..N {
                if at.in_flight & (1 << n) != 0 {
                    actions.push(Action::Deliver(a, n));
                }
            }
            match at.phase {
                Phase::Acquiring { ok } => {
                    if ok.count_ones() >= Q {
                        actions.push(Action::Hold(a));
                    }
                    actions.push(Action::GiveUp(a));
                }
                Phase::Held => actions.push(Action::Stop(a)),
                _ => {}
            }
        }
        for n in 0..N {
            for e in 0..P {
                let v = s.nodes[n][e];
                if v != 0 && !Self::live(s, v as usize - 1) {
                    actions.push(Action::Expire(n, e));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Start(a, slot) => {
                s.attempts[a] = Attempt {
                    phase: Phase::Acquiring { ok: 0 },
                    slot,
                    in_flight: (1 << N) - 1,
                };
            }
            Action::Deliver(a, n) => {
                s.attempts[a].in_flight &= !(1 << n);
                let slot = s.attempts[a].slot;
                let ok = self.run_script(&mut s.nodes[n], a, slot);
                if let Phase::Acquiring { ok: seen } = &mut s.attempts[a].phase
                    && ok
                {
                    *seen |= 1 << n;
                }
            }
            Action::Hold(a) => {
                s.attempts[a].phase = Phase::Held;
                let holders = s.attempts.iter().filter(|a| a.phase == Phase::Held).count();
                s.most = s.most.max(holders as u8);
            }
            Action::GiveUp(a) | Action::Stop(a) => s.attempts[a].phase = Phase::Dead,
            Action::Expire(n, e) => s.nodes[n][e] = 0,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_P, |_, s: &State| s.most as usize <= P),
            Property::sometimes(FULL, |_, s: &State| s.most as usize == P),
        ]
    }
}

#[test]
fn permit_slots_each_a_redlock_mutex_admit_at_most_p_holders() {
    let model = Semaphore {
        rule: Rule::Slots,
        per_client: 1,
    };
    let start = Instant::now();
    let checker = model.clone().checker().threads(2).spawn_bfs().join();
    println!(
        "model_semaphore slots: {} unique states ({} visited), depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(AT_MOST_P) {
        panic!("counterexample:\n{}", model.trace(path));
    }
    checker.assert_properties();
}

#[test]
fn a_per_node_count_admits_p_plus_one_holders() {
    let model = Semaphore {
        rule: Rule::Count,
        per_client: 1,
    };
    let start = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([AT_MOST_P].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(AT_MOST_P);
    println!(
        "model_semaphore negative control (per-node count): counterexample after {} states, {:.2?}:\n{}",
        checker.unique_state_count(),
        start.elapsed(),
        model.trace(path)
    );
}
