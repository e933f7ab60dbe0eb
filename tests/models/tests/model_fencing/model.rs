//! The protocol's steps as a stateright `Model`, and its properties.

use stateright::{Model, Path, Property};

use super::*;

impl Fencing {
    pub(super) fn attempt_id(&self, c: usize, k: u8) -> u8 {
        c as u8 * PER_CLIENT + k
    }

    pub(super) fn attempt_name(&self, a: u8) -> String {
        format!("c{}#{}", a / PER_CLIENT, a % PER_CLIENT)
    }

    /// The client's live attempt and its phase.
    pub(super) fn current(&self, s: &State, c: usize) -> Option<(u8, Phase)> {
        let cl = &s.clients[c];
        match cl.phase {
            Phase::Idle => None,
            p => Some((self.attempt_id(c, cl.started - 1), p)),
        }
    }

    /// The phase of attempt `a` if it is live.
    pub(super) fn live(&self, s: &State, a: u8) -> Option<Phase> {
        let c = (a / PER_CLIENT) as usize;
        self.current(s, c)
            .and_then(|(cur, p)| (cur == a).then_some(p))
    }

    pub(super) fn can_restart(&self, s: &State, i: usize) -> bool {
        let n = &s.nodes[i];
        !n.up
            && n.down_ticks >= self.min_down_ticks
            && (!self.restart_after_locks || n.lost.is_none_or(|a| self.live(s, a).is_none()))
    }

    /// The value an OK read contributes to `max`, per the rule.
    pub(super) fn read_value(&self, counter: u8, time: u8) -> u8 {
        match self.rule {
            Rule::NaiveIncr | Rule::Counter => counter,
            Rule::Hybrid => counter.max(time),
        }
    }

    pub(super) fn record_holder(s: &mut State, t: u8) {
        if s.holders > 0 && t <= s.max_token {
            s.violated = true;
        }
        let down = s.nodes.iter().filter(|n| !n.up).count();
        if usize::from(s.crashes) > down {
            s.held_after_restart = true;
        }
        if s.counter_expired {
            s.held_after_expiry = true;
        }
        s.max_token = s.max_token.max(t);
        s.holders += 1;
    }

    pub(super) fn skew(&self) -> u8 {
        self.offsets
            .iter()
            .map(|o| o.iter().max().unwrap() - o.iter().min().unwrap())
            .max()
            .unwrap_or(0)
    }

    /// One line per state, for the printed counterexamples.
    pub(super) fn summary(&self, s: &State) -> String {
        let mut out = String::new();
        if self.rule == Rule::Hybrid {
            out.push_str(&format!("now={} ", s.now));
        }
        for (i, n) in s.nodes.iter().enumerate() {
            let key = n.key.map_or("-".into(), |a| self.attempt_name(a));
            let up = if n.up { "" } else { " DOWN" };
            out.push_str(&format!(
                "{}[key={key} ctr={}{up}] ",
                NODE_NAMES[i], n.counter
            ));
        }
        for c in 0..self.clients {
            let p = match s.clients[c].phase {
                Phase::Idle => "idle".to_string(),
                Phase::Acquiring { ok, read, .. } => {
                    let reads: Vec<String> = (0..N)
                        .filter(|&i| ok & bit(i) != 0)
                        .map(|i| format!("{}:{}", NODE_NAMES[i], read[i]))
                        .collect();
                    format!("acquiring OKs read {{{}}}", reads.join(" "))
                }
                Phase::Fencing { t, applied } => {
                    format!("fencing T={t} applied={{{}}}", nodes_of(applied))
                }
                Phase::Holding { t } => format!("HOLDS T={t}"),
            };
            out.push_str(&format!("| c{c}: {p} "));
        }
        out.push_str(&format!(
            "| holders={} max_token={}{}",
            s.holders,
            s.max_token,
            if s.violated { " VIOLATED" } else { "" }
        ));
        out
    }

    pub(super) fn describe(&self, action: &Action) -> String {
        match *action {
            Action::Start(c) => format!("c{c} starts an attempt: SET NX to A, B, C"),
            Action::Pick(c, from) => {
                format!(
                    "c{c} picks its token from the OKs of {{{}}}",
                    nodes_of(from)
                )
            }
            Action::Hold(c) => format!("c{c} counts a quorum of fence acks: holds the lock"),
            Action::Abandon(c) => format!("c{c}'s attempt dies (gives up / validity ends)"),
            Action::Expire(i) => format!("{}: the dead attempt's key expires", NODE_NAMES[i]),
            Action::ExpireCounter(i) => format!("{}: the idle counter expires", NODE_NAMES[i]),
            Action::Crash(i) => format!("{} crashes", NODE_NAMES[i]),
            Action::Restart(i) => format!("{} restarts", NODE_NAMES[i]),
            Action::Tick => "time advances".into(),
            Action::Deliver(m) => match m {
                Msg::Set { a, node } => {
                    format!(
                        "{} gets SET from {}",
                        NODE_NAMES[node as usize],
                        self.attempt_name(a)
                    )
                }
                Msg::Fence { a, node, t } => format!(
                    "{} gets fence T={t} from {}",
                    NODE_NAMES[node as usize],
                    self.attempt_name(a)
                ),
            },
        }
    }

    pub(super) fn trace(&self, path: Path<State, Action>) -> String {
        let mut out = String::new();
        let mut step = 0;
        for (state, action) in path.into_vec() {
            if step == 0 {
                out.push_str(&format!("  init: {}\n", self.summary(&state)));
            } else {
                out.push_str(&format!("        {}\n", self.summary(&state)));
            }
            if let Some(action) = action {
                step += 1;
                out.push_str(&format!("{step:>4}. {}\n", self.describe(&action)));
            }
        }
        out
    }
}

impl Model for Fencing {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        assert!(self.clients <= MAX_CLIENTS && self.attempts <= PER_CLIENT);
        let node = Node {
            up: true,
            key: None,
            counter: 0,
            down_ticks: 0,
            lost: None,
            idle_ticks: 0,
        };
        let mut clients = [Client {
            started: ABSENT,
            phase: Phase::Idle,
        }; MAX_CLIENTS];
        for c in &mut clients[..self.clients] {
            c.started = 0;
        }
        self.offsets
            .iter()
            .map(|&offsets| State {
                now: 0,
                offsets,
                nodes: [node; N],
                clients,
                sets: [0; MAX_ATTEMPTS],
                fences: [0; MAX_ATTEMPTS],
                fence_t: [0; MAX_ATTEMPTS],
                crashes: 0,
                holders: 0,
                max_token: 0,
                violated: false,
                held_after_restart: false,
                counter_expired: false,
                held_after_expiry: false,
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // All the slots: the symmetry reduction may move the absent ones.
        for c in 0..MAX_CLIENTS {
            let cl = &s.clients[c];
            match cl.phase {
                Phase::Idle => {
                    if cl.started < self.attempts {
                        actions.push(Action::Start(c));
                    }
                }
                Phase::Acquiring { ok, fresh, .. } => {
                    // Every quorum-sized subset of the OKs so far; in the hybrid
                    // rule only once a clock unit passed since its last read.
                    for from in 1..(1u8 << N) {
                        if from & !ok == 0
                            && from.count_ones() >= Q
                            && (self.rule != Rule::Hybrid || from & fresh == 0)
                        {
                            actions.push(Action::Pick(c, from));
                        }
                    }
                    actions.push(Action::Abandon(c));
                }
                Phase::Fencing { applied, .. } => {
                    if applied.count_ones() >= Q {
                        actions.push(Action::Hold(c));
                    }
                    actions.push(Action::Abandon(c));
                }
                Phase::Holding { .. } => actions.push(Action::Abandon(c)),
            }
        }
        for a in 0..MAX_ATTEMPTS as u8 {
            for i in 0..N {
                if !s.nodes[i].up {
                    continue;
                }
                let node = i as u8;
                if s.sets[a as usize] & bit(i) != 0 {
                    actions.push(Action::Deliver(Msg::Set { a, node }));
                }
                if s.fences[a as usize] & bit(i) != 0 {
                    let t = s.fence_t[a as usize];
                    actions.push(Action::Deliver(Msg::Fence { a, node, t }));
                }
            }
        }
        for i in 0..N {
            let n = &s.nodes[i];
            if n.key.is_some_and(|a| self.live(s, a).is_none()) {
                actions.push(Action::Expire(i));
            }
            if n.up && s.crashes < self.crashes {
                actions.push(Action::Crash(i));
            }
            if self.can_restart(s, i) {
                actions.push(Action::Restart(i));
            }
            if n.up && n.counter > 0 && self.counter_expiry.is_some_and(|idle| n.idle_ticks >= idle)
            {
                actions.push(Action::ExpireCounter(i));
            }
        }
        if self.rule == Rule::Hybrid && s.now < self.max_time {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = *last;
        match action {
            Action::Start(c) => {
                let a = self.attempt_id(c, s.clients[c].started);
                s.clients[c].started += 1;
                s.clients[c].phase = Phase::Acquiring {
                    ok: 0,
                    read: [0; N],
                    fresh: 0,
                };
                s.sets[a as usize] = ALL;
            }
            Action::Pick(c, from) => {
                let (a, phase) = self.current(&s, c)?;
                let Phase::Acquiring { read, .. } = phase else {
                    return None;
                };
                let max = (0..N)
                    .filter(|&i| from & bit(i) != 0)
                    .map(|i| read[i])
                    .max()?;
                if self.rule == Rule::NaiveIncr {
                    s.clients[c].phase = Phase::Holding { t: max };
                    Self::record_holder(&mut s, max);
                } else {
                    let t = max + 1;
                    s.clients[c].phase = Phase::Fencing { t, applied: 0 };
                    s.fences[a as usize] = ALL;
                    s.fence_t[a as usize] = t;
                }
            }
            Action::Hold(c) => {
                let Phase::Fencing { t, .. } = s.clients[c].phase else {
                    return None;
                };
                s.clients[c].phase = Phase::Holding { t };
                Self::record_holder(&mut s, t);
            }
            Action::Abandon(c) => s.clients[c].phase = Phase::Idle,
            Action::Expire(i) => s.nodes[i].key = None,
            Action::ExpireCounter(i) => {
                s.nodes[i].counter = 0;
                s.counter_expired = true;
            }
            Action::Crash(i) => {
                s.crashes += 1;
                let n = &mut s.nodes[i];
                n.up = false;
                n.down_ticks = 0;
                if self.persistence == Persistence::None {
                    n.lost = n.key.take();
                    n.counter = 0;
                }
            }
            Action::Restart(i) => {
                s.nodes[i].up = true;
                s.nodes[i].lost = None;
            }
            Action::Tick => {
                s.now += 1;
                let idle_max = self.counter_expiry.unwrap_or(0);
                for n in &mut s.nodes {
                    if !n.up {
                        n.down_ticks = (n.down_ticks + 1).min(self.min_down_ticks);
                    }
                    n.idle_ticks = (n.idle_ticks + 1).min(idle_max);
                }
                for cl in &mut s.clients {
                    if let Phase::Acquiring { fresh, .. } = &mut cl.phase {
                        *fresh = 0;
                    }
                }
            }
            Action::Deliver(m) => {
                match m {
                    Msg::Set { a, node } => s.sets[a as usize] &= !bit(node as usize),
                    Msg::Fence { a, node, .. } => {
                        s.fences[a as usize] &= !bit(node as usize);
                        if s.fences[a as usize] == 0 {
                            s.fence_t[a as usize] = 0;
                        }
                    }
                }
                match m {
                    Msg::Set { a, node } => {
                        let i = node as usize;
                        if s.nodes[i].key.is_none() {
                            s.nodes[i].key = Some(a);
                            if self.rule == Rule::NaiveIncr {
                                s.nodes[i].counter += 1;
                            }
                            let c = (a / PER_CLIENT) as usize;
                            if let Some(Phase::Acquiring {
                                ok,
                                mut read,
                                fresh,
                            }) = self.live(&s, a)
                            {
                                let time = s.now + s.offsets[i];
                                read[i] = self.read_value(s.nodes[i].counter, time);
                                s.clients[c].phase = Phase::Acquiring {
                                    ok: ok | bit(i),
                                    read,
                                    fresh: if self.rule == Rule::Hybrid {
                                        fresh | bit(i)
                                    } else {
                                        0
                                    },
                                };
                            }
                        }
                    }
                    Msg::Fence { a, node, t } => {
                        let i = node as usize;
                        if s.nodes[i].key == Some(a) {
                            s.nodes[i].counter = s.nodes[i].counter.max(t);
                            s.nodes[i].idle_ticks = 0;
                            let c = (a / PER_CLIENT) as usize;
                            if let Some(Phase::Fencing { t: ft, applied }) = self.live(&s, a) {
                                s.clients[c].phase = Phase::Fencing {
                                    t: ft,
                                    applied: applied | bit(i),
                                };
                            }
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![Property::always(MONOTONE, |_, s: &State| !s.violated)];
        if self.crashes > 0 {
            p.push(Property::sometimes(HOLDER_AFTER_RESTART, |_, s: &State| {
                s.held_after_restart && s.holders >= 2
            }));
        }
        if self.counter_expiry.is_some() {
            p.push(Property::sometimes(HOLDER_AFTER_EXPIRY, |_, s: &State| {
                s.held_after_expiry && s.holders >= 2
            }));
        }
        p
    }
}
