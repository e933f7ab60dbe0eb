//! The model's state: nodes, clients, messages and the rules under test.

/// Nodes.
pub(super) const N: usize = 3;
/// Quorum, N/2 + 1.
pub(super) const Q: u32 = N as u32 / 2 + 1;
pub(super) const MAX_CLIENTS: usize = 3;
/// Attempts per client, at most; attempt `k` of client `c` is `c * PER_CLIENT + k`.
pub(super) const PER_CLIENT: u8 = 2;
pub(super) const MAX_ATTEMPTS: usize = MAX_CLIENTS * PER_CLIENT as usize;
/// `Client::started` of a client slot the run does not use.
pub(super) const ABSENT: u8 = u8::MAX;
/// Every node, as a bitmask.
pub(super) const ALL: u8 = (1 << N) - 1;
pub(super) const NODE_NAMES: [char; N] = ['A', 'B', 'C'];

/// The always-property.
pub(super) const MONOTONE: &str = "tokens strictly increase in the order holders start";
/// The sometimes-property that keeps a passing check from being vacuous.
pub(super) const HOLDER_AFTER_RESTART: &str = "two holders, one after a restart";
/// Its counterpart for the checks with counter expiry.
pub(super) const HOLDER_AFTER_EXPIRY: &str = "two holders, one after a counter expired";

/// How a client turns what the OK nodes said into a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Rule {
    /// One phase: every OK `SET` also `INCR`s the node's counter; `T = max`.
    NaiveIncr,
    /// Two phases, `T = max(C_i) + 1`, then the fence.
    Counter,
    /// Two phases, `T = max(C_i, TIME_i) + 1`, then the fence.
    Hybrid,
}

/// What a node keeps across a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Persistence {
    /// Keys and counters (`appendfsync always`).
    Fsync,
    /// Nothing.
    None,
}

/// The model's configuration (the state is [`State`]).
#[derive(Clone, Debug)]
pub(super) struct Fencing {
    pub(super) rule: Rule,
    pub(super) persistence: Persistence,
    /// A node restarts only once every key it held at its crash belongs to a
    /// dead attempt (Redlock's delayed restart).
    pub(super) restart_after_locks: bool,
    /// A node restarts only after this many ticks down.
    pub(super) min_down_ticks: u8,
    /// Clients, at most [`MAX_CLIENTS`].
    pub(super) clients: usize,
    /// Attempts per client.
    pub(super) attempts: u8,
    /// Crashes in a run, all nodes together.
    pub(super) crashes: u8,
    /// The bound on `now`; 0 for the rules that do not read clocks.
    pub(super) max_time: u8,
    /// Node clock offsets, one initial state each.
    pub(super) offsets: Vec<[u8; N]>,
    /// Counters expire ([`Action::ExpireCounter`]) once this many ticks
    /// passed since the last fence applied on the node; `None`: never.
    pub(super) counter_expiry: Option<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct State {
    pub(super) now: u8,
    pub(super) offsets: [u8; N],
    pub(super) nodes: [Node; N],
    pub(super) clients: [Client; MAX_CLIENTS],
    /// The network: per attempt, the nodes its `SET` is still in flight to.
    pub(super) sets: [u8; MAX_ATTEMPTS],
    /// Per attempt, the nodes its fence is still in flight to, and its token.
    pub(super) fences: [u8; MAX_ATTEMPTS],
    pub(super) fence_t: [u8; MAX_ATTEMPTS],
    pub(super) crashes: u8,
    /// Attempts that became holders so far.
    pub(super) holders: u8,
    /// The largest token handed out to a holder so far.
    pub(super) max_token: u8,
    /// A holder got a token not above an earlier holder's.
    pub(super) violated: bool,
    /// An attempt became holder after some node had restarted.
    pub(super) held_after_restart: bool,
    /// Some counter expired.
    pub(super) counter_expired: bool,
    /// An attempt became holder after a counter had expired.
    pub(super) held_after_expiry: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Node {
    pub(super) up: bool,
    /// The attempt whose `tok` the key holds.
    pub(super) key: Option<u8>,
    pub(super) counter: u8,
    /// Ticks spent down, counted up to [`Fencing::min_down_ticks`] (all that
    /// the restart rule looks at).
    pub(super) down_ticks: u8,
    /// The key lost in the last crash without persistence (for the restart rule).
    pub(super) lost: Option<u8>,
    /// Ticks since a fence was last applied here (which sets or refreshes
    /// the counter's expiry), counted up to [`Fencing::counter_expiry`].
    pub(super) idle_ticks: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Client {
    /// Attempts started; the current one is `started - 1`.
    pub(super) started: u8,
    pub(super) phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Phase {
    /// No live attempt.
    Idle,
    /// Waiting for OKs: `ok` is a node bitmask; per OK node, `read` is the value
    /// it answered (per the rule: counter, or `max(counter, TIME)`; 0 for the
    /// others); `fresh` the OK nodes read during the current clock unit (hybrid
    /// rule: the pick must not use them before the next tick).
    Acquiring { ok: u8, read: [u8; N], fresh: u8 },
    /// Waiting until the client counts Q fence acknowledgements: `applied` is
    /// the node bitmask of the nodes that applied `t`.
    Fencing { t: u8, applied: u8 },
    /// Holding the lock with token `t`, within its validity.
    Holding { t: u8 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Msg {
    /// `SET key tok(a) NX`, to `node`.
    Set { a: u8, node: u8 },
    /// The fence script with token `t`, to `node`.
    Fence { a: u8, node: u8, t: u8 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Action {
    /// Client starts its next attempt: `SET` to every node.
    Start(usize),
    /// One in-flight request arrives and is processed.
    Deliver(Msg),
    /// Client picks `T` from the OKs of a quorum-sized subset (bitmask) of the
    /// nodes that said OK so far, and sends the fence (naive rule: holds at
    /// once).
    Pick(usize, u8),
    /// Client counts Q fence acknowledgements: it holds the lock.
    Hold(usize),
    /// Client gives up its attempt, or its validity ends (the attempt dies).
    Abandon(usize),
    /// A dead attempt's key vanishes from a node (TTL, or a late release).
    Expire(usize),
    /// A node's counter expires: idle for [`Fencing::counter_expiry`] ticks.
    ExpireCounter(usize),
    Crash(usize),
    Restart(usize),
    /// Real time advances one unit (hybrid rule only).
    Tick,
}

pub(super) fn bit(i: usize) -> u8 {
    1 << i
}

pub(super) fn nodes_of(mask: u8) -> String {
    (0..N)
        .filter(|&i| mask & bit(i) != 0)
        .map(|i| NODE_NAMES[i])
        .collect()
}
