//! Model check (with [`stateright`]) of the multi-resource acquire of issue 22
//! (`Redlock::lock_many`): per-node all-or-none plus a quorum excludes two
//! holders of sets that share a key.
//!
//! # The protocol
//!
//! N = 3 independent masters (quorum Q = 2), three keys, and three clients
//! locking `{A, B}`, `{B, C}` and `{A}` (a single-resource lock is a set of
//! one: the same rule with one key). An attempt has a fresh token and sends
//! its acquire to every node; on a node the script runs atomically:
//!
//! * [`Rule::AllOrNone`] (`ACQUIRE_MANY_LUA`): if none of the set's keys
//!   exists, set them all to the token and answer OK; else set nothing and
//!   answer busy;
//! * [`Rule::EachFree`], the negative control, drops the all-or-none check:
//!   the node sets those of the keys that are free and answers OK anyway.
//!
//! The client holds the lock once Q nodes answered OK; until then it may give
//! up at any moment (a timeout, the validity, a refusal), and a holder may
//! stop holding at any moment (release, end of validity). Messages are
//! delivered in any order, any time, including after their attempt died (a
//! late acquire still sets keys). As in `model_fencing/`, TTLs are
//! abstracted: a key holding a *dead* attempt's token may vanish at any step
//! (its expiry, or the release of the failed attempt or of the lock), a
//! *live* attempt's key never does (Redlock's validity ends before any of its
//! keys expires). Answers are recorded at once in what the client could know;
//! the client's decision to hold is a separate step, so late and lost
//! answers are covered. Node crashes are not modelled: a node restarted
//! without data must stay down longer than the TTL (Redlock's delayed
//! restart), which makes it one whose keys expired meanwhile, and `Expire`
//! covers that for dead attempts.
//!
//! # The property
//!
//! [`EXCLUSIVE`]: no two attempts hold at once with sets that share a key.
//! [`SHARED_KEY_HANDED_ON`] (sometimes) keeps the check from passing
//! vacuously: two clients whose sets share a key each held, one after the
//! other.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

const N: usize = 3;
const Q: u32 = 2;
const KEYS: usize = 3;
/// The clients' sets, as key bitmasks: {A, B}, {B, C}, {A}.
const SETS: [u8; 3] = [0b011, 0b110, 0b001];
const CLIENTS: usize = SETS.len();
const EXCLUSIVE: &str = "no two holders of sets that share a key";
const SHARED_KEY_HANDED_ON: &str = "a shared key held by two clients in turn";

/// What a node's acquire script does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// Every key set only if none exists; OK only then.
    AllOrNone,
    /// Negative control: the free keys are set, OK in any case.
    EachFree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Not started.
    Idle,
    /// Sent; `ok`: the nodes that answered OK so far.
    Acquiring {
        ok: u8,
    },
    Held,
    Dead,
}

/// One attempt: its client's set, what is still in flight to which node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Attempt {
    phase: Phase,
    /// Nodes whose acquire has not been delivered yet.
    in_flight: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// `nodes[n][k]`: 0 for no key, else the holding attempt's index + 1.
    nodes: [[u8; KEYS]; N],
    /// `attempts[c * per_client + i]`: client `c`'s attempt `i`.
    attempts: Vec<Attempt>,
    /// Which clients have held (a bitmask), for the `sometimes` property.
    have_held: u8,
    violated: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Start(usize),
    Deliver(usize, usize),
    Hold(usize),
    GiveUp(usize),
    Stop(usize),
    Expire(usize, usize),
}

#[derive(Clone)]
struct Many {
    rule: Rule,
    /// Attempts per client.
    per_client: usize,
}

impl Many {
    fn client(&self, a: usize) -> usize {
        a / self.per_client
    }

    fn set(&self, a: usize) -> u8 {
        SETS[self.client(a)]
    }

    fn live(s: &State, a: usize) -> bool {
        matches!(s.attempts[a].phase, Phase::Acquiring { .. } | Phase::Held)
    }

    /// The node runs attempt `a`'s acquire script; returns whether it said OK.
    fn run_script(&self, node: &mut [u8; KEYS], a: usize) -> bool {
        let set = self.set(a);
        let mine = (0..KEYS).filter(|&k| set & (1 << k) != 0);
        match self.rule {
            Rule::AllOrNone => {
                if mine.clone().any(|k| node[k] != 0) {
                    return false;
                }
                for k in mine {
                    node[k] = a as u8 + 1;
                }
                true
            }
            Rule::EachFree => {
                for k in mine {
                    if node[k] == 0 {
                        node[k] = a as u8 + 1;
                    }
                }
                true
            }
        }
    }

    fn name(&self, a: usize) -> String {
        let keys: Vec<&str> = ["A", "B", "C"]
            .iter()
            .enumerate()
            .filter(|(k, _)| self.set(a) & (1 << k) != 0)
            .map(|(_, n)| *n)
            .collect();
        format!(
            "c{}#{} {{{}}}",
            self.client(a),
            a % self.per_client,
            keys.join(",")
        )
    }

    fn describe(&self, action: &Action) -> String {
        match *action {
            Action::Start(a) => format!("{} sends its acquire to every node", self.name(a)),
            Action::Deliver(a, n) => format!("node {n} runs {}'s acquire", self.name(a)),
            Action::Hold(a) => format!("{} has a quorum of OKs: holds", self.name(a)),
            Action::GiveUp(a) => format!("{} gives up", self.name(a)),
            Action::Stop(a) => format!("{} stops holding", self.name(a)),
            Action::Expire(n, k) => format!("node {n}: key {} expires", ["A", "B", "C"][k]),
        }
    }

    fn summary(&self, s: &State) -> String {
        let nodes: Vec<String> = s
            .nodes
            .iter()
            .map(|node| {
                let keys: Vec<String> = node
                    .iter()
                    .zip(["A", "B", "C"])
                    .filter(|(v, _)| **v != 0)
                    .map(|(v, k)| format!("{k}={}", self.name(*v as usize - 1)))
                    .collect();
                format!("[{}]", keys.join(" "))
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

impl Model for Many {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            nodes: [[0; KEYS]; N],
            attempts: vec![
                Attempt {
                    phase: Phase::Idle,
                    in_flight: 0,
                };
                CLIENTS * self.per_client
            ],
            have_held: 0,
            violated: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for c in 0..CLIENTS {
            let mine = c * self.per_client..(c + 1) * self.per_client;
            // A client runs one attempt at a time, in order.
            if mine.clone().all(|a| !Self::live(s, a))
                && let Some(a) = mine.clone().find(|&a| s.attempts[a].phase == Phase::Idle)
            {
                actions.push(Action::Start(a));
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
            for k in 0..KEYS {
                let v = s.nodes[n][k];
                if v != 0 && !Self::live(s, v as usize - 1) {
                    actions.push(Action::Expire(n, k));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Start(a) => {
                s.attempts[a] = Attempt {
                    phase: Phase::Acquiring { ok: 0 },
                    in_flight: (1 << N) - 1,
                };
            }
            Action::Deliver(a, n) => {
                s.attempts[a].in_flight &= !(1 << n);
                let ok = self.run_script(&mut s.nodes[n], a);
                if let Phase::Acquiring { ok: seen } = &mut s.attempts[a].phase
                    && ok
                {
                    *seen |= 1 << n;
                }
            }
            Action::Hold(a) => {
                let set = self.set(a);
                let clash = (0..s.attempts.len()).any(|b| {
                    b != a && s.attempts[b].phase == Phase::Held && self.set(b) & set != 0
                });
                s.violated |= clash;
                s.attempts[a].phase = Phase::Held;
                s.have_held |= 1 << self.client(a);
            }
            Action::GiveUp(a) | Action::Stop(a) => s.attempts[a].phase = Phase::Dead,
            Action::Expire(n, k) => s.nodes[n][k] = 0,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(EXCLUSIVE, |_, s: &State| !s.violated),
            // Clients 0 and 1 share B.
            Property::sometimes(SHARED_KEY_HANDED_ON, |_, s: &State| {
                s.have_held & 0b011 == 0b011
            }),
        ]
    }
}

#[test]
fn all_or_none_plus_a_quorum_excludes_overlapping_holders() {
    let model = Many {
        rule: Rule::AllOrNone,
        per_client: 1,
    };
    let start = Instant::now();
    let checker = model.clone().checker().threads(2).spawn_bfs().join();
    println!(
        "model_many all-or-none: {} unique states ({} visited), depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(EXCLUSIVE) {
        panic!("counterexample:\n{}", model.trace(path));
    }
    checker.assert_properties();
}

#[test]
fn without_the_all_or_none_check_holders_overlap() {
    let model = Many {
        rule: Rule::EachFree,
        per_client: 2,
    };
    let start = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([EXCLUSIVE].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(EXCLUSIVE);
    println!(
        "model_many negative control (each free key set, OK anyway): counterexample after {} states, {:.2?}:\n{}",
        checker.unique_state_count(),
        start.elapsed(),
        model.trace(path)
    );
}
