//! One node's failure ([`NodeError`]): the bottom of the crate, below the
//! node layer that produces it and the reports and errors that carry it.

use std::time::Duration;

/// Why one node's call failed.
///
/// A node error never fails an operation on its own: the operation fails only when
/// the errors make a quorum impossible. The [`Report`](crate::Report) inside the operation's
/// [`Error`](crate::Error) then lists every node's outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The node could not be reached: connection refused, DNS failure, or the pool
    /// could not create a connection.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection broke mid-call (reset, broken pipe, closed by the server).
    #[error("connection lost: {0}")]
    Io(String),
    /// The node did not answer within the per-node timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The key holds a value this library did not write and cannot own: another
    /// application uses the same key name.
    #[error("key holds a foreign {found} value (pttl {pttl_ms} ms)")]
    WrongType {
        /// The Redis `TYPE` of the value found at the key (`"?"` when the node only
        /// said `WRONGTYPE` and did not tell).
        found: String,
        /// The `PTTL` seen at the key: `-1` for no expiry, `-2` when unknown.
        pttl_ms: i64,
    },
    /// A semaphore's permit was asked for with another number of permits
    /// than the one the node keeps for it, which a client still holding a
    /// permit of it gave ([`Redlock::semaphore`](crate::Redlock::semaphore)):
    /// every client of one resource must use the same count. Nothing was
    /// taken on the node.
    #[error("the semaphore's count here is {found}, another than the one asked for")]
    PermitsMismatch {
        /// The count the node keeps.
        found: String,
    },
    /// The script cache did not have the script even after the `EVAL` fallback.
    #[error("NOSCRIPT: {0}")]
    NoScript(String),
    /// The node is a read-only replica. Redlock needs independent masters.
    #[error("READONLY: the node is a replica, not a master")]
    ReadOnly,
    /// The node is over `maxmemory` and refuses writes.
    #[error("OOM: the node is over maxmemory and refuses writes")]
    OutOfMemory,
    /// Authentication is missing or wrong (`NOAUTH`, `WRONGPASS`, `NOPERM`).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The node is still loading its dataset into memory.
    #[error("LOADING: the node is loading its dataset")]
    Loading,
    /// The node is busy running another script.
    #[error("BUSY: the node is running a long script")]
    ScriptBusy,
    /// Any other error reply from the server.
    #[error("server error {code}: {message}")]
    Server {
        /// The error code, the first word of the reply (for example `ERR`).
        code: String,
        /// The rest of the reply.
        message: String,
    },
    /// The reply did not have the shape the script returns.
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// The node wrote, but fewer of its replicas than its
    /// [`ReplicaAcks`](crate::ReplicaAcks) ask for acknowledged the write in
    /// time (`WAIT`): a failover could promote a replica without it, so the
    /// node does not count for the quorum.
    #[error(
        "the write{} reached {acked} of the {wanted} replica(s) wanted{} within {waited:?}{}",
        on_master(.master),
        aof_note(.local_aof),
        if *.queued {
            " (the call had not finished when the node timeout was about to end, with \
             a WAIT in flight on the node: the server runs a connection's commands in \
             order, and it waited behind WAITs; no ack was counted)"
        } else {
            ""
        }
    )]
    ReplicaAcks {
        /// How many replicas acknowledged the write.
        acked: u64,
        /// How many the node's setting asks for.
        wanted: u32,
        /// How long `WAIT` waited.
        waited: Duration,
        /// On a cluster node, the master and slot whose write was short of
        /// acks (`127.0.0.1:7000, slot 866`); `None` on a single server.
        master: Option<String>,
        /// With `WAITAOF` ([`ReplicaAcks::aof`](crate::ReplicaAcks::aof)):
        /// whether the master's own AOF had the write fsynced (its first
        /// answer); `acked` then counts replicas that fsynced it. `None`
        /// with `WAIT`.
        local_aof: Option<bool>,
        /// The call (its write, or its `WAIT`) had not finished when its
        /// node timeout was about to end, while a `WAIT` was in flight on
        /// the node, and was given up (`acked` is then 0: no ack was
        /// counted). The server runs one connection's commands in order, so
        /// concurrent acked writes queue behind each other's `WAIT`: with
        /// fewer replicas attached than wanted, each takes its whole wait.
        queued: bool,
    },
    /// The node's acks ask for `WAITAOF` and its server lacks the command
    /// (Redis before 7.2, Valkey before 8): the node cannot count for an
    /// acquire or an extend. The server's words are kept.
    #[error("WAITAOF is not supported by this server (Redis >= 7.2 or Valkey >= 8 has it): {0}")]
    NoWaitAof(String),
    /// On a cluster node with [`ReplicaAcks`](crate::ReplicaAcks), the
    /// master of a slot the call wrote was not the one seen before the
    /// write (its replication ID changed: a failover, or a master restarted
    /// empty, came between them), so the replica acks were counted on
    /// another master than the write's and may not be the write's: the
    /// write may be lost, and the node does not count for this call. The
    /// node now knows the new master, and a retry counts again.
    #[error(
        "the master of slot {slot} changed between the write and its replica acks \
         (now {}): the acks may not be the write's and the write may be lost, so this \
         node does not count for this call; it may be retried",
        .master.as_deref().unwrap_or("?")
    )]
    MasterChanged {
        /// The slot whose master changed.
        slot: u16,
        /// The slot's master that answered the acks' pipeline
        /// (`127.0.0.1:7003`), as this client reached it, when known.
        master: Option<String>,
    },
}

/// `" on master <address, slot>"` for a cluster node's short write.
fn on_master(master: &Option<String>) -> String {
    master
        .as_deref()
        .map_or_else(String::new, |m| format!(" on master {m}"))
}

/// How a `WAITAOF` shortfall is told: `" (fsynced to their AOF; this
/// master's own AOF: yes)"`.
fn aof_note(local: &Option<bool>) -> String {
    match local {
        Some(local) => format!(
            " (fsynced to their AOF; this master's own AOF: {})",
            if *local { "yes" } else { "no" }
        ),
        None => String::new(),
    }
}

impl NodeError {
    /// Maps a `redis` error to the node error that says what happened.
    pub(crate) fn from_redis(err: &redis::RedisError) -> Self {
        if let Some(code) = err.code() {
            let message = err.detail().unwrap_or_default().to_owned();
            return match code {
                "WRONGTYPE" => NodeError::WrongType {
                    found: "?".to_owned(),
                    pttl_ms: -2,
                },
                "NOSCRIPT" => NodeError::NoScript(message),
                "READONLY" => NodeError::ReadOnly,
                "OOM" => NodeError::OutOfMemory,
                "NOAUTH" | "WRONGPASS" | "NOPERM" => NodeError::Auth(format!("{code} {message}")),
                "LOADING" => NodeError::Loading,
                "BUSY" => NodeError::ScriptBusy,
                _ => NodeError::Server {
                    code: code.to_owned(),
                    message,
                },
            };
        }
        if err.kind() == redis::ErrorKind::AuthenticationFailed {
            return NodeError::Auth(err.to_string());
        }
        if err.is_connection_refusal() {
            return NodeError::Connect(err.to_string());
        }
        if err.is_timeout() {
            return NodeError::Io(format!("timed out: {err}"));
        }
        if err.is_io_error() || err.is_connection_dropped() {
            return NodeError::Io(err.to_string());
        }
        NodeError::Protocol(err.to_string())
    }

    /// Whether the node answered and refused: every error but a connection
    /// that could not be made or broke ([`Connect`](Self::Connect),
    /// [`Io`](Self::Io)) and no answer in time ([`Timeout`](Self::Timeout)).
    /// A refusing node is up: a fail-open policy does not run unlocked past it.
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            NodeError::Connect(_) | NodeError::Io(_) | NodeError::Timeout(_)
        )
    }

    /// Whether the cached connection to the node should be dropped and made anew.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(
            self,
            NodeError::Connect(_)
                | NodeError::Io(_)
                | NodeError::Timeout(_)
                | NodeError::Protocol(_)
        )
    }
}
