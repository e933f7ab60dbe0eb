//! *Layer 2, one master (see `lib.rs`).*
//!
//! One Redis master: its pool and its connection (`connection`), the commands
//! and scripts run on it (`scripts`), the reading of their replies (`parse`),
//! and the bounded send of one call.

mod cluster;
mod cluster_acks;
mod coalesce;
mod connection;
mod dispatch;
mod from_url;
mod lua;
mod many;
mod native;
mod parse;
mod per_slot;
mod permit_scripts;
#[cfg(feature = "idempotency")]
mod record;
mod release_scripts;
mod replicas;
mod rwlock_scripts;
mod scripts;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use deadpool_redis::Pool;
use redis::{Cmd, Value};

use crate::error::NodeError;
use cluster::{Conn, NodePool};
#[cfg(feature = "test-hooks")]
pub use coalesce::check as coalesce_check;
pub use coalesce::{CoalesceStats, coalesce_stats};
use connection::Connections;
#[cfg(feature = "tls")]
pub(crate) use connection::ensure_crypto_provider;
#[cfg(feature = "tls")]
pub(crate) use from_url::{invalid_url, pool_from_info};
pub(crate) use parse::{
    AcquireReply, ReleaseReply, parse_acquire, parse_acquire_many, parse_flag, parse_release,
};
#[cfg(feature = "idempotency")]
pub(crate) use record::{RECORD_GENERATION, RECORD_GET, RECORD_PEEK, RECORD_PUT};
pub(crate) use scripts::Shape;

pub(crate) use coalesce::{BATCH, BATCH_OPS, renewal_code};
pub(crate) use release_scripts::{RELEASE_LUA, RELEASE_QUIET, RELEASE_QUIET_LUA};
pub(crate) use rwlock_scripts::RwKeys;
pub(crate) use scripts::{Call, EXTEND, EXTEND_READER, FENCE};

pub use native::{CompareAndDelete, NativeCommands, NativeSupport};
pub use replicas::ReplicaAcks;
pub(crate) use replicas::split_url;

/// How one call went.
pub(crate) struct Ran {
    pub(crate) result: Result<Value, NodeError>,
    pub(crate) latency: Duration,
}

pin_project_lite::pin_project! {
    /// `inner`, given up (`None`) when it is polled at or after `deadline`.
    /// It sets no timer: see [`Node::run_until`].
    struct ByDeadline<F> {
        #[pin]
        inner: F,
        deadline: Option<Instant>,
    }
}

impl<F: Future> Future for ByDeadline<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The answer first, as `tokio::time::timeout` does.
        if let Poll::Ready(out) = this.inner.poll(cx) {
            return Poll::Ready(Some(out));
        }
        match this.deadline {
            Some(deadline) if Instant::now() >= *deadline => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

pin_project_lite::pin_project! {
    /// A node call on its connection, holding the coalescer's `turn` (if
    /// any) until it answers, and given up with [`NodeError::Timeout`] when
    /// polled at or after `deadline` (from its first poll with
    /// `check_clock`, else from its second: see `Node::run_inner`).
    struct Holding<F> {
        #[pin]
        inner: F,
        turn: Option<crate::coalesce::Turn<coalesce::Queued>>,
        check_clock: bool,
        deadline: Option<Instant>,
        timeout: Duration,
    }
}

impl<F: Future<Output = Result<Value, NodeError>>> Future for Holding<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let polled = this.inner.poll(cx);
        // The answer first, as `tokio::time::timeout` does.
        if polled.is_ready() {
            *this.turn = None;
            return polled;
        }
        // Polled once: the command is on the connection, and what is sent
        // after it goes after it.
        if let Some(turn) = this.turn.as_mut() {
            turn.written();
        }
        let past = std::mem::replace(this.check_clock, true)
            && this
                .deadline
                .is_some_and(|deadline| Instant::now() >= deadline);
        if past {
            Poll::Ready(Err(NodeError::Timeout(*this.timeout)))
        } else {
            Poll::Pending
        }
    }
}

/// One independent Redis master.
pub(crate) struct Node {
    pub(crate) label: Arc<str>,
    /// The address the node was configured with (no password), when known; used
    /// to refuse the same server listed twice.
    pub(crate) address: Option<String>,
    /// redis' multiplexed connection pipelines concurrent calls over one socket, so
    /// one connection per node (and runtime) is the fastest path. The pool creates it (and creates
    /// it again after a failure); taking it out of the pool skips the `PING` that
    /// deadpool-redis sends to recycle a connection on every checkout. A
    /// cluster node's connection (`cluster.rs`) is one per master, the same way.
    pool: NodePool,
    /// The cached connection and the connection attempt under way, per Tokio
    /// runtime (see `per_runtime.rs`). Attempts run
    /// one at a time in a task of their own, so a call that gives up does not
    /// cancel the handshake the next call needs, and concurrent calls on a cold
    /// node share one connection instead of each opening their own.
    shared: Connections,
    /// How to open this node's pub/sub connection for wake-ups; known only for
    /// nodes given by URL (a cluster's: by its seed URLs).
    pub(crate) pubsub: Option<PubSubAt>,
    /// The node's database, when known (0 for a node given as a pool): the
    /// release announces itself on a channel of this database's.
    pub(crate) db: i64,
    /// Which native commands may replace the scripts on this node (the
    /// handle's setting, given by `Inner::new`).
    pub(crate) native: NativeCommands,
    /// How many replicas each acquire and extend write must reach (`None`:
    /// the node is taken to be an independent master, and nothing waits).
    pub(crate) replica_acks: Option<ReplicaAcks>,
    /// On a cluster node with replica acks, the replication ID last seen
    /// for each slot's master (`cluster_acks.rs`).
    replids: cluster_acks::Replids,
    /// The `WAIT`s of replica acks on the node (`replicas.rs`).
    waits: Arc<replicas::Waits>,
    /// Whether calls take part in the coalescer (the handle's setting, given
    /// by `Inner::new`; off by default).
    pub(crate) coalesce: bool,
}

/// Where a node's release announcements are heard (`wake/`).
#[derive(Clone)]
pub(crate) enum PubSubAt {
    /// A single server: `SUBSCRIBE` on a connection of its own.
    Server(Box<redis::ConnectionInfo>),
    /// A cluster, by its seeds: `SSUBSCRIBE` on the master of each key's slot.
    Cluster(Vec<redis::ConnectionInfo>),
}

impl Node {
    pub(crate) fn new(label: Arc<str>, address: Option<String>, pool: Pool) -> Self {
        Self::with_pool(label, address, NodePool::Single(pool))
    }

    fn with_pool(label: Arc<str>, address: Option<String>, pool: NodePool) -> Self {
        Self {
            label,
            address,
            pool,
            shared: Connections::default(),
            pubsub: None,
            db: 0,
            native: NativeCommands::Off,
            replica_acks: None,
            replids: cluster_acks::Replids::default(),
            waits: Arc::default(),
            coalesce: false,
        }
    }

    /// Lets waiters subscribe to this node's release messages.
    pub(crate) fn with_pubsub(mut self, info: redis::ConnectionInfo) -> Self {
        self.db = info.redis_settings().db();
        self.pubsub = Some(PubSubAt::Server(Box::new(info)));
        self
    }

    /// Sends one command on connection `generation`, noting any answer.
    async fn send(&self, generation: u64, conn: &mut Conn, cmd: &Cmd) -> redis::RedisResult<Value> {
        let reply = conn.send_packed_command(cmd).await;
        // A server error is an answer too: the connection works.
        if reply.is_ok() {
            self.answered(generation);
        }
        reply.and_then(Value::extract_error)
    }

    /// Runs `call` by `EVALSHA`, falling back to `EVAL` on `NOSCRIPT`, all under
    /// `timeout`. Returns the reply and the time it took.
    pub(crate) async fn run(
        &self,
        call: &Call,
        timeout: Duration,
    ) -> (Result<Value, NodeError>, Duration) {
        let ran = self.run_on(call, timeout).await;
        (ran.result, ran.latency)
    }

    /// [`Node::run`], also telling which connection the call went out on and
    /// when (see [`Ran`]).
    pub(crate) async fn run_on(&self, call: &Call, timeout: Duration) -> Ran {
        let start = Instant::now();
        let mut used = None;
        let result =
            match tokio::time::timeout(timeout, self.run_inner(call, timeout, None, &mut used))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(NodeError::Timeout(timeout)),
            };
        self.ran(result, start, used, timeout)
    }

    /// [`Node::run_on`] without a timer of its own: the call gives up with
    /// [`NodeError::Timeout`] when it is polled `timeout` or more after its
    /// first poll, so whoever polls it must be woken by then. A fan-out
    /// ([`crate::protocol::fan_out::Fan`]) keeps one timer for all its calls, instead
    /// of a timer per call, each of which takes the Tokio timer's lock twice.
    pub(crate) async fn run_until(&self, call: &Call, timeout: Duration) -> Ran {
        let start = Instant::now();
        let mut used = None;
        // The deadline is checked inside `run_inner`, not by a wrapper
        // around it: every wrapper copies the call's whole future (about
        // 1.8 KB) once more (BENCHMARKS.md at 9debf85, "Copies, clock reads and
        // allocations per node call").
        let deadline = start.checked_add(timeout);
        let result = self.run_inner(call, timeout, deadline, &mut used).await;
        self.ran(result, start, used, timeout)
    }

    /// How a call that started at `start`, with `timeout`, went.
    fn ran(
        &self,
        result: Result<Value, NodeError>,
        start: Instant,
        used: Option<u64>,
        timeout: Duration,
    ) -> Ran {
        if let Err(e) = &result {
            self.forget_connection(e, used, start, timeout);
        }
        Ran {
            result,
            latency: start.elapsed(),
        }
    }

    /// The call on its connection; given up with [`NodeError::Timeout`] when
    /// it is polled at or after `deadline` (`None`: the caller bounds it).
    async fn run_inner(
        &self,
        call: &Call,
        timeout: Duration,
        deadline: Option<Instant>,
        used: &mut Option<u64>,
    ) -> Result<Value, NodeError> {
        // With the node's connection at hand, the first poll of the send
        // below comes right after the caller read the clock for `deadline`,
        // and need not read it again.
        let (shared, generation, conn, check_clock) = match self.cached_here(used) {
            Some((shared, generation, conn)) => (Some(shared), generation, conn, false),
            None => match (ByDeadline {
                inner: self.connection(timeout, used),
                deadline,
            })
            .await
            {
                Some(conn) => {
                    let (generation, conn) = conn?;
                    (None, generation, conn, true)
                }
                None => return Err(NodeError::Timeout(timeout)),
            },
        };
        // A plain call that finds the node's connection busy with another
        // waits in the node's coalescer and goes out in a batch; alone, it
        // holds the coalescer's turn until it answers, and what queued
        // meanwhile then goes out together (`coalesce.rs`).
        // (The connection goes in and comes back by value: a borrow of it
        // here would keep it apart from the call's state, 64 bytes more on
        // every node call's future.)
        let shared = shared.map(|s| -> Arc<dyn coalesce::Home> { s });
        let entered = self.enter(call, shared, generation, conn, timeout, deadline);
        let (turn, conn) = match entered {
            coalesce::Entered::No(conn) => (None, conn),
            coalesce::Entered::Alone(turn, conn) => (Some(turn), conn),
            // Queued, or waiting behind the queue: boxed, so that a wait
            // costs the common path nothing. Each in a box of its own size:
            // a queued call's wait is small, and in one future with the
            // call that waits for the turn (a whole node call) it was
            // about 2 KB, past the allocator's per-thread cache, allocated
            // and copied for every queued operation.
            coalesce::Entered::Wait(coalesce::Wait::Queued(rx, conn)) => {
                return Box::pin(self.queued_until(call, rx, conn, timeout, deadline)).await;
            }
            coalesce::Entered::Wait(wait) => {
                return Box::pin(self.wait_in_queue(call, wait, generation, timeout, deadline))
                    .await;
            }
        };
        // No order among calls is read from when they were first polled: a
        // command that finds no room on its connection goes onto it only when
        // polled again, after commands sent later may have found room (see
        // `Late::deleted_by_release`).
        Holding {
            inner: self.run_call(call, generation, conn, timeout),
            turn,
            check_clock,
            deadline,
            timeout,
        }
        .await
    }

    /// Runs a plain command (used for `INFO server`) under `timeout`.
    pub(crate) async fn query(&self, cmd: &Cmd, timeout: Duration) -> Result<Value, NodeError> {
        let start = Instant::now();
        let mut used = None;
        let result = match tokio::time::timeout(timeout, async {
            let (generation, mut conn) = self.connection(timeout, &mut used).await?;
            self.send(generation, &mut conn, cmd)
                .await
                .map(cluster::one_members_reply)
                .map_err(|e| NodeError::from_redis(&e))
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        if let Err(e) = &result {
            self.forget_connection(e, used, start, timeout);
        }
        result
    }
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, F: FnOnce(A) -> Fut, Fut>(_f: F) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every node call's future is moved into its fan-out's set: the common
    /// path keeps it to one `send` and a timeout (1776 bytes on rustc 1.95;
    /// 2216 since the coalescer moved into the connection state, c98a88e,
    /// where the 440 bytes more come from is not yet found; 2424 with the
    /// rare shapes inline). The bound leaves room for other compilers and
    /// redis versions, not for the rare shapes coming back.
    #[test]
    fn a_node_call_future_holds_one_send_not_the_rare_shapes() {
        let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let node = Node::new("n".into(), None, pool);
        let call = Call::release("k".into(), "t".into());
        let timeout = Duration::from_millis(1);
        let whole = future_size(|()| node.run_on(&call, timeout));
        // A fan-out's call: the same without its own timer.
        let until = future_size(|()| node.run_until(&call, timeout));
        assert!(
            until < whole,
            "fan-out call {until} bytes, with a timer {whole}"
        );
        let get = redis::cmd("GET");
        let send = future_size(|conn: &'static mut redis::aio::MultiplexedConnection| {
            conn.send_packed_command(&get)
        });
        assert!(
            whole < send + 1280,
            "node call {whole} bytes, one send {send}"
        );
    }
}
