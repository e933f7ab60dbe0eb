//! Model check (with [`stateright`]) of the coalescer's replica acks
//! (`redlock-core/src/node/coalesce.rs`, `wait_for_acks`): a batch of
//! writes on a node with replica acks waits for the replicas by **one**
//! `WAIT`, sent after the batch's pipeline on the same connection, and its
//! count is taken for every write of the batch. The claim checked: **when a
//! batch's `WAIT` counted a replica, a failover to that replica keeps every
//! write of the batch.**
//!
//! # The protocol
//!
//! One primary with one replica (the node behind a failover endpoint).
//!
//! 1. **The batch** (client X, connection 0) sends, in order, its writes of
//!    keys `a` and `b`, then `WAIT 1`. The primary runs one connection's
//!    commands in the order they were sent.
//! 2. **Another client** (connection 1) writes key `c` at any moment.
//! 3. **The primary's log**: each write gets the next offset. A connection's
//!    last write offset is what `WAIT` waits for when it runs on that
//!    connection (Redis's `c->woff`).
//! 4. **Replication** applies the log to the replica in order (a prefix),
//!    one write at a time, at any moment.
//! 5. **`WAIT`** counts the replica once it applied the connection's last
//!    write offset, or gives up (its timeout).
//! 6. **Failover**, once, at any moment: the replica is promoted with the
//!    prefix it applied.
//!
//! # Negative controls
//!
//! - the `WAIT` on another connection than the batch's (connection 1, whose
//!   last write is the other client's, or none): it counts before the
//!   batch's writes reached the replica, and a failover loses them;
//! - the `WAIT` sent between the batch's writes: it counts for the first
//!   write only, and a failover loses the second.

use stateright::{Model, Property};

const KEPT_ALL: &str = "a batch whose WAIT counted keeps every write across a failover";
const REACHED: &str = "a batch counted, then a failover";

/// What the batch sends, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Item {
    Write(char),
    Wait,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The primary's log: each write's key, in offset order.
    log: Vec<char>,
    /// How many of the log's writes the replica applied.
    applied: usize,
    /// Each connection's last write offset (how many log entries up to and
    /// including it).
    last: [usize; 2],
    /// How many of the batch's items ran.
    sent: usize,
    /// The offset the batch's `WAIT` waits for, once it ran.
    waiting_for: Option<usize>,
    /// `Some(counted)` once the `WAIT` answered.
    counted: Option<bool>,
    /// The other client wrote `c`.
    other_wrote: bool,
    /// The replica was promoted.
    promoted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// The batch's next item runs on the primary.
    Send,
    /// The other client's write runs (connection 1).
    OtherWrite,
    /// The replica applies the next write of the log.
    Replicate,
    /// The `WAIT` counts the replica.
    Acked,
    /// The `WAIT` times out.
    Timeout,
    /// The primary dies and the replica is promoted.
    Failover,
}

#[derive(Clone)]
struct BatchAcks {
    /// The batch's items, in the order sent.
    items: Vec<Item>,
    /// The connection the `WAIT` runs on (the writes run on 0).
    wait_conn: usize,
}

impl Model for BatchAcks {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            log: Vec::new(),
            applied: 0,
            last: [0; 2],
            sent: 0,
            waiting_for: None,
            counted: None,
            other_wrote: false,
            promoted: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.promoted {
            return;
        }
        if s.sent < self.items.len() {
            actions.push(Action::Send);
        }
        if !s.other_wrote {
            actions.push(Action::OtherWrite);
        }
        if s.applied < s.log.len() {
            actions.push(Action::Replicate);
        }
        if let (Some(offset), None) = (s.waiting_for, s.counted) {
            if s.applied >= offset {
                actions.push(Action::Acked);
            }
            actions.push(Action::Timeout);
        }
        actions.push(Action::Failover);
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Send => {
                match self.items.get(s.sent)? {
                    Item::Write(key) => {
                        s.log.push(*key);
                        s.last[0] = s.log.len();
                    }
                    Item::Wait => s.waiting_for = Some(*s.last.get(self.wait_conn)?),
                }
                s.sent += 1;
            }
            Action::OtherWrite => {
                s.log.push('c');
                s.last[1] = s.log.len();
                s.other_wrote = true;
            }
            Action::Replicate => s.applied += 1,
            Action::Acked => s.counted = Some(true),
            Action::Timeout => s.counted = Some(false),
            Action::Failover => s.promoted = true,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(KEPT_ALL, |model: &BatchAcks, s: &State| {
                let on_replica = |k: &char| s.log.iter().take(s.applied).any(|w| w == k);
                !(s.promoted && s.counted == Some(true))
                    || model.items.iter().all(|i| match i {
                        Item::Write(k) => on_replica(k),
                        Item::Wait => true,
                    })
            }),
            Property::sometimes(REACHED, |_, s: &State| {
                s.promoted && s.counted == Some(true)
            }),
        ]
    }
}

fn batch(items: &[Item], wait_conn: usize) -> BatchAcks {
    BatchAcks {
        items: items.to_vec(),
        wait_conn,
    }
}

const AFTER: [Item; 3] = [Item::Write('a'), Item::Write('b'), Item::Wait];

#[test]
fn one_wait_after_the_batch_on_its_connection_covers_every_write() {
    redlock_models::holds(batch(&AFTER, 0), "model_batch_acks", KEPT_ALL);
}

fn counterexample(model: BatchAcks) -> String {
    redlock_models::counterexample(model, "model_batch_acks", KEPT_ALL)
}

#[test]
fn a_wait_on_another_connection_loses_the_batch_in_a_failover() {
    let path = counterexample(batch(&AFTER, 1));
    println!("negative control (WAIT on another connection):\n{path}");
}

#[test]
fn a_wait_between_the_writes_loses_the_last_in_a_failover() {
    let items = [Item::Write('a'), Item::Wait, Item::Write('b')];
    let path = counterexample(batch(&items, 0));
    println!("negative control (WAIT between the writes):\n{path}");
}
