//! Model check (with [`stateright`]) of the waiters flag of issue 21: a
//! release announces itself (`PUBLISH`) only when it deletes the key's
//! waiters flag with the key, so that a release nobody waits for costs the
//! node no `PUBLISH`. The claim checked: **no waiter sleeps through a
//! release** — a waiter whose attempt was refused, and which is still
//! waiting, has heard every release that ran on the node since.
//!
//! # The protocol, on one node
//!
//! The wake-up is per node (a waiter listens on every node and wakes on news
//! from any), so one node shows it. Clients share the node's lock key and the
//! key's flag. A waiter is subscribed to the key's channel before its first
//! flagged attempt (`wait/mod.rs` subscribes and waits for the confirmation
//! before the attempt after its first refusal), so a message published from
//! then on reaches it.
//!
//! 1. **flag**: the waiter's pipeline sets the flag (`SET flag 1 NX PX` and
//!    `PEXPIRE flag GT`) ...
//! 2. **try**: ... then `SET key tok NX PX`. These are two steps: another
//!    client's command may run between them (a pipeline is not atomic).
//!    Refused, the waiter sleeps until a message (or its timers, which this
//!    model leaves out: they bound how late a missed release is found, and
//!    the claim is that none is missed).
//! 3. **release**: one script, atomic on the node: if the key holds the
//!    holder's token, `DEL key flag`, and if that deleted the flag too,
//!    `PUBLISH`, which reaches every subscribed client.
//! 4. **wake**: a waiter with a message attempts again from step 1.
//!
//! Left out: expiries. A key that expires publishes nothing, with or without
//! flags; the waiter's holder-expiry timer finds it. The flag lives as long
//! as its waiter may still wait (`wait::flag_ttl`: until its deadline, or
//! every delay of its policy, plus a TTL, node timeouts and a second), and
//! every attempt sets it again, so while a waiter waits its flag does not
//! expire; a flag left by a waiter that gave up costs one `PUBLISH` later,
//! which the model allows
//! (clients that are done still leave their flag).
//!
//! # Negative controls
//!
//! - [`Order::FlagAfterRefusal`]: the flag is set after the refused `SET`, the
//!   tempting "only waiters that found it busy flag it" order. A release that
//!   runs between the refusal and the flag finds no flag: counterexample.
//! - [`Order::FlagOnce`]: a waiter flags only its first attempt. Two waiters
//!   flag; a release deletes the flag and wakes both; one takes the key, the
//!   other's next attempt (unflagged) is refused, and the new holder's release
//!   finds no flag: counterexample.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

/// How many clients: client 0 holds the key at the start, the others want it.
const CLIENTS: usize = 3;

const NO_MISSED_RELEASE: &str = "no waiter sleeps through a release";
const WOKEN_BY_A_RELEASE: &str = "a waiter is woken by a release and takes the key";

/// Where a waiter sets the flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Order {
    /// The library's: before every attempt, in the attempt's pipeline.
    BeforeEveryAttempt,
    /// Negative control: after a refused `SET`.
    FlagAfterRefusal,
    /// Negative control: before the first attempt only.
    FlagOnce,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// About to attempt (step 1 next).
    Start,
    /// Flag set, its `SET` next (step 2).
    Flagged,
    /// Refused, its flag not yet set ([`Order::FlagAfterRefusal`] only).
    Refused,
    /// Asleep until a message.
    Waiting,
    Holding,
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    /// A message on the key's channel not yet taken.
    inbox: bool,
    /// A release ran while this client was waiting and it heard nothing.
    missed: bool,
    /// Attempts started, for [`Order::FlagOnce`].
    attempts: u8,
    /// Whether it ever took the key after waiting.
    woken_and_held: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The lock key's holder.
    key: Option<usize>,
    /// Whether the waiters flag exists.
    flag: bool,
    clients: Vec<Client>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Flag(usize),
    Try(usize),
    Release(usize),
    Wake(usize),
}

#[derive(Clone)]
struct WakeFlag {
    order: Order,
}

impl WakeFlag {
    /// Whether the client's next attempt sets the flag first.
    fn flags(&self, c: &Client) -> bool {
        match self.order {
            Order::BeforeEveryAttempt => true,
            Order::FlagAfterRefusal => false,
            Order::FlagOnce => c.attempts == 0,
        }
    }
}

impl Model for WakeFlag {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let client = |phase| Client {
            phase,
            inbox: false,
            missed: false,
            attempts: 0,
            woken_and_held: false,
        };
        let mut clients = vec![client(Phase::Holding)];
        clients.extend((1..CLIENTS).map(|_| client(Phase::Start)));
        vec![State {
            key: Some(0),
            flag: false,
            clients,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, c) in s.clients.iter().enumerate() {
            match c.phase {
                Phase::Start if self.flags(c) => actions.push(Action::Flag(i)),
                Phase::Start | Phase::Flagged => actions.push(Action::Try(i)),
                Phase::Refused => actions.push(Action::Flag(i)),
                Phase::Waiting if c.inbox => actions.push(Action::Wake(i)),
                Phase::Holding => actions.push(Action::Release(i)),
                Phase::Waiting | Phase::Done => {}
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Flag(i) => {
                s.flag = true;
                let c = &mut s.clients[i];
                c.phase = match c.phase {
                    Phase::Refused => Phase::Waiting,
                    _ => Phase::Flagged,
                };
            }
            Action::Try(i) => {
                let free = s.key.is_none();
                if free {
                    s.key = Some(i);
                }
                let after_refusal = self.order == Order::FlagAfterRefusal;
                let c = &mut s.clients[i];
                c.attempts = c.attempts.saturating_add(1);
                c.phase = match (free, after_refusal) {
                    (true, _) => {
                        c.woken_and_held |= c.attempts > 1;
                        Phase::Holding
                    }
                    (false, true) => Phase::Refused,
                    (false, false) => Phase::Waiting,
                };
            }
            Action::Release(i) => {
                if s.key != Some(i) {
                    return None;
                }
                s.key = None;
                let announced = std::mem::take(&mut s.flag);
                s.clients[i].phase = Phase::Done;
                for c in &mut s.clients {
                    // Subscribed: every client still after the key.
                    let subscribed = !matches!(c.phase, Phase::Holding | Phase::Done);
                    if announced && subscribed {
                        c.inbox = true;
                    } else if matches!(c.phase, Phase::Refused | Phase::Waiting) && !c.inbox {
                        // Refused before this release, and not told of it.
                        c.missed = true;
                    }
                }
            }
            Action::Wake(i) => {
                let c = &mut s.clients[i];
                c.inbox = false;
                c.missed = false;
                c.phase = Phase::Start;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_MISSED_RELEASE, |_, s: &State| {
                s.clients
                    .iter()
                    .all(|c| !(c.phase == Phase::Waiting && c.missed))
            }),
            Property::sometimes(WOKEN_BY_A_RELEASE, |_, s: &State| {
                s.clients.iter().any(|c| c.woken_and_held)
            }),
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
fn a_flag_before_every_attempt_lets_no_waiter_sleep_through_a_release() {
    let model = WakeFlag {
        order: Order::BeforeEveryAttempt,
    };
    let start = Instant::now();
    let checker = model.checker().threads(2).spawn_bfs().join();
    println!(
        "model_wake_flag: {} unique states, depth {}, {:.2?}",
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    if let Some(path) = checker.discovery(NO_MISSED_RELEASE) {
        panic!("counterexample:\n{}", trace(path));
    }
    checker.assert_properties();
}

fn counterexample(order: Order) -> String {
    let checker = WakeFlag { order }
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([NO_MISSED_RELEASE].into()))
        .spawn_bfs()
        .join();
    trace(checker.assert_any_discovery(NO_MISSED_RELEASE))
}

#[test]
fn a_flag_set_after_the_refusal_misses_a_release() {
    let path = counterexample(Order::FlagAfterRefusal);
    println!("negative control (flag after the refused SET):\n{path}");
}

#[test]
fn a_flag_set_once_misses_a_release() {
    let path = counterexample(Order::FlagOnce);
    println!("negative control (flag on the first attempt only):\n{path}");
}
