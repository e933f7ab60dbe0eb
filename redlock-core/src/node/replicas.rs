//! Replica acks: a node that is one primary with replicas behind a failover
//! endpoint counts for an acquire or an extend only once its write reached
//! `n` replicas ([`ReplicaAcks`]).
//!
//! `WAIT` is refused inside a script, so it follows the write as a command of
//! its own on the same connection: `WAIT` counts the replicas that acknowledged
//! this client's last write, and on a multiplexed connection that write is
//! this call's or a later one's, never an earlier one's. It blocks the
//! connection while it waits (Redis runs one client's commands in order), so
//! every call on the node waits behind it: the guide's servers chapter
//! (`docs/guide/servers.md`, "Replicas and failover") says
//! what that costs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::cluster::Conn;
use redis::Value;

use super::Node;
use super::from_url::invalid_url;
use super::scripts::Call;
use crate::error::{Error, NodeError};

/// How many replicas a node's acquire and extend writes must reach, and how
/// long to wait for them (`WAIT replicas timeout` after each write).
///
/// Give it to a node that is one primary with replicas behind an address
/// that moves to the promoted replica on failover (a managed service, a
/// Sentinel group behind a proxy): without it, a failover that promotes a
/// replica which had not yet received a lock key hands the key out again.
/// With it, a write that fewer than `replicas` replicas acknowledged within
/// the timeout does not count for the quorum
/// ([`NodeError::ReplicaAcks`]). Releases do not wait.
///
/// The timeout is cut, on each call, to three quarters of what is left of
/// the node timeout, so that the node answers within it; `Duration::MAX`
/// means "as long as the node timeout allows". A timeout above three
/// quarters of the node timeout could never be waited for: the builder
/// refuses it, naming the node timeout to set.
///
/// With [`ReplicaAcks::aof`] the wait is `WAITAOF` (Redis 7.2, Valkey 8):
/// the write counts once fsynced to the append-only file of this master
/// and/or of `replicas` replicas, so that it survives a restart of the
/// whole shard as well as a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReplicaAcks {
    replicas: u32,
    timeout: Duration,
    /// `Some(local)`: `WAITAOF local replicas`, else `WAIT replicas`.
    aof_local: Option<bool>,
}

impl ReplicaAcks {
    /// Wait for `replicas` replicas for at most `timeout`. `replicas` must
    /// be at least 1 and `timeout` must fit the handle's node timeout (see
    /// [`ReplicaAcks`]): the builder refuses another
    /// ([`Error::InvalidConfig`]). To turn acks off, give no `ReplicaAcks`
    /// (`NodeSpec::replica_acks(0, ..)`).
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            aof_local: None,
        }
    }

    /// Wait by `WAITAOF` for the write to be fsynced to the AOF of this
    /// master (`local`, which needs `appendonly yes` there) and of
    /// `replicas` replicas (which need it too), for at most `timeout`. At
    /// least one of the two is waited for (`local` when both are off). A
    /// server without `WAITAOF` fails every acquire and extend on the node
    /// with [`NodeError::NoWaitAof`], and `redlock check` says so.
    pub fn aof(local: bool, replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            aof_local: Some(local || replicas == 0),
        }
    }

    /// `Some(local)` when the node waits by `WAITAOF`: whether this
    /// master's own AOF must have the write; `None` for `WAIT`.
    pub fn aof_local(&self) -> Option<bool> {
        self.aof_local
    }

    /// The command that waits for the acks, for at most `wait_ms`.
    pub(super) fn command(&self, wait_ms: u64) -> redis::Cmd {
        match self.aof_local {
            None => {
                let mut c = redis::cmd("WAIT");
                c.arg(self.replicas).arg(wait_ms);
                c
            }
            Some(local) => {
                let mut c = redis::cmd("WAITAOF");
                c.arg(u8::from(local)).arg(self.replicas).arg(wait_ms);
                c
            }
        }
    }

    /// The replica acks a node URL asks for (`?replica_acks=n` and
    /// optionally `&replica_timeout_ms=ms`; `None`: none), as the builder
    /// reads them. A cluster node's seeds carry them the same way.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when the parameters are not whole numbers, or
    /// ask for 0 replicas (no password in the error).
    pub fn from_url(url: &str) -> Result<Option<Self>, Error> {
        split_url(url).map(|(_, acks)| acks)
    }

    /// How many replicas must acknowledge each write.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// The longest one `WAIT` may take (before the cut to the node timeout).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Refuses acks that no call of `node` could wait for, with a handle
    /// whose node timeout is `node_timeout`: `WAIT` for no replica, or an
    /// ack timeout above the three quarters of the node timeout that the
    /// wait is cut to ([`ReplicaAcks`]). The message says what to set.
    pub(crate) fn check(&self, node: &str, node_timeout: Duration) -> Result<(), Error> {
        if self.aof_local.is_none() && self.replicas == 0 {
            return Err(Error::InvalidConfig(format!(
                "node {node}: ReplicaAcks::new(0, ..) waits for no replica; give at least 1, \
                 or no acks at all (NodeSpec::replica_acks(0, ..) turns them off)"
            )));
        }
        let room = node_timeout.saturating_sub(node_timeout / 4);
        if self.timeout != Duration::MAX && self.timeout > room {
            let needed = self.timeout.saturating_add(self.timeout / 3);
            return Err(Error::InvalidConfig(format!(
                "node {node}: a replica ack timeout of {:?} cannot fit the node timeout of \
                 {node_timeout:?}, which leaves at most three quarters ({room:?}) for the wait; \
                 set node_timeout to at least {needed:?}, or the ack timeout to at most {room:?}",
                self.timeout
            )));
        }
        Ok(())
    }

    /// The `WAIT` timeout in milliseconds for a call that has `left` of its
    /// node timeout: at least 1 (`WAIT n 0` would block for ever).
    pub(super) fn wait_ms(&self, left: Duration) -> u64 {
        let cut = left.saturating_sub(left / 4);
        let ms = self.timeout.min(cut).as_millis();
        // Redis refuses a timeout that overflows its clock; 49 days is ample.
        u64::try_from(ms)
            .unwrap_or(u64::MAX)
            .clamp(1, u64::from(u32::MAX))
    }
}

/// The URL query parameters that set a node's [`ReplicaAcks`]:
/// `replica_acks=<n>` and, optionally, `replica_timeout_ms=<ms>` (default:
/// as long as the node timeout allows).
const ACKS: &str = "replica_acks";
const TIMEOUT_MS: &str = "replica_timeout_ms";
/// `waitaof=<0|1>`: wait by `WAITAOF` ([`ReplicaAcks::aof`]), `1` with
/// this master's own AOF; `replica_acks` (may be 0 then) is the replicas'.
const WAITAOF: &str = "waitaof";

/// `url` without its replica-ack parameters, and the [`ReplicaAcks`] they
/// set. Other query parameters stay for redis to read.
pub(crate) fn split_url(url: &str) -> Result<(String, Option<ReplicaAcks>), Error> {
    let (base, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let Some((path, query)) = base.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let (mut acks, mut timeout_ms, mut aof, mut rest) = (None, None, None, Vec::new());
    let number = |name: &str, value: &str| {
        value
            .parse::<u64>()
            .map_err(|_| invalid_url(url, format!("{name}={value:?} is not a whole number")))
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((ACKS, v)) => acks = Some(number(ACKS, v)?),
            Some((TIMEOUT_MS, v)) => timeout_ms = Some(number(TIMEOUT_MS, v)?),
            Some((WAITAOF, v)) => match number(WAITAOF, v)? {
                local @ (0 | 1) => aof = Some(local == 1),
                _ => return Err(invalid_url(url, format!("{WAITAOF} must be 0 or 1"))),
            },
            _ => rest.push(pair),
        }
    }
    let timeout = timeout_ms.map_or(Duration::MAX, Duration::from_millis);
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let acks = match (acks, aof, timeout_ms) {
        (None, None, None) => None,
        (None, None, Some(_)) => {
            return Err(invalid_url(url, format!("{TIMEOUT_MS} needs {ACKS}=<n>")));
        }
        (Some(0), None, _) => {
            return Err(invalid_url(url, format!("{ACKS} must be at least 1")));
        }
        (Some(n), None, _) => Some(ReplicaAcks::new(count(n), timeout)),
        (n, Some(local), _) => Some(ReplicaAcks::aof(local, count(n.unwrap_or(0)), timeout)),
    };
    let mut out = path.to_owned();
    if !rest.is_empty() {
        out.push('?');
        out.push_str(&rest.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok((out, acks))
}

/// Whether `call` waits for replicas: every write but a release.
pub(super) fn waits(call: &Call) -> bool {
    match call {
        Call::Release { .. } | Call::ReleaseMany { .. } => false,
        Call::Script { script, .. } => {
            !std::ptr::eq(*script, &*super::release_scripts::RELEASE_QUIET)
        }
        _ => true,
    }
}

/// Whether `reply` says the call wrote nothing: a refused `SET`, an extend
/// that found the key not held (`0`), a batched extend that found none of
/// its keys held (every answer `0`). Those need no acks; anything else waits,
/// a multi-resource acquire's refusal too (`{0, i, pttl, type}` cannot be
/// told from a batch that extended its later keys).
fn wrote_nothing(call: &Call, reply: &Value) -> bool {
    match (call, reply) {
        (Call::Set { .. }, Value::Array(_)) => true,
        (Call::Acquire { .. }, Value::Array(items)) => items.first() == Some(&Value::Nil),
        (Call::Script { .. } | Call::Keys { .. }, Value::Int(0)) => true,
        (Call::Keys { .. }, Value::Array(items)) => {
            !items.is_empty() && items.iter().all(|v| *v == Value::Int(0))
        }
        _ => false,
    }
}

impl Node {
    /// [`Node::run_call`] for a write on a node with replica acks: the
    /// write, then, if it wrote, `WAIT` on the same connection. Fewer acks
    /// than wanted make it [`NodeError::ReplicaAcks`]. `timeout` is the
    /// call's node timeout, counted from here.
    pub(super) async fn run_acked(
        &self,
        acks: ReplicaAcks,
        call: &Call,
        generation: u64,
        conn: Conn,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let start = Instant::now();
        // Redis runs one connection's commands in order, so a `WAIT`
        // blocks what comes after it on the connection: this call's own
        // `WAIT` behind other calls' (each up to its whole wait when fewer
        // replicas are attached than wanted), and even its write. Such a
        // call would end with `Timeout`, sending an operator to look for a
        // slow server where acks are short. The call is given up an eighth
        // of its node timeout before the end; if a `WAIT` was in flight on
        // the node meanwhile, it says so ([`NodeError::ReplicaAcks`] with
        // `queued`), else it is the timeout it is.
        let seen = self.waits.seen();
        let acked = self.run_acked_within(acks, call, generation, conn, timeout, start);
        match tokio::time::timeout(timeout.saturating_sub(timeout / 8), acked).await {
            Ok(done) => done,
            Err(_) if self.waits.since(seen) => Err(NodeError::ReplicaAcks {
                acked: 0,
                wanted: acks.replicas,
                waited: start.elapsed(),
                master: None,
                local_aof: None,
                queued: true,
            }),
            Err(_) => Err(NodeError::Timeout(timeout)),
        }
    }

    /// [`Node::run_acked`]'s write and wait, counting its `WAIT` in flight.
    async fn run_acked_within(
        &self,
        acks: ReplicaAcks,
        call: &Call,
        generation: u64,
        conn: Conn,
        timeout: Duration,
        start: Instant,
    ) -> Result<Value, NodeError> {
        let mut wait_conn = conn.clone();
        // On a cluster, each slot's master as seen before the write: its
        // acks count only if the same master answers the `WAIT`.
        let slots = match &conn {
            Conn::Cluster(_) => Some(self.slots_before(call, generation, &conn).await?),
            Conn::Single(_) => None,
        };
        let reply = self.run_written(call, generation, conn).await?;
        if wrote_nothing(call, &reply) {
            return Ok(reply);
        }
        let wait_ms = acks.wait_ms(timeout.saturating_sub(start.elapsed()));
        let _counted = self.waits.start();
        if let Some(slots) = slots {
            self.wait_slots(slots, acks, wait_ms, generation, &wait_conn)
                .await?;
            return Ok(reply);
        }
        let answer = self
            .send(generation, &mut wait_conn, &acks.command(wait_ms))
            .await
            .map_err(|e| wait_failed(&e))?;
        counted(acks, &answer, wait_ms, None)?;
        Ok(reply)
    }
}

/// The `WAIT`s of replica acks on one node: how many are in flight, and how
/// many ever started. A call that ran out of time while any was in flight,
/// at its start or since, may have queued behind it.
#[derive(Debug, Default)]
pub(super) struct Waits {
    in_flight: AtomicUsize,
    started: AtomicU64,
}

/// What [`Waits::seen`] saw when a call began.
#[derive(Clone, Copy)]
pub(super) struct Seen {
    in_flight: bool,
    started: u64,
}

impl Waits {
    /// The state at a call's start.
    pub(super) fn seen(&self) -> Seen {
        Seen {
            in_flight: self.in_flight.load(Ordering::SeqCst) > 0,
            started: self.started.load(Ordering::SeqCst),
        }
    }

    /// Whether a `WAIT` was in flight at `seen`, started since, or is now.
    pub(super) fn since(&self, seen: Seen) -> bool {
        seen.in_flight
            || self.started.load(Ordering::SeqCst) != seen.started
            || self.in_flight.load(Ordering::SeqCst) > 0
    }

    /// One `WAIT` sent: counted in flight while the guard lives (a call
    /// given up or cancelled drops it).
    pub(super) fn start(&self) -> InFlight<'_> {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }
}

/// One `WAIT` in flight ([`Waits::start`]).
pub(super) struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why the `WAIT` or `WAITAOF` failed: a server without `WAITAOF` says
/// so by an unknown command ([`NodeError::NoWaitAof`]).
pub(super) fn wait_failed(e: &redis::RedisError) -> NodeError {
    match NodeError::from_redis(e) {
        NodeError::Server { code, message }
            if code == "ERR" && message.to_ascii_lowercase().contains("unknown command") =>
        {
            NodeError::NoWaitAof(format!("{code} {message}"))
        }
        other => other,
    }
}

/// `WAIT`'s or `WAITAOF`'s `answer` judged: fewer acks than `acks` wants
/// make [`NodeError::ReplicaAcks`] (naming the cluster `master` it was, if
/// any).
pub(super) fn counted(
    acks: ReplicaAcks,
    answer: &Value,
    wait_ms: u64,
    master: Option<String>,
) -> Result<(), NodeError> {
    let count = |v: &Value| match v {
        Value::Int(n) => Some(u64::try_from(*n).unwrap_or(0)),
        _ => None,
    };
    let (local, acked) = match (acks.aof_local, answer) {
        (None, v) => (None, count(v)),
        (Some(_), Value::Array(items)) if items.len() == 2 => {
            (count(&items[0]).map(|l| l > 0), count(&items[1]))
        }
        _ => (None, None),
    };
    let Some(acked) = acked else {
        return Err(NodeError::Protocol(format!(
            "{} answered {answer:?}, not a count of replicas",
            if acks.aof_local.is_some() {
                "WAITAOF"
            } else {
                "WAIT"
            }
        )));
    };
    let local_short = acks.aof_local == Some(true) && local != Some(true);
    if acked < u64::from(acks.replicas) || local_short {
        return Err(NodeError::ReplicaAcks {
            acked,
            wanted: acks.replicas,
            waited: Duration::from_millis(wait_ms),
            master,
            local_aof: local,
            queued: false,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_parameters_are_taken_out_and_read() {
        let (url, acks) =
            split_url("redis://:pw@h:6379/2?replica_acks=2&protocol=resp3&replica_timeout_ms=40")
                .unwrap();
        assert_eq!(url, "redis://:pw@h:6379/2?protocol=resp3");
        assert_eq!(acks, Some(ReplicaAcks::new(2, Duration::from_millis(40))));
        let (url, acks) = split_url("redis://h?replica_acks=1").unwrap();
        assert_eq!(url, "redis://h");
        assert_eq!(acks.map(|a| a.timeout()), Some(Duration::MAX));
        assert_eq!(split_url("redis://h").unwrap(), ("redis://h".into(), None));
        for bad in [
            "redis://:pw123@h?replica_acks=0",
            "redis://:pw123@h?replica_acks=x",
            "redis://:pw123@h?replica_timeout_ms=5",
        ] {
            let e = split_url(bad).unwrap_err().to_string();
            assert!(!e.contains("pw123"), "{e}");
        }
    }

    #[test]
    fn waitaof_is_asked_for_by_url_and_judged_by_both_counts() {
        let acks = |url: &str| split_url(url).unwrap().1.unwrap();
        let a = acks("redis://h?waitaof=1&replica_acks=1&replica_timeout_ms=40");
        assert_eq!(a, ReplicaAcks::aof(true, 1, Duration::from_millis(40)));
        let cmd = a.command(40).get_packed_command();
        assert_eq!(
            cmd,
            redis::cmd("WAITAOF")
                .arg(1)
                .arg(1)
                .arg(40)
                .get_packed_command()
        );
        assert_eq!(acks("redis://h?waitaof=0").aof_local(), Some(true));
        assert_eq!(
            acks("redis://h?waitaof=0&replica_acks=2").aof_local(),
            Some(false)
        );
        assert!(split_url("redis://:pw123@h?waitaof=2").is_err());
        let pair = |l, r| Value::Array(vec![Value::Int(l), Value::Int(r)]);
        assert!(counted(a, &pair(1, 1), 40, None).is_ok());
        let short = counted(a, &pair(0, 1), 40, None).unwrap_err();
        assert!(matches!(
            short,
            NodeError::ReplicaAcks {
                local_aof: Some(false),
                ..
            }
        ));
        assert!(short.to_string().contains("own AOF: no"), "{short}");
        assert!(counted(a, &pair(1, 0), 40, None).is_err());
        assert!(counted(a, &Value::Int(1), 40, None).is_err());
        let unknown = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR",
            "unknown command 'WAITAOF', with args beginning with: ".to_owned(),
        ));
        assert!(matches!(wait_failed(&unknown), NodeError::NoWaitAof(_)));
    }

    #[test]
    fn only_a_write_that_wrote_nothing_skips_the_wait() {
        let key: std::sync::Arc<str> = "k".into();
        let batch = Call::keys(&crate::node::BATCH, &[b"a", b"b"], &[b"t", b"1"]);
        let zero = Value::Int(0);
        assert!(!wrote_nothing(
            &batch,
            &Value::Array(vec![zero.clone(), Value::Int(1)])
        ));
        assert!(wrote_nothing(
            &batch,
            &Value::Array(vec![zero.clone(), zero.clone()])
        ));
        let set = Call::acquire(&key, "t", 100);
        assert!(wrote_nothing(&set, &Value::Array(vec![Value::Nil])));
        assert!(!wrote_nothing(&set, &Value::Okay));
        let extend = Call::script(&crate::node::EXTEND, key.clone(), vec!["t".into()]);
        assert!(wrote_nothing(&extend, &zero));
        assert!(!wrote_nothing(&extend, &Value::Int(1)));
        assert!(waits(&set) && waits(&extend) && waits(&batch));
        assert!(!waits(&Call::release(key, "t".into())));
    }

    #[test]
    fn acks_no_node_timeout_can_serve_are_refused_and_say_what_to_set() {
        let ms = Duration::from_millis;
        let refused = |acks: ReplicaAcks, node_timeout| match acks.check("n1", node_timeout) {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("{acks:?} with {node_timeout:?}: {other:?}"),
        };
        let m = refused(ReplicaAcks::new(0, ms(10)), ms(50));
        assert!(m.contains("n1") && m.contains("at least 1"), "{m}");
        // The README's old cluster example: 50 ms acks, 50 ms node timeout.
        let m = refused(ReplicaAcks::new(1, ms(50)), ms(50));
        assert!(m.contains("37.5ms") && m.contains("66.666"), "{m}");
        assert!(ReplicaAcks::new(1, ms(37)).check("n1", ms(50)).is_ok());
        assert!(
            ReplicaAcks::new(1, Duration::MAX)
                .check("n1", ms(50))
                .is_ok()
        );
        // WAITAOF for this master's own AOF waits for no replica: fine.
        assert!(
            ReplicaAcks::aof(true, 0, ms(10))
                .check("n1", ms(50))
                .is_ok()
        );
        assert!(ReplicaAcks::new(1, ms(3000)).check("n1", ms(5000)).is_ok());
    }

    #[test]
    fn the_wait_stays_within_the_node_timeout_and_never_waits_for_ever() {
        let acks = ReplicaAcks::new(1, Duration::MAX);
        assert_eq!(acks.wait_ms(Duration::from_millis(100)), 75);
        assert_eq!(acks.wait_ms(Duration::ZERO), 1);
        assert_eq!(acks.wait_ms(Duration::MAX), u64::from(u32::MAX));
        let acks = ReplicaAcks::new(1, Duration::from_millis(10));
        assert_eq!(acks.wait_ms(Duration::from_secs(1)), 10);
    }
}
