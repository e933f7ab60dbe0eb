//! Model check (with [`stateright`]) of replica acks (`ReplicaAcks`,
//! `redlock-core/src/node/replicas.rs`): a Redlock node that is one primary
//! with replicas behind a failover endpoint, and a failover that promotes a
//! replica with what it had received. The claim checked: **no two clients
//! hold the lock at once** when each write on that node counts only once
//! `WAIT` saw it on every replica that can be promoted.
//!
//! # The protocol
//!
//! Three nodes: node 0 is a primary with `R` replicas behind one endpoint,
//! nodes 1 and 2 are plain masters. Two clients each make one acquire
//! attempt and hold the lock if a quorum (2) of nodes counted for them.
//!
//! 1. **`SET NX` runs on a node** (any client, any node, any order): it
//!    writes if the key is free. Its answer may be lost (the node does not
//!    count), and a request may be lost before it runs (a partition: nothing
//!    is written).
//! 2. **Replication**: the primary streams its write to each replica, which
//!    applies it at any later moment, or never before the failover (a
//!    stalled link).
//! 3. **`WAIT wanted`** after a write on node 0: the node counts when
//!    `wanted` replicas have the write, or is given up (the timeout, the
//!    primary gone). With `wanted = 0` (replica acks off) it counts at once.
//! 4. **Failover**, once, at any moment: the primary is gone, a replica is
//!    promoted with what it had received, and the endpoint moves to it. The
//!    other replicas attach to it and resync (what they had is replaced by
//!    its data), and later a new replica may be added (**reattach**): a write
//!    there gets its acks from those (there is no second failover, so their
//!    replication is not followed further).
//! 5. **A client decides** once every node answered or was given up.
//!
//! Left out: expiry and release (no lock ends within the model, so any two
//! holders overlap), clock drift (other models), and a replica re-attached
//! after the failover.
//!
//! # Negative controls
//!
//! - replica acks off (`wanted = 0`), one replica: two holders (the issue's
//!   reproduction: the promoted replica never got the first holder's key).
//! - two replicas, `WAIT 1`, and a failover free to promote either: two
//!   holders (`WAIT` counts any replica, the failover may pick another).

use stateright::{Model, Property};

const ONE_HOLDER: &str = "no two clients hold the lock at once";
const KEPT: &str = "a lock is held across a failover";

const CLIENTS: usize = 2;
const NODES: usize = 3;
const QUORUM: usize = 2;

/// Where one client's attempt stands on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// Not yet run there.
    Todo,
    /// Node 0 wrote; the client waits for the replicas' acks.
    Waiting,
    /// The node counts for the client.
    Counted,
    /// It does not: refused, lost, or not acked.
    NotCounted,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The holder of the key on each node (node 0: the primary, then the
    /// promoted replica).
    key: [Option<usize>; NODES],
    /// Which replicas of node 0 applied its primary's write.
    replica_has: Vec<bool>,
    /// Which replica was promoted, if the failover happened.
    promoted: Option<usize>,
    /// A new replica was added to the promoted one.
    reattached: bool,
    steps: [[Step; NODES]; CLIENTS],
    /// Whether the client's write on node 0 ran on the promoted replica.
    written_after: [bool; CLIENTS],
    /// `Some(holds)` once the client decided.
    decided: [Option<bool>; CLIENTS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Client `c`'s `SET NX` runs on `node`; its answer arrives (`answered`)
    /// or is lost.
    Set {
        c: usize,
        node: usize,
        answered: bool,
    },
    /// Client `c`'s request to `node` is lost before it runs.
    Lose { c: usize, node: usize },
    /// Replica `r` applies the primary's write.
    Replicate { r: usize },
    /// `WAIT` answers client `c` with enough acks.
    Acked { c: usize },
    /// Client `c`'s `WAIT` times out (or its primary died).
    AckTimeout { c: usize },
    /// The primary dies and replica `r` is promoted.
    Failover { r: usize },
    /// A new replica attaches to the promoted one.
    Reattach,
    /// Client `c` counts its nodes.
    Decide { c: usize },
}

#[derive(Clone)]
struct Failover {
    /// Replicas behind node 0's endpoint.
    replicas: usize,
    /// How many acks each write on node 0 needs (0: replica acks off).
    wanted: usize,
}

impl Model for Failover {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            key: [None; NODES],
            replica_has: vec![false; self.replicas],
            promoted: None,
            reattached: false,
            steps: [[Step::Todo; NODES]; CLIENTS],
            written_after: [false; CLIENTS],
            decided: [None; CLIENTS],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for c in 0..CLIENTS {
            for node in 0..NODES {
                match s.steps[c][node] {
                    Step::Todo => {
                        for answered in [true, false] {
                            actions.push(Action::Set { c, node, answered });
                        }
                        actions.push(Action::Lose { c, node });
                    }
                    Step::Waiting => {
                        let acks = match s.promoted {
                            None => s.replica_has.iter().filter(|h| **h).count(),
                            // Whether the write was before the failover
                            // (then its WAIT failed with the primary) is
                            // told apart by `written_after`.
                            Some(_) if s.written_after[c] => {
                                self.replicas - 1 + usize::from(s.reattached)
                            }
                            Some(_) => 0,
                        };
                        if acks >= self.wanted {
                            actions.push(Action::Acked { c });
                        }
                        actions.push(Action::AckTimeout { c });
                    }
                    Step::Counted | Step::NotCounted => {}
                }
            }
            let done = s.steps[c]
                .iter()
                .all(|st| matches!(st, Step::Counted | Step::NotCounted));
            if done && s.decided[c].is_none() {
                actions.push(Action::Decide { c });
            }
        }
        if s.promoted.is_some() && !s.reattached {
            actions.push(Action::Reattach);
        }
        if s.promoted.is_none() {
            for r in 0..self.replicas {
                if s.key[0].is_some() && !s.replica_has[r] {
                    actions.push(Action::Replicate { r });
                }
                actions.push(Action::Failover { r });
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Set { c, node, answered } => {
                let wrote = s.key[node].is_none();
                if wrote {
                    s.key[node] = Some(c);
                }
                s.steps[c][node] = match (wrote, answered) {
                    (false, _) | (_, false) => Step::NotCounted,
                    (true, true) if node == 0 && self.wanted > 0 => {
                        s.written_after[c] = s.promoted.is_some();
                        Step::Waiting
                    }
                    (true, true) => Step::Counted,
                };
            }
            Action::Lose { c, node } => s.steps[c][node] = Step::NotCounted,
            Action::Replicate { r } => s.replica_has[r] = true,
            Action::Acked { c } => s.steps[c][0] = Step::Counted,
            Action::AckTimeout { c } => s.steps[c][0] = Step::NotCounted,
            Action::Reattach => s.reattached = true,
            Action::Failover { r } => {
                s.promoted = Some(r);
                if !s.replica_has[r] {
                    s.key[0] = None;
                }
            }
            Action::Decide { c } => {
                let counted = s.steps[c].iter().filter(|st| **st == Step::Counted).count();
                s.decided[c] = Some(counted >= QUORUM);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_HOLDER, |_, s: &State| {
                s.decided.iter().filter(|d| **d == Some(true)).count() <= 1
            }),
            Property::sometimes(KEPT, |_, s: &State| {
                s.promoted.is_some()
                    && (0..CLIENTS).any(|c| s.decided[c] == Some(true) && s.key[0] == Some(c))
            }),
        ]
    }
}

/// Checks the whole space of `model`: one holder at most, and a lock held
/// across a failover reachable.
fn holds(model: Failover, name: &str) {
    redlock_models::holds(model, &format!("model_failover ({name})"), ONE_HOLDER);
}

fn counterexample(model: Failover) -> String {
    redlock_models::counterexample(model, "model_failover", ONE_HOLDER)
}

#[test]
fn with_replica_acks_a_failover_never_makes_two_holders() {
    holds(
        Failover {
            replicas: 1,
            wanted: 1,
        },
        "one replica, WAIT 1",
    );
    holds(
        Failover {
            replicas: 2,
            wanted: 2,
        },
        "two replicas, WAIT 2",
    );
}

#[test]
fn without_replica_acks_a_failover_makes_two_holders() {
    let path = counterexample(Failover {
        replicas: 1,
        wanted: 0,
    });
    println!("negative control (no WAIT):\n{path}");
}

#[test]
fn waiting_for_fewer_replicas_than_can_be_promoted_makes_two_holders() {
    let path = counterexample(Failover {
        replicas: 2,
        wanted: 1,
    });
    println!("negative control (two replicas, WAIT 1, either promoted):\n{path}");
}
