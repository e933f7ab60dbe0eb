//! Model check (with [`stateright`]) of the quorum semaphore of issue 41
//! (`Redlock::semaphore`, `semaphore/mod.rs`): `permits` slots, each a
//! Redlock mutex, and an attempt that walks them, admit at most `permits`
//! holders, each on one slot; a per-node count of holders does not.
//!
//! # The protocol
//!
//! N = 3 independent masters (quorum Q = 2), P = 2 permits, three clients,
//! one attempt each. By default one client walks the slots and the other
//! two make one try each (at any slot: to the others, a try of a walk is
//! just a try); the opt-in bound (`--ignored`) has all three walk (6.4 M
//! states up to symmetry, 1 to 1.5 min in release).
//!
//! As `permit_attempt` does, an attempt starts at a slot (random in the
//! library; here every start, as a choice of the checker) and tries the
//! slots in turn, `start`, `start + 1`, ... (mod P). Each try is a whole
//! mutex attempt on the slot's key: a fresh token, an acquire sent to every
//! node, its own quorum decision. On a node the script runs atomically:
//!
//! * [`Rule::Slots`] (the library's): the node sets the slot's key to the
//!   token if it is free (`SET NX`), answering OK only then.
//! * [`Rule::KeepPartial`], a negative control: the same script, but a
//!   failed try keeps what it took (its token stays live, and its late
//!   acquires still count) while the attempt walks on.
//! * [`Rule::Count`], a negative control: the node admits the token if it
//!   holds fewer than P tokens of the resource, whichever they are (no
//!   slots, so no walk: one try).
//!
//! A try holds once Q nodes answered OK, and the attempt returns holding
//! that slot: it tries no further slot. Until then the try may fail at any
//! moment (refusals that make a quorum impossible, a node timeout, no
//! validity left); a failed try's token is dead: the library releases the
//! nodes it took (`Attempt::release_failed`, awaited before the next try),
//! and a late `OK` when it comes (`drive_stragglers`). Then the attempt
//! tries the next slot, or fails once every slot was tried. A client may
//! also give up in the middle of its walk (its deadline, a dropped future),
//! and a holder may stop holding at any moment.
//!
//! # Abstractions, and why they are sound
//!
//! * Messages are delivered in any order, any time, including after their
//!   try died (a late acquire still sets the key).
//! * TTLs, as in `model_many.rs`: a key holding a *dead* token may vanish at
//!   any step (its release, by the failed try's clean-up, the stragglers'
//!   task or the holder, or its expiry); a *live* token's key never does
//!   (Redlock's validity ends before any of its keys expires). Vanishing at
//!   any step covers every moment a release or an expiry may land, the
//!   prompt clean-up the library awaits among them.
//! * A dead token is dead for good, and nothing in the protocol reads a
//!   dead key's token again (no compare-and-delete of it decides anything:
//!   its vanishing is already free). So a dead key is kept as "dead" only,
//!   and a dead try's acquires still in flight as a count per node and
//!   slot: exactly the same runs, with fewer names for them.
//! * The start slot is any slot, and a try may fail at any moment (even
//!   after a quorum: no validity left): the random choice and the timing
//!   decide only how often attempts succeed, so leaving both to the checker
//!   covers the library's runs.
//! * The semaphore's count, which the permit script checks and keeps
//!   before it tries the slot (`node/permit_scripts.rs`), is left out:
//!   every client here asks with the same count, which then refuses nobody.
//! * Symmetry: nodes, clients with as many tries, and the slots' numbering
//!   turned round (a walk keeps its order) are interchangeable, so the full
//!   check stores one state for each class ([`representative`]).
//! * Node crashes are not modelled, for the reason `model_many.rs` gives (a
//!   node restarted without data stays down past the TTL, which the dead
//!   keys' vanishing covers).
//! * One attempt per client: a retry is a new attempt with fresh tokens,
//!   which another client's attempt already shows.
//!
//! # The properties
//!
//! * [`AT_MOST_P`]: never more than P holders at once.
//! * [`ONE_SLOT`]: a client holds at most one slot: for every client, at
//!   most one slot has its *live* tokens on a quorum of nodes. (Keys of a
//!   failed try may still sit on a quorum, a late `OK` after the try gave
//!   up: they are being released, grant the client nothing and count for
//!   nobody, as for the mutex.) In the library this follows from its
//!   structure: a try that holds ends the walk, and a failed try's token is
//!   dead before the next try starts.
//! * [`FULL`] and [`WALKED`] (sometimes) keep the checks from passing
//!   vacuously: P holders at once; a client that holds a slot other than
//!   its start slot, after the start slot's try failed.
//!
//! # Negative controls
//!
//! * [`Rule::Count`] admits P + 1 holders: nodes A, B, C admit {x, y},
//!   {y, z}, {x, z} (breaks [`AT_MOST_P`]).
//! * [`Rule::KeepPartial`] holds two slots: the start slot's try fails with
//!   its keys on a quorum (no validity left; or a timeout, and a late
//!   acquire lands) and keeps them, and the next slot's try takes a quorum:
//!   the client's live tokens sit on a quorum of both slots, keeping
//!   another client out (breaks [`ONE_SLOT`]).

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

const N: usize = 3;
const Q: u32 = 2;
const P: usize = 2;
const CLIENTS: usize = 3;
/// A node's key of a dead token.
const DEAD: u8 = u8::MAX;
const AT_MOST_P: &str = "never more than P holders at once";
const ONE_SLOT: &str = "a client holds at most one slot";
const FULL: &str = "P holders at once";
const WALKED: &str = "a client holds a slot after its start slot's try failed";

/// What a node's acquire script does, and what a failed try leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// The try's slot, set only if free; a failed try's token is dead.
    Slots,
    /// Negative control: a failed try keeps its keys while the walk goes on.
    KeepPartial,
    /// Negative control: admitted while the node holds fewer than P tokens.
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    Idle,
    /// Its try `i` (on slot `start + i`) is out; `ok`: the nodes that
    /// answered OK to it so far.
    Trying {
        i: u8,
        ok: u8,
    },
    /// Holding the slot of its try `i`.
    Held {
        i: u8,
    },
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Client {
    /// How many tries its attempt may make: P for a walker, or 1.
    tries: u8,
    phase: Phase,
    /// The slot its walk starts at.
    start: u8,
    /// Per live try: the nodes whose acquire has not been delivered yet.
    in_flight: [u8; P],
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct State {
    /// `nodes[n][e]`: 0 for a free slot (a free place for [`Rule::Count`]),
    /// [`DEAD`], or the live token there, [`token`]`(client, try)`.
    nodes: [[u8; P]; N],
    /// `late[n][e]`: dead tries' acquires of slot `e` on its way to node
    /// `n` ([`Rule::Count`]: in place 0, for any place).
    late: [[u8; P]; N],
    clients: [Client; CLIENTS],
    /// The most holders seen at once.
    most: u8,
    /// Some client held a slot after a failed try.
    walked: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Client `c` starts its walk at slot `s` (its try 0 goes out).
    Start(usize, u8),
    /// Node `n` runs the acquire of client `c`'s try `i`.
    Deliver(usize, u8, usize),
    /// Node `n` runs a dead try's acquire of slot `e`.
    DeliverLate(usize, usize),
    Hold(usize),
    /// The current try fails: the next slot's try goes out, or the attempt
    /// fails.
    Fail(usize),
    /// The client gives up in the middle of its walk.
    GiveUp(usize),
    Stop(usize),
    /// Node `n`: the dead key in place `e` is released or expires.
    Vanish(usize, usize),
}

/// The token of client `c`'s try `i`; 0 is no token.
fn token(c: usize, i: u8) -> u8 {
    (c * P) as u8 + i + 1
}

/// The client and try of a live token.
fn owner(token: u8) -> (usize, u8) {
    let t = token - 1;
    (t as usize / P, t % P as u8)
}

/// The orders of three things: the permutations of the clients and of the
/// nodes.
const ORDERS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [0, 2, 1],
    [1, 0, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
];

/// `s` with its clients renamed by `clients`, its nodes by `nodes`, and its
/// slots turned by `turn` (slot `e` becomes `e + turn`, and so does a
/// walk's start: the walk's order is kept).
fn renamed(s: &State, clients: &[usize; CLIENTS], nodes: &[usize; N], turn: usize) -> State {
    // Plain loops: this runs for every state the check generates, many
    // times, and a debug build pays for every closure.
    let mut mask = [0u8; 1 << N];
    for (m, out) in mask.iter_mut().enumerate() {
        for (n, &to) in nodes.iter().enumerate() {
            if m & (1 << n) != 0 {
                *out |= 1 << to;
            }
        }
    }
    let mut out = s.clone();
    for (c, cl) in s.clients.iter().enumerate() {
        let to = &mut out.clients[clients[c]];
        to.tries = cl.tries;
        to.phase = match cl.phase {
            Phase::Trying { i, ok } => Phase::Trying {
                i,
                ok: mask[ok as usize],
            },
            p => p,
        };
        // An idle client's start means nothing yet.
        to.start = match cl.phase {
            Phase::Idle => 0,
            _ => (cl.start + turn as u8) % P as u8,
        };
        for i in 0..P {
            to.in_flight[i] = mask[cl.in_flight[i] as usize];
        }
    }
    for (n, &to) in nodes.iter().enumerate() {
        for e in 0..P {
            let v = s.nodes[n][e];
            out.nodes[to][(e + turn) % P] = if v == 0 || v == DEAD {
                v
            } else {
                let t = v - 1;
                token(clients[t as usize / P], t % P as u8)
            };
            out.late[to][(e + turn) % P] = s.late[n][e];
        }
    }
    out
}

/// `s` with its nodes in a canonical order: sorted by everything the state
/// says about each (its keys, the late acquires to it, each client's bits
/// for it). Nodes with equal columns are equal, so their order is moot.
fn nodes_sorted(s: &State) -> State {
    let column = |n: usize| {
        let bits: [u8; CLIENTS] = std::array::from_fn(|c| {
            let cl = &s.clients[c];
            let ok = match cl.phase {
                Phase::Trying { ok, .. } => ok,
                _ => 0,
            };
            let bit = |m: u8| (m >> n) & 1;
            bit(ok) | bit(cl.in_flight[0]) << 1 | bit(cl.in_flight[1]) << 2
        });
        (s.nodes[n], s.late[n], bits)
    };
    let mut columns: [_; N] = std::array::from_fn(|n| (column(n), n));
    columns.sort_unstable();
    let mut place = [0; N];
    for (k, &(_, n)) in columns.iter().enumerate() {
        place[n] = k;
    }
    renamed(s, &IDENTITY, &place, 0)
}

const IDENTITY: [usize; 3] = [0, 1, 2];

/// The representative of `s` for symmetry reduction: nodes, clients (with
/// their number of tries) and the slots' turn are interchangeable (every
/// node runs the same script, every client with as many tries the same
/// attempt, and a walk is the same from any start), so the least of `s`
/// renamed those ways stands for all of them: each client order and slot
/// turn, with the nodes then sorted.
fn representative(s: &State) -> State {
    let mut best: Option<State> = None;
    let alike =
        |o: &[usize; CLIENTS]| (0..CLIENTS).all(|c| s.clients[o[c]].tries == s.clients[c].tries);
    for clients in ORDERS.iter().filter(|o| alike(o)) {
        for turn in 0..P {
            let r = nodes_sorted(&renamed(s, clients, &IDENTITY, turn));
            if best.as_ref().is_none_or(|b| r < *b) {
                best = Some(r);
            }
        }
    }
    best.unwrap_or_else(|| s.clone())
}

#[derive(Clone)]
struct Semaphore {
    rule: Rule,
    /// How many clients walk the slots; the others' attempts make one try
    /// (at the slot they start at). [`Rule::Count`] has no walk.
    walkers: usize,
}

impl Semaphore {
    /// The slot client `c`'s try `i` asks for.
    fn slot(c: &Client, i: u8) -> usize {
        ((c.start + i) % P as u8) as usize
    }

    /// Whether client `c`'s try `i` is live: its keys may not vanish.
    fn live(&self, c: &Client, i: u8) -> bool {
        let current = match c.phase {
            Phase::Trying { i, .. } | Phase::Held { i } => i,
            Phase::Idle | Phase::Done => return false,
        };
        i == current || (self.rule == Rule::KeepPartial && i < current)
    }

    /// Client `c`'s tries that `c`'s new phase leaves dead become dead: their
    /// keys are [`DEAD`], their acquires in flight join `late`.
    fn bury(&self, s: &mut State, c: usize) {
        let cl = s.clients[c];
        for i in 0..P as u8 {
            if self.live(&cl, i) {
                continue;
            }
            let t = token(c, i);
            let e = match self.rule {
                Rule::Count => 0,
                _ => Self::slot(&cl, i),
            };
            for n in 0..N {
                for v in &mut s.nodes[n] {
                    if *v == t {
                        *v = DEAD;
                    }
                }
                if cl.in_flight[i as usize] & (1 << n) != 0 {
                    s.late[n][e] += 1;
                }
            }
            s.clients[c].in_flight[i as usize] = 0;
        }
    }

    /// How many slots hold client `c`'s live tokens on a quorum of nodes.
    fn slots_held(s: &State, c: usize) -> usize {
        (0..P)
            .filter(|&e| {
                let on = (0..N)
                    .filter(|&n| {
                        let v = s.nodes[n][e];
                        v != 0 && v != DEAD && owner(v).0 == c
                    })
                    .count();
                on >= Q as usize
            })
            .count()
    }

    /// The node runs the acquire of token `me` (or [`DEAD`]) for `slot`;
    /// returns whether it said OK.
    fn run_script(&self, node: &mut [u8; P], me: u8, slot: usize) -> bool {
        match self.rule {
            Rule::Slots | Rule::KeepPartial => {
                let s = &mut node[slot];
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

    fn describe(&self, s: &State, action: &Action) -> String {
        match *action {
            Action::Start(c, slot) => match self.rule {
                Rule::Count => format!("c{c} sends its acquire"),
                _ => format!("c{c} starts its walk at slot {slot}"),
            },
            Action::Deliver(c, i, n) => match self.rule {
                Rule::Count => format!("node {n} runs c{c}'s acquire"),
                _ => format!(
                    "node {n} runs c{c}'s acquire of slot {}",
                    Self::slot(&s.clients[c], i)
                ),
            },
            Action::DeliverLate(n, e) => format!("node {n} runs a dead try's acquire of slot {e}"),
            Action::Hold(c) => format!("c{c} has a quorum of OKs: holds"),
            Action::Fail(c) => match s.clients[c].phase {
                Phase::Trying { i, .. } if i + 1 < s.clients[c].tries => format!(
                    "c{c}'s try fails; it tries slot {}",
                    Self::slot(&s.clients[c], i + 1)
                ),
                _ => format!("c{c}'s try fails: no slot left"),
            },
            Action::GiveUp(c) => format!("c{c} gives up"),
            Action::Stop(c) => format!("c{c} stops holding"),
            Action::Vanish(n, e) => format!("node {n}: place {e}'s dead key goes"),
        }
    }

    fn summary(s: &State) -> String {
        let nodes: Vec<String> = s
            .nodes
            .iter()
            .map(|node| {
                let e: Vec<String> = node
                    .iter()
                    .map(|&v| match v {
                        0 => "-".into(),
                        DEAD => "dead".into(),
                        v => {
                            let (c, i) = owner(v);
                            format!("c{c}.{i}")
                        }
                    })
                    .collect();
                format!("[{}]", e.join(" "))
            })
            .collect();
        let held: Vec<String> = (0..CLIENTS)
            .filter_map(|c| match s.clients[c].phase {
                Phase::Held { i } => Some(format!("c{c}@{}", Self::slot(&s.clients[c], i))),
                _ => None,
            })
            .collect();
        format!("nodes {} holders [{}]", nodes.join(" "), held.join(", "))
    }

    fn trace(&self, path: Path<State, Action>) -> String {
        let mut out = String::new();
        for (state, action) in path.into_vec() {
            out.push_str(&format!("        {}\n", Self::summary(&state)));
            if let Some(action) = action {
                out.push_str(&format!("     -> {}\n", self.describe(&state, &action)));
            }
        }
        out
    }
}

impl Model for Semaphore {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let walks = self.rule != Rule::Count;
        let clients = std::array::from_fn(|c| Client {
            tries: if walks && c < self.walkers {
                P as u8
            } else {
                1
            },
            phase: Phase::Idle,
            start: 0,
            in_flight: [0; P],
        });
        vec![State {
            nodes: [[0; P]; N],
            late: [[0; P]; N],
            clients,
            most: 0,
            walked: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, cl) in s.clients.iter().enumerate() {
            for i in 0..P as u8 {
                for n in 0..N {
                    if cl.in_flight[i as usize] & (1 << n) != 0 {
                        actions.push(Action::Deliver(c, i, n));
                    }
                }
            }
            match cl.phase {
                Phase::Idle => {
                    let starts = match self.rule {
                        Rule::Count => 1,
                        _ => P as u8,
                    };
                    for slot in 0..starts {
                        actions.push(Action::Start(c, slot));
                    }
                }
                Phase::Trying { i, ok } => {
                    if ok.count_ones() >= Q {
                        actions.push(Action::Hold(c));
                    }
                    actions.push(Action::Fail(c));
                    if i + 1 < cl.tries {
                        actions.push(Action::GiveUp(c));
                    }
                }
                Phase::Held { .. } => actions.push(Action::Stop(c)),
                Phase::Done => {}
            }
        }
        for n in 0..N {
            for e in 0..P {
                if s.late[n][e] > 0 {
                    actions.push(Action::DeliverLate(n, e));
                }
                if s.nodes[n][e] == DEAD {
                    actions.push(Action::Vanish(n, e));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Start(c, slot) => {
                let cl = &mut s.clients[c];
                cl.start = slot;
                cl.phase = Phase::Trying { i: 0, ok: 0 };
                cl.in_flight[0] = (1 << N) - 1;
            }
            Action::Deliver(c, i, n) => {
                let slot = Self::slot(&s.clients[c], i);
                s.clients[c].in_flight[i as usize] &= !(1 << n);
                let said_ok = self.run_script(&mut s.nodes[n], token(c, i), slot);
                if let Phase::Trying { i: now, ok } = &mut s.clients[c].phase
                    && *now == i
                    && said_ok
                {
                    *ok |= 1 << n;
                }
            }
            Action::DeliverLate(n, e) => {
                s.late[n][e] -= 1;
                self.run_script(&mut s.nodes[n], DEAD, e);
            }
            Action::Hold(c) => {
                let Phase::Trying { i, .. } = s.clients[c].phase else {
                    return None;
                };
                s.clients[c].phase = Phase::Held { i };
                s.walked |= i > 0;
                let holders = s
                    .clients
                    .iter()
                    .filter(|c| matches!(c.phase, Phase::Held { .. }))
                    .count();
                s.most = s.most.max(holders as u8);
            }
            Action::Fail(c) => {
                let Phase::Trying { i, .. } = s.clients[c].phase else {
                    return None;
                };
                let cl = &mut s.clients[c];
                if i + 1 < cl.tries {
                    cl.phase = Phase::Trying { i: i + 1, ok: 0 };
                    cl.in_flight[i as usize + 1] = (1 << N) - 1;
                } else {
                    cl.phase = Phase::Done;
                }
                self.bury(&mut s, c);
            }
            Action::GiveUp(c) | Action::Stop(c) => {
                s.clients[c].phase = Phase::Done;
                self.bury(&mut s, c);
            }
            Action::Vanish(n, e) => s.nodes[n][e] = 0,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_P, |_, s: &State| s.most as usize <= P),
            Property::always(ONE_SLOT, |_, s: &State| {
                (0..CLIENTS).all(|c| Semaphore::slots_held(s, c) <= 1)
            }),
            Property::sometimes(FULL, |_, s: &State| s.most as usize == P),
            Property::sometimes(WALKED, |_, s: &State| s.walked),
        ]
    }
}

/// The check of the library's rule with `walkers` walking clients.
fn check_slots(walkers: usize) {
    let model = Semaphore {
        rule: Rule::Slots,
        walkers,
    };
    let start = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(2)
        .symmetry_fn(representative)
        .spawn_dfs()
        .join();
    println!(
        "model_semaphore slots, {walkers} walking: {} states up to symmetry ({} visited), depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    for property in [AT_MOST_P, ONE_SLOT] {
        if let Some(path) = checker.discovery(property) {
            panic!("counterexample to '{property}':\n{}", model.trace(path));
        }
    }
    checker.assert_properties();
}

#[test]
fn permit_slots_walked_in_turn_admit_at_most_p_holders_of_one_slot_each() {
    check_slots(1);
}

#[test]
#[ignore = "every client walks: 6.4 M states up to symmetry, about 1 to 1.5 min in release; run with --ignored"]
fn with_every_client_walking() {
    check_slots(CLIENTS);
}

/// The checker finds a counterexample to `property` under `rule`.
fn counterexample(rule: Rule, property: &'static str, what: &str) {
    let model = Semaphore { rule, walkers: 1 };
    let start = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(property);
    println!(
        "model_semaphore negative control ({what}): '{property}' broken after {} states, {:.2?}:\n{}",
        checker.unique_state_count(),
        start.elapsed(),
        model.trace(path)
    );
}

#[test]
fn a_per_node_count_admits_p_plus_one_holders() {
    counterexample(Rule::Count, AT_MOST_P, "per-node count");
}

#[test]
fn a_walk_that_keeps_a_failed_slots_keys_holds_two_slots() {
    counterexample(Rule::KeepPartial, ONE_SLOT, "a failed try keeps its keys");
}
