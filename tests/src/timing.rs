//! The suite's timing rules, in one place (CONTRIBUTING.md, "Timing in tests").
//!
//! - **Safety is judged unconditionally.** Exclusion, token order and key
//!   hygiene are asserted whatever the load; nothing here widens them.
//! - **Liveness bounds derive from the settings under test.** A bound on how
//!   long something may take is [`liveness`] of what the settings allow (a
//!   node timeout, a TTL, a retry deadline): those settings times
//!   [`slack`], plus a scheduling margin. Such a bound only matters when the
//!   test is failing anyway, since every wait polls for its condition and
//!   ends as soon as it holds, so it costs nothing to be generous.
//! - **A test that needs every call to succeed** (its subject is not a slow
//!   node) gives its handle [`PATIENT_NODE_TIMEOUT`]. A test whose subject
//!   *is* a node timeout keeps its own, and accepts the library's honest
//!   answer to a slow node (a `Busy`, a `Pending`, a typed error) as long as
//!   safety held.
//! - **Node state is read once the library said the write landed
//!   everywhere, or polled for.** A lock, an unlock or an extend returns at
//!   quorum; the last node's answer may still be on its way. Read with
//!   [`Cluster::settled_count`](crate::Cluster::settled_count) or poll with
//!   [`eventually`](crate::util::eventually) bounded by [`settle`].

use std::time::Duration;

/// The node timeout of a test that needs every node to answer: its subject is
/// not a slow node. A loopback call on a loaded 2-core machine answers well
/// within it; a test that does time out with it has found a real stall.
pub const PATIENT_NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// The most patient node timeout a handle with locks of `ttl` may have:
/// [`PATIENT_NODE_TIMEOUT`], or a third of `ttl` when that is shorter (the
/// builder refuses a node timeout that is not shorter than the TTL, and a
/// guard needs room to renew within it).
pub fn patient_node_timeout_for(ttl: Duration) -> Duration {
    PATIENT_NODE_TIMEOUT.min(ttl / 3)
}

/// What a scheduler on a loaded machine may add to any bound: a thread not
/// run for a while, a server process not scheduled.
pub const SCHEDULING_MARGIN: Duration = Duration::from_secs(2);

/// How many times slower than a quiet machine this one may be:
/// `REDLOCK_TEST_SLACK` (a whole number, at least 1), else 4.
pub fn slack() -> u32 {
    std::env::var("REDLOCK_TEST_SLACK")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(4)
}

/// The bound for something the settings say takes at most `allowed` on a
/// quiet machine: `allowed` × [`slack`] + [`SCHEDULING_MARGIN`].
pub fn liveness(allowed: Duration) -> Duration {
    allowed
        .saturating_mul(slack())
        .saturating_add(SCHEDULING_MARGIN)
}

/// How long after a call returned at quorum its last node has answered or
/// been given up on, for a handle with `node_timeout`: the straggler's reply
/// cannot come later than one node timeout after the call was sent.
pub fn settle(node_timeout: Duration) -> Duration {
    liveness(node_timeout)
}

/// [`settle`] for the node timeout most of the suite uses,
/// [`PATIENT_NODE_TIMEOUT`]: the default bound for a read of node state after
/// a call that returned at quorum.
pub fn settled() -> Duration {
    settle(PATIENT_NODE_TIMEOUT)
}
