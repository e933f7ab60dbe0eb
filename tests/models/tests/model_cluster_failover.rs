//! Model check (with [`stateright`]) of replica acks on a cluster node
//! (issue 47, item 10: `redlock-core/src/node/cluster_acks.rs`). The claim
//! checked: **no two clients hold the lock at once** when a cluster node's
//! write counts only if the marker pipeline that measured its acks (`SET
//! {tag}:redlock-acked`, `INFO replication`, `WAIT n`) ran on a master whose
//! replication ID is the one seen for that slot *before* the write was sent.
//!
//! # The protocol
//!
//! Three nodes: node 0 is a Redis Cluster, of which one slot matters (the
//! lock key's): its master and `R` replicas; nodes 1 and 2 are plain
//! masters. Two clients each make one acquire attempt and hold the lock if a
//! quorum (2) of nodes counted for them.
//!
//! 1. **The replid before the write** (only with the check built,
//!    [`Check::BeforeWrite`]): the client reads the slot master's
//!    replication ID from its cache, or fetches it (`EXISTS marker`, `INFO
//!    replication`) when the cache has none. Either was seen at some moment
//!    before the write is sent, and that is all the model keeps: any number
//!    of failovers may come between it and the write.
//! 2. **`SET NX` runs on a node** (any client, any node, any order). On node
//!    0 it runs on whichever master serves the slot then (redis' cluster
//!    client follows a failover by itself). Its answer may be lost (the node
//!    does not count), and a request may be lost before it runs.
//! 3. **Replication**: the master streams its writes to each attached
//!    replica, which applies them at any later moment. A replica is
//!    *caught up* when it has every write the master made so far.
//! 4. **Failover**, at any moment, at most `failovers` times: any replica
//!    is promoted with what it had (the cluster's replica validity factor is
//!    0, so even a detached one may be), with a fresh replication ID. The old
//!    master rejoins as a replica, and every replica is detached until it
//!    resyncs (**reattach**: a full resync, it then has the new master's
//!    data and acks its writes).
//! 5. **The marker pipeline** after node 0's write answered: `SET marker`
//!    on the slot's master *as it is then*, `INFO replication` (its
//!    replication ID) and `WAIT wanted`. With the check, a replication ID
//!    other than the one of step 1 makes the node not count
//!    (`NodeError::MasterChanged`). Else `WAIT` answers once `wanted`
//!    attached replicas caught up with the marker, while that master still
//!    serves (a demoted master's `WAIT` fails), or is given up.
//! 6. **A client decides** once every node answered or was given up.
//!
//! Left out: expiry and release (no lock ends within the model, so any two
//! holders overlap), clock drift (other models), the other slots (each
//! slot's master is checked on its own), and a split brain (two masters of
//! one slot at once, which Redis Cluster itself does not prevent).
//!
//! # Negative controls
//!
//! - [`Check::None`], the code before the check: the write is answered,
//!   the master fails over to a replica that never got it, and the marker
//!   and its `WAIT` are measured on the new master, whose reattached replica
//!   acks the marker: the node counts a lost write, two holders.
//! - [`Check::AfterWrite`]: the replication ID compared with is fetched
//!   after the write's answer (one more round trip before the marker)
//!   instead of before the write: a failover between the write and that
//!   fetch goes unseen, two holders. The ID must be seen before the write.

use stateright::{Model, Property};

const ONE_HOLDER: &str = "no two clients hold the lock at once";
const KEPT: &str = "a lock is held across a failover";
const REFUSED: &str = "a write is refused because its slot's master changed";

const CLIENTS: usize = 2;
const NODES: usize = 3;
const QUORUM: usize = 2;

/// Where one client's attempt stands on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// Not yet run there.
    Todo,
    /// Node 0 wrote and answered; the marker pipeline is not sent yet.
    Written,
    /// The marker pipeline ran on a master; its `WAIT` is pending.
    Marked,
    /// The node counts for the client.
    Counted,
    /// It does not: refused, lost, not acked, or its master changed.
    NotCounted,
}

/// Which replication ID a write's marker is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// None: the code before the check (`WAIT` on whatever master answers).
    None,
    /// The one seen before the write was sent (the cache, or the fetch of a
    /// slot not in it): the check as built.
    BeforeWrite,
    /// One fetched after the write answered (negative control).
    AfterWrite,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The holder of the key on each node (node 0: the slot's master as it
    /// is now).
    key: [Option<usize>; NODES],
    /// Node 0's master's replication ID (fresh at each promotion).
    replid: u8,
    failovers: u8,
    /// What each replica of node 0 has of the key.
    replica: Vec<Option<usize>>,
    /// Which replicas have every write the master made so far.
    caught_up: Vec<bool>,
    /// Which replicas stream from the master (a detached one resyncs first).
    attached: Vec<bool>,
    steps: [[Step; NODES]; CLIENTS],
    /// The replication ID client `c` compares its marker's with.
    seen: [Option<u8>; CLIENTS],
    /// The replication ID of the master client `c`'s marker ran on.
    marked_on: [u8; CLIENTS],
    /// `Some(holds)` once the client decided.
    decided: [Option<bool>; CLIENTS],
    /// Some marker found its slot's master changed.
    refused: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Client `c` reads node 0's replication ID ([`Check`] says when).
    ReadReplid { c: usize },
    /// Client `c`'s `SET NX` runs on `node`; its answer arrives (`answered`)
    /// or is lost.
    Set {
        c: usize,
        node: usize,
        answered: bool,
    },
    /// Client `c`'s request to `node` is lost before it runs.
    Lose { c: usize, node: usize },
    /// Client `c`'s marker pipeline runs on node 0's master.
    Marker { c: usize },
    /// Replica `r` applies the master's writes.
    Replicate { r: usize },
    /// `WAIT` answers client `c` with enough acks.
    Acked { c: usize },
    /// Client `c`'s `WAIT` times out (or its master was demoted).
    AckTimeout { c: usize },
    /// Replica `r` is promoted.
    Failover { r: usize },
    /// Replica `r` resyncs from the master.
    Reattach { r: usize },
    /// Client `c` counts its nodes.
    Decide { c: usize },
}

#[derive(Clone)]
struct ClusterAcks {
    /// Replicas of the slot's master.
    replicas: usize,
    /// How many acks each write on node 0 needs.
    wanted: usize,
    /// The most failovers.
    failovers: u8,
    check: Check,
}

impl ClusterAcks {
    /// Whether client `c` may read node 0's replication ID now.
    fn may_read_replid(&self, s: &State, c: usize) -> bool {
        s.seen[c].is_none()
            && match self.check {
                Check::None => false,
                Check::BeforeWrite => s.steps[c][0] == Step::Todo,
                Check::AfterWrite => s.steps[c][0] == Step::Written,
            }
    }

    /// How many attached replicas have caught up with the master.
    fn acks(s: &State) -> usize {
        (0..s.replica.len())
            .filter(|&r| s.attached[r] && s.caught_up[r])
            .count()
    }
}

impl Model for ClusterAcks {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            key: [None; NODES],
            replid: 0,
            failovers: 0,
            replica: vec![None; self.replicas],
            caught_up: vec![true; self.replicas],
            attached: vec![true; self.replicas],
            steps: [[Step::Todo; NODES]; CLIENTS],
            seen: [None; CLIENTS],
            marked_on: [0; CLIENTS],
            decided: [None; CLIENTS],
            refused: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for c in 0..CLIENTS {
            if self.may_read_replid(s, c) {
                actions.push(Action::ReadReplid { c });
            }
            for node in 0..NODES {
                match s.steps[c][node] {
                    Step::Todo => {
                        // The write waits for its replid (the code fetches
                        // it first when its cache has none).
                        if node != 0 || self.check != Check::BeforeWrite || s.seen[c].is_some() {
                            for answered in [true, false] {
                                actions.push(Action::Set { c, node, answered });
                            }
                        }
                        actions.push(Action::Lose { c, node });
                    }
                    Step::Written => {
                        if self.check != Check::AfterWrite || s.seen[c].is_some() {
                            actions.push(Action::Marker { c });
                        }
                        actions.push(Action::AckTimeout { c });
                    }
                    Step::Marked => {
                        if s.marked_on[c] == s.replid && Self::acks(s) >= self.wanted {
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
        for r in 0..self.replicas {
            if s.attached[r] && !s.caught_up[r] {
                actions.push(Action::Replicate { r });
            }
            if !s.attached[r] {
                actions.push(Action::Reattach { r });
            }
            if s.failovers < self.failovers {
                actions.push(Action::Failover { r });
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::ReadReplid { c } => s.seen[c] = Some(s.replid),
            Action::Set { c, node, answered } => {
                let wrote = s.key[node].is_none();
                if wrote {
                    s.key[node] = Some(c);
                    if node == 0 {
                        s.caught_up.iter_mut().for_each(|u| *u = false);
                    }
                }
                s.steps[c][node] = match (wrote, answered) {
                    (false, _) | (_, false) => Step::NotCounted,
                    (true, true) if node == 0 => Step::Written,
                    (true, true) => Step::Counted,
                };
            }
            Action::Lose { c, node } => s.steps[c][node] = Step::NotCounted,
            Action::Marker { c } => {
                // The marker is a write of the master's own.
                s.caught_up.iter_mut().for_each(|u| *u = false);
                if self.check != Check::None && s.seen[c] != Some(s.replid) {
                    s.steps[c][0] = Step::NotCounted;
                    s.refused = true;
                } else {
                    s.steps[c][0] = Step::Marked;
                    s.marked_on[c] = s.replid;
                }
            }
            Action::Replicate { r } => {
                s.replica[r] = s.key[0];
                s.caught_up[r] = true;
            }
            Action::Acked { c } => s.steps[c][0] = Step::Counted,
            Action::AckTimeout { c } => s.steps[c][0] = Step::NotCounted,
            Action::Failover { r } => {
                // The old master rejoins in the promoted replica's place.
                std::mem::swap(&mut s.key[0], &mut s.replica[r]);
                s.replid += 1;
                s.failovers += 1;
                s.attached.iter_mut().for_each(|a| *a = false);
                s.caught_up.iter_mut().for_each(|u| *u = false);
            }
            Action::Reattach { r } => {
                s.replica[r] = s.key[0];
                s.attached[r] = true;
                s.caught_up[r] = true;
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
                s.failovers > 0
                    && (0..CLIENTS).any(|c| s.decided[c] == Some(true) && s.key[0] == Some(c))
            }),
            Property::sometimes(REFUSED, |_, s: &State| s.refused),
        ]
    }
}

/// Checks the whole space of `model`: one holder at most, a lock held
/// across a failover reachable, and a write refused for a changed master
/// reachable (the check is not vacuous).
fn holds(model: ClusterAcks, name: &str) {
    redlock_models::holds(
        model,
        &format!("model_cluster_failover ({name})"),
        ONE_HOLDER,
    );
}

/// The first path to two holders in `model`, which must have one.
fn counterexample(model: ClusterAcks, name: &str) -> String {
    redlock_models::counterexample(
        model,
        &format!("model_cluster_failover ({name})"),
        ONE_HOLDER,
    )
}

#[test]
fn with_the_replid_seen_before_the_write_a_failover_never_makes_two_holders() {
    holds(
        ClusterAcks {
            replicas: 1,
            wanted: 1,
            failovers: 2,
            check: Check::BeforeWrite,
        },
        "one replica, WAIT 1, two failovers, replid before the write",
    );
    holds(
        ClusterAcks {
            replicas: 2,
            wanted: 2,
            failovers: 1,
            check: Check::BeforeWrite,
        },
        "two replicas, WAIT 2, one failover, replid before the write",
    );
}

#[test]
fn without_the_replid_check_a_failover_after_the_write_makes_two_holders() {
    let path = counterexample(
        ClusterAcks {
            replicas: 1,
            wanted: 1,
            failovers: 1,
            check: Check::None,
        },
        "one replica, WAIT 1, no replid check",
    );
    assert!(path.contains("Failover"), "{path}");
    println!("negative control (no replid check, today's code before the fix):\n{path}");
}

#[test]
fn a_replid_fetched_after_the_write_misses_the_failover_and_makes_two_holders() {
    let path = counterexample(
        ClusterAcks {
            replicas: 1,
            wanted: 1,
            failovers: 1,
            check: Check::AfterWrite,
        },
        "one replica, WAIT 1, replid fetched after the write",
    );
    println!("negative control (replid fetched after the write):\n{path}");
}
