//! Model check (with [`stateright`]) of issue 37's rule for the Durable fence
//! counter of a per-request resource: the counter expires a retention `R`
//! after each fence that raised it, and a new holder's token then starts
//! over. Is that sound for a store that keeps what it accepted for `K`?
//!
//! # The protocol, as in `model_fencing.rs`, with time
//!
//! N = 3 nodes, quorum 2; attempts of the lock on one resource (one
//! idempotency key). An attempt sends `SET key tok NX PX` to every node; a
//! node that sets the key answers OK with its counter (0 once expired). With
//! a quorum of OKs the client picks `T = max + 1` over any quorum of them,
//! then fences: on each node, only while the key holds its `tok`, the
//! counter becomes `max(counter, T)` with its expiry set to `now + R`
//! (`FENCE_LUA` with `PX`). The attempt holds from the moment a quorum
//! applied the fence and still holds its keys.
//!
//! The store is the idempotency layer's `RedisStore`: a holder writes its
//! record (its token) on a node only while that node's key still holds its
//! `tok` (`RECORD_PUT_LUA`); a record lives `K` ticks; a reader compares the
//! records it finds by token ("the newest wins").
//!
//! Time: a global clock `now` advances by [`Action::Tick`] up to
//! `max_time`; all node clocks run at its rate (the library's `+1% +1 s`
//! margin is what covers different rates). A key lives `L` ticks from its
//! `SET` (the hold cap plus the TTL: renewals never push it further); a
//! request reaches its node within `D` ticks of the attempt's start or
//! never (the margin's second is this bound; a message delayed longer than
//! the margin is outside the library's rule). Any message may be delayed
//! within that, reordered or lost; answers are folded into what the client
//! could know, as in `model_fencing.rs`. A holder's or a dead attempt's key
//! may be released at any step; keys and counters past their expiry read as
//! absent.
//!
//! # The property
//!
//! [`ORDERED`]: whenever a node accepts a record, every other record the
//! store still holds (unexpired, on any node) of another attempt has a
//! token on the same side as its holder's start: smaller if that holder
//! began holding earlier, larger if later, never equal. That is "a protected
//! store never accepts a write with a token lower than one it already
//! accepted while it still holds that token", stated so that a late record of
//! an earlier holder (lower token, lower order) is allowed, as the reader's
//! comparison puts it right.
//!
//! [`RESTARTED`] (sometimes) keeps the passing check honest: some run has a
//! holder whose acquire read an expired counter and that then wrote a record.
//!
//! # The checks
//!
//! Two attempts, `D = 0` (a request lands within the tick it is sent: the
//! margin's granularity), `L = 1`, `K = 2`, time up to 3, breadth-first:
//!
//! * passing: `R = D + L + K = 3` (the library's rule, `hold + ttl + keep`
//!   plus the margin): no counterexample, and an example of [`RESTARTED`]
//!   (608 666 states, depth 31; about 1 s in the test build, which
//!   optimizes this package);
//! * negative control: `R = 1 < K` (a counter that expires while a record
//!   of its token lives): the checker finds the second holder handed the
//!   token of the first, whose record is still on node A (171 936 states,
//!   17 steps, printed).
//!
//! `delay` > 0 is supported (a `SET` that reaches a node up to `D` ticks
//! late, taking the key there later): with `D = 1`, `K = 1`, `R = K` the
//! checker finds the same backwards token through a late `SET` (5.4 million
//! states, about 4 minutes), which is why the rule adds the margin.
//!
//! ```text
//! cargo test -p redlock-models --test model_fence_retention -- --nocapture
//! ```

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

const N: usize = 3;
const Q: u32 = 2;
const ALL: u8 = (1 << N) - 1;
const MAX_ATTEMPTS: usize = 3;
const NODE_NAMES: [char; N] = ['A', 'B', 'C'];

const ORDERED: &str = "records are ordered by token as their holders began";
const RESTARTED: &str = "a holder that read an expired counter wrote a record";

/// The model's bounds.
#[derive(Clone, Debug)]
struct Retention {
    attempts: usize,
    /// Ticks a request may take to reach its node (`D`).
    delay: u8,
    /// Ticks a key lives from its `SET` (`L`: hold cap + TTL).
    key_life: u8,
    /// Ticks a record lives (`K`).
    keep: u8,
    /// Ticks a counter lives after a fence (`R`).
    retention: u8,
    max_time: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// `SET`s sent at `start`; `read[i]`: node `i`'s OK with its counter.
    Acquiring {
        start: u8,
        read: [Option<u8>; N],
    },
    /// Token picked, fences sent; `applied`: the nodes that applied it.
    Fencing {
        start: u8,
        token: u8,
        applied: u8,
    },
    /// Holder number `order` (0 first) with `token`.
    Held {
        start: u8,
        token: u8,
        order: u8,
    },
}

impl Phase {
    fn start(self) -> Option<u8> {
        match self {
            Phase::Idle => None,
            Phase::Acquiring { start, .. }
            | Phase::Fencing { start, .. }
            | Phase::Held { start, .. } => Some(start),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Node {
    /// The lock key: its attempt and expiry.
    key: Option<(u8, u8)>,
    /// The counter and its expiry (value 0: none).
    counter: (u8, u8),
    /// The record: attempt, token, expiry.
    record: Option<(u8, u8, u8)>,
    /// A counter of the node expired: a later read of 0 is a restart.
    lapsed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    nodes: [Node; N],
    phases: [Phase; MAX_ATTEMPTS],
    /// `SET`s and fences not yet delivered, per attempt, as node masks.
    sets: [u8; MAX_ATTEMPTS],
    fences: [u8; MAX_ATTEMPTS],
    /// Whether the attempt's acquire read a counter that had expired.
    read_expired: [bool; MAX_ATTEMPTS],
    holders: u8,
    violated: bool,
    restarted_wrote: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Start(usize),
    DeliverSet(usize, usize),
    /// Pick over the quorum of the OK nodes in the mask.
    Pick(usize, u8),
    DeliverFence(usize, usize),
    Hold(usize),
    Release(usize, usize),
    Write(usize, usize),
}

impl State {
    fn key_of(&self, i: usize) -> Option<u8> {
        self.nodes[i]
            .key
            .filter(|&(_, exp)| self.now < exp)
            .map(|(a, _)| a)
    }

    fn counter(&self, i: usize) -> u8 {
        let (v, exp) = self.nodes[i].counter;
        if self.now < exp { v } else { 0 }
    }
}

impl State {
    /// Drops what expired at `now`, and the `SET`s that can no longer
    /// arrive, so that states differing only in them are one.
    fn expire(&mut self, m: &Retention) {
        let now = self.now;
        for n in &mut self.nodes {
            if n.key.is_some_and(|(_, exp)| now >= exp) {
                n.key = None;
            }
            if n.counter.0 > 0 && now >= n.counter.1 {
                n.counter = (0, 0);
                n.lapsed = true;
            }
            if n.record.is_some_and(|(_, _, exp)| now >= exp) {
                n.record = None;
            }
        }
        for a in 0..m.attempts {
            if self.phases[a]
                .start()
                .is_some_and(|start| now > start.saturating_add(m.delay))
            {
                self.sets[a] = 0;
            }
        }
    }
}

impl Model for Retention {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        assert!(self.attempts <= MAX_ATTEMPTS);
        let node = Node {
            key: None,
            counter: (0, 0),
            record: None,
            lapsed: false,
        };
        vec![State {
            now: 0,
            nodes: [node; N],
            phases: [Phase::Idle; MAX_ATTEMPTS],
            sets: [0; MAX_ATTEMPTS],
            fences: [0; MAX_ATTEMPTS],
            read_expired: [false; MAX_ATTEMPTS],
            holders: 0,
            violated: false,
            restarted_wrote: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.violated {
            return;
        }
        if s.now < self.max_time {
            actions.push(Action::Tick);
        }
        for a in 0..self.attempts {
            let phase = s.phases[a];
            let in_time = phase
                .start()
                .is_some_and(|start| s.now <= start.saturating_add(self.delay));
            for i in 0..N {
                if s.sets[a] & (1 << i) != 0 && in_time {
                    actions.push(Action::DeliverSet(a, i));
                }
                // A late fence only raises a counter while the key holds the
                // attempt's token: it may come at any time.
                if s.fences[a] & (1 << i) != 0 {
                    actions.push(Action::DeliverFence(a, i));
                }
                let holds_key = s.key_of(i) == Some(a as u8);
                if holds_key && matches!(phase, Phase::Held { .. }) {
                    actions.push(Action::Release(a, i));
                }
                if holds_key && matches!(phase, Phase::Held { .. }) {
                    actions.push(Action::Write(a, i));
                }
            }
            match phase {
                // Attempts start in order: attempt `a` after `a - 1` started.
                Phase::Idle if a == 0 || s.phases[a - 1] != Phase::Idle => {
                    actions.push(Action::Start(a));
                }
                Phase::Acquiring { read, .. } => {
                    let ok = (0..N).filter(|&i| read[i].is_some());
                    let mask: u8 = ok.fold(0, |m, i| m | (1 << i));
                    for pick in [0b011u8, 0b101, 0b110] {
                        if mask & pick == pick {
                            actions.push(Action::Pick(a, pick));
                        }
                    }
                }
                Phase::Fencing { applied, .. } => {
                    let keys = (0..N).filter(|&i| s.key_of(i) == Some(a as u8)).count();
                    if applied.count_ones() >= Q && keys as u32 >= Q {
                        actions.push(Action::Hold(a));
                    }
                }
                _ => {}
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        let now = s.now;
        match action {
            Action::Tick => {
                s.now += 1;
                s.expire(self);
            }
            Action::Start(a) => {
                s.phases[a] = Phase::Acquiring {
                    start: now,
                    read: [None; N],
                };
                s.sets[a] = ALL;
            }
            Action::DeliverSet(a, i) => {
                s.sets[a] &= !(1 << i);
                if s.key_of(i).is_some() {
                    return Some(s);
                }
                s.nodes[i].key = Some((a as u8, now.saturating_add(self.key_life)));
                let counter = s.counter(i);
                if counter == 0 && s.nodes[i].lapsed {
                    s.read_expired[a] = true;
                }
                if let Phase::Acquiring { read, .. } = &mut s.phases[a] {
                    read[i] = Some(counter);
                }
            }
            Action::Pick(a, pick) => {
                let Phase::Acquiring { start, read } = s.phases[a] else {
                    return None;
                };
                let max = (0..N)
                    .filter(|&i| pick & (1 << i) != 0)
                    .filter_map(|i| read[i])
                    .max()?;
                s.phases[a] = Phase::Fencing {
                    start,
                    token: max + 1,
                    applied: 0,
                };
                s.fences[a] = ALL;
            }
            Action::DeliverFence(a, i) => {
                s.fences[a] &= !(1 << i);
                let Phase::Fencing { token, .. } = s.phases[a] else {
                    return Some(s);
                };
                if s.key_of(i) == Some(a as u8) {
                    let value = s.counter(i).max(token);
                    s.nodes[i].counter = (value, now.saturating_add(self.retention));
                    if let Phase::Fencing { applied, .. } = &mut s.phases[a] {
                        *applied |= 1 << i;
                    }
                }
            }
            Action::Hold(a) => {
                let Phase::Fencing { start, token, .. } = s.phases[a] else {
                    return None;
                };
                s.phases[a] = Phase::Held {
                    start,
                    token,
                    order: s.holders,
                };
                s.holders += 1;
            }
            Action::Release(a, i) => {
                if s.key_of(i) == Some(a as u8) {
                    s.nodes[i].key = None;
                }
            }
            Action::Write(a, i) => {
                let Phase::Held { token, order, .. } = s.phases[a] else {
                    return None;
                };
                for j in (0..N).filter(|&j| j != i) {
                    let Some((b, t, exp)) = s.nodes[j].record else {
                        continue;
                    };
                    if b as usize == a || now >= exp {
                        continue;
                    }
                    let Phase::Held { order: o, .. } = s.phases[b as usize] else {
                        continue;
                    };
                    if t == token || (o < order) != (t < token) {
                        s.violated = true;
                    }
                }
                s.nodes[i].record = Some((a as u8, token, now.saturating_add(self.keep)));
                if s.read_expired[a] {
                    s.restarted_wrote = true;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ORDERED, |_, s: &State| !s.violated),
            Property::sometimes(RESTARTED, |_, s: &State| s.restarted_wrote),
        ]
    }
}

impl Retention {
    fn summary(&self, s: &State) -> String {
        let nodes: Vec<String> = (0..N)
            .map(|i| {
                let n = &s.nodes[i];
                let key = n.key.map_or("-".into(), |(a, e)| format!("a{a}<{e}"));
                let (c, ce) = n.counter;
                let rec = n
                    .record
                    .map_or("-".into(), |(a, t, e)| format!("a{a}:T{t}<{e}"));
                format!("{}[key {key} ctr {c}<{ce} rec {rec}]", NODE_NAMES[i])
            })
            .collect();
        let phases: Vec<String> = (0..self.attempts)
            .map(|a| format!("a{a} {:?}", s.phases[a]))
            .collect();
        format!("t={} {} | {}", s.now, nodes.join(" "), phases.join("; "))
    }

    fn trace(&self, path: Path<State, Action>) -> String {
        let mut out = String::new();
        for (step, (state, action)) in path.into_vec().into_iter().enumerate() {
            out.push_str(&format!("        {}\n", self.summary(&state)));
            if let Some(action) = action {
                out.push_str(&format!("{:>4}. {action:?}\n", step + 1));
            }
        }
        out
    }
}

fn model(retention: u8) -> Retention {
    Retention {
        attempts: 2,
        delay: 0,
        key_life: 1,
        keep: 2,
        retention,
        max_time: 3,
    }
}

#[test]
fn a_retention_of_delay_plus_key_life_plus_keep_keeps_records_ordered() {
    let m = model(3);
    assert_eq!(m.retention, m.delay + m.key_life + m.keep);
    let shown = m.clone();
    let start = Instant::now();
    let checker = m.checker().spawn_bfs().join();
    println!(
        "passing (R = D + L + K = {}): {} unique states ({} total), depth {}, {:.2?}",
        shown.retention,
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(ORDERED) {
        panic!("counterexample:\n{}", shown.trace(path));
    }
    checker.assert_properties();
}

#[test]
fn a_counter_that_expires_while_its_record_lives_goes_backwards() {
    let m = model(1);
    assert!(m.retention < m.keep, "the negative control: R < K");
    let shown = m.clone();
    let start = Instant::now();
    let checker = m
        .checker()
        .finish_when(HasDiscoveries::AnyOf([ORDERED].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(ORDERED);
    println!(
        "negative control (R = {} < K): found after {} unique states, {:.2?}:\n{}",
        shown.retention,
        checker.unique_state_count(),
        start.elapsed(),
        shown.trace(path)
    );
}
