//! A node's coalescer (issue 50, node layer): the plain acquires, releases
//! and extends that many tasks send to one single-server node while its
//! connection is busy go out together, as one pipeline in one write, which
//! answers each operation with exactly the reply its own call would have
//! had, so that the protocol's parsers and reports do not change.
//!
//! `coalesce/` decides what goes alone and what is batched; this is the
//! call on the connection. Which calls take part ([`Node::coalesces`]):
//!
//! - the mutex's acquire, `SET key token NX PX ttl` ([`Call::Set`]): sent
//!   as itself, in the batch's pipeline (a `SET` run by a script costs the
//!   node about twice a `SET` sent alone: measured on Redis 7.0, 100 per
//!   script against 100 pipelined). A refused one gets the holder's `PTTL`
//!   and `TYPE` in a second round trip, as when alone;
//! - the release ([`Call::Release`], database 0) and the extend
//!   ([`EXTEND`]): all of them in the batch are one [`BATCH`] script call,
//!   ahead of the `SET`s (unless a `SET` of a key comes before a release or
//!   extend of it in the batch: then one call per run of them, in order),
//!   which runs per key the steps of the release script ([`RELEASE_LUA`]:
//!   the same waiters flag, readers index, `PUBLISH` and reply, with one
//!   read less) or of [`EXTEND_LUA`]. A script call's own cost (about two
//!   thirds of a lone release's, at 9debf85's counts) is paid once per
//!   batch instead of once per operation.
//!
//! Two operations on one key run on the node in the order they came:
//! operations on different keys commute, and the releases and extends move
//! ahead of the `SET`s only when no `SET` of theirs was before them. (After a `NOSCRIPT`, a rare
//! restarted or flushed node, a run of scripts goes again by `EVAL` after
//! the rest of its pipeline: a `SET` behind it in the same batch may then
//! run before it, and is refused where the release would have let it in.)
//!
//! On a node with replica acks, a batch whose acquires or extends wrote
//! waits for the replicas once, by one `WAIT` (or `WAITAOF`) after its
//! pipeline, which counts for every write in it ([`wait_for_acks`]): where
//! each write sent alone blocks the connection for its own `WAIT`.
//!
//! Everything else keeps today's path: cluster nodes (one call per slot),
//! native commands, fenced and waiting
//! acquires (pipelines), other databases, scripts over several keys. On a
//! node with a coalescer, such a call goes at once when everything before
//! it is written, and otherwise waits for the turn behind what is queued
//! ([`Entered::AfterQueue`]), so that it never overtakes a queued operation:
//! a holder's release, queued behind a busy connection, reaches the node
//! before the next holder's fenced or waiting acquire of its key.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use redis::{Cmd, Value};
use tokio::sync::oneshot;

use super::cluster::Conn;
use super::lua::LuaScript;
use super::release_scripts::RELEASE_LUA;
use super::replicas::{ReplicaAcks, Waits, counted, wait_failed};
use super::scripts::{EXTEND, EXTEND_LUA};
use super::{Call, Node};
use crate::coalesce::{Coalescer, Limits, Pending, Turn};
use crate::error::NodeError;

/// At most this many operations per batch: a node runs a script alone, so
/// a batch is kept short enough not to hold up other clients' calls (the
/// batched renewal's bound too, and Redisson's).
pub(crate) const BATCH_OPS: usize = 100;

/// At most this many bytes of keys and arguments per batch.
pub(crate) const BATCH_BYTES: usize = 64 * 1024;

/// The batch script: for each `i`, operation `i` on `KEYS[i]`, with its
/// token `ARGV[2i-1]` and its code `ARGV[2i]`: `r` a release, `e<ms>` an
/// extend to `<ms>`. Its reply is an array of each operation's reply, as
/// its own call answers:
///
/// - release: what [`RELEASE_LUA`] returns, by the same steps on the node
///   (the readers index, the compare, the delete of the key and its waiters
///   flag, the announcement of the flag's name), with the key and its flag
///   read by one `MGET` instead of two `GET`s: each `redis.call` costs
///   Redis 7.0 some 4,000 instructions, and the two reads and the Lua
///   function call per key made a batched release cost the node more than
///   the raw loop's lone compare-and-delete (callgrind of redis-server,
///   batches of 35 SETs and 35 releases: 36.7k instructions per pair
///   before, 33.9k after, the raw loop's 33.5k).
///   `MGET` reads a key of another type as nil: a key it finds missing is
///   read again by `GET`, which answers such a key with the `WRONGTYPE` its
///   release alone gets. A refused `MGET` (an ACL that refuses the flag's
///   key) reads the two as the release alone does;
/// - extend (`e`): what [`EXTEND_LUA`] returns;
/// - renewal (`k`, the batched renewal's code, `protocol/extend_batch.rs`):
///   what `EXTEND_READER_LUA` returns (the extend, and a read share's or a
///   permit's key also keeps its index or count alive), except that a key
///   holding a value of another type answers `0`, "not held", where that
///   script fails: a flag per key, so that one foreign key fails only its
///   own lock (an error item would fail the node's whole reply,
///   `Value::extract_error`).
///
/// Each command is a `redis.pcall`: one that fails (a key of another type,
/// an ACL) answers its operation with its error, as that operation's own
/// call would have, and the others go on.
const BATCH_LUA: &str = concat!(
    reader_index_lua!(),
    r#"
local out = {}
for i = 1, #KEYS do
  local key, tok, code = KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]
  if code == 'r' then
    local t, f
    if string.byte(key) ~= 123 then
      f = '{' .. key .. '}"#,
    waiters_suffix!(),
    r#"'
    else
      t = string.match(key, '^{[^}]*}') or key
      f = t .. '"#,
    waiters_suffix!(),
    r#"'
    end
    local r
    if t and string.find(key, '"#,
    reader_infix!(),
    r#"', #t + 1, true) == #t + 1 then
      r = redis.pcall('SREM', t .. '"#,
    readers_suffix!(),
    r#"', key)
    end
    if type(r) == 'table' then
      out[i] = r
    else
      local v, w
      local m = redis.pcall('MGET', key, f)
      if m.err then
        v = redis.pcall('GET', key)
        if v == tok then w = redis.pcall('GET', f) end
      else
        v, w = m[1], m[2]
        if not v then v = redis.pcall('GET', key) end
      end
      if type(v) == 'table' then
        out[i] = v
      elseif v == tok then
        local d = redis.pcall('DEL', key, f)
        if type(d) == 'table' then
          out[i] = d
        elseif d > 1 then
          local n = redis.pcall('PUBLISH', 'redlock:released:0:' .. (t or ('{' .. key .. '}')),
            type(w) == 'string' and w or '1')
          if type(n) == 'number' then out[i] = 1 + n else out[i] = 1 end
        else
          out[i] = 1
        end
      else
        out[i] = 0
      end
    end
  elseif string.byte(code) == 107 then
    if redis.pcall('GET', key) == tok then
      local ms = string.sub(code, 2)
      out[i] = redis.call('PEXPIRE', key, ms)
      keep_companion(key, ms)
    else
      out[i] = 0
    end
  elseif string.byte(code) == 101 then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' then
      out[i] = v
    elseif v == tok then
      out[i] = redis.pcall('PEXPIRE', key, string.sub(code, 2))
    else
      out[i] = 0
    end
  else
    out[i] = redis.error_reply('unknown operation ' .. code)
  end
end
return out
"#
);

pub(crate) static BATCH: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(BATCH_LUA));

/// The scripts a batch's `SCRIPT LOAD` prefix loads besides its own: those
/// of the release and the extend sent alone.
const LOADED_WITH_BATCH: [&str; 2] = [RELEASE_LUA, EXTEND_LUA];

/// What an operation asks of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpCode {
    /// `SET key token NX PX ms`.
    Acquire(u64),
    /// The release script.
    Release,
    /// The extend script, to `ms` (as the call's argument gave it).
    Extend(Arc<str>),
    /// The batched renewal's extend to `ms` ([`renewal_code`]), which also
    /// keeps a read share's or a permit's companion alive. Not queued: the
    /// renewal forms its batch up front and sends it as one [`BATCH`] call.
    Renew(u128),
}

/// The batch script's code for the batched renewal's extend of a key to
/// `ms` ([`OpCode::Renew`]): `protocol/extend_batch.rs` sends its locks in
/// [`BATCH`] calls, each lock's key with its token and this code.
pub(crate) fn renewal_code(ms: u128) -> String {
    OpCode::Renew(ms).code().into_owned()
}

impl OpCode {
    /// Its code in the batch script's `ARGV` (an acquire's is never sent:
    /// its `SET` goes as itself, and the script refuses the code). A
    /// release's is a static `r`: no allocation per operation.
    fn code(&self) -> Cow<'static, str> {
        match self {
            OpCode::Acquire(ms) => Cow::Owned(format!("s{ms}")),
            OpCode::Release => Cow::Borrowed("r"),
            OpCode::Extend(ms) => Cow::Owned(format!("e{ms}")),
            OpCode::Renew(ms) => Cow::Owned(format!("k{ms}")),
        }
    }

    /// Adds its [`code`](Self::code) to `cmd`.
    fn write_arg(&self, cmd: &mut Cmd) {
        cmd.arg(&*self.code());
    }
}

/// One operation of a batch: what it asks, and where its answer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Op {
    pub(crate) key: Arc<str>,
    pub(crate) token: Arc<str>,
    pub(crate) code: OpCode,
}

/// The answer to a queued operation: its reply (error replies made errors,
/// as `Node::send` makes them), and the connection its batch went out on
/// (the batch noted whether the node answered on it).
pub(super) struct Answer {
    pub(super) result: Result<Value, NodeError>,
    pub(super) generation: u64,
}

/// What waits in a node's queue: an operation, or a call that is not
/// batched waiting for the turn (see `coalesce/`).
pub(super) enum Queued {
    /// An operation of the next batch.
    Op(QueuedOp),
    /// A caller waiting for the turn, to send its own call.
    Turn(oneshot::Sender<Turn<Queued>>),
}

/// An operation in the queue.
pub(super) struct QueuedOp {
    op: Op,
    tx: oneshot::Sender<Answer>,
    /// The connection its caller found (a batch goes on the newest of its
    /// operations'), and how long its caller waits.
    generation: u64,
    conn: Conn,
    timeout: Duration,
    /// When its caller stops waiting, at the latest.
    until: Option<Instant>,
    /// The node's replica acks, if it has them, and its `WAIT`s in flight:
    /// a batch that wrote waits for the replicas once, after all its writes
    /// (see [`wait_for_acks`]), counted there.
    acks: Option<(ReplicaAcks, Arc<Waits>)>,
}

impl Pending for Queued {
    fn bytes(&self) -> usize {
        match self {
            // The key, the token, the code, and RESP's framing of each.
            Queued::Op(q) => {
                q.op.key
                    .len()
                    .saturating_add(q.op.token.len())
                    .saturating_add(48)
            }
            Queued::Turn(_) => 0,
        }
    }

    fn abandoned(&self) -> bool {
        match self {
            Queued::Op(q) => q.tx.is_closed(),
            Queued::Turn(tx) => tx.is_closed(),
        }
    }

    fn waits_for_turn(&self) -> bool {
        matches!(self, Queued::Turn(_))
    }

    fn take_turn(self, turn: Turn<Self>) {
        if let Queued::Turn(tx) = self {
            // Its caller gone: the turn comes back and is dropped, which
            // passes the queue on.
            drop(tx.send(turn));
        }
    }
}

/// The batches sent and the operations they carried, since the process
/// started, across every node (for the bench: [`stats`]).
static BATCHES: AtomicU64 = AtomicU64::new(0);
static BATCHED: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicU64 = AtomicU64::new(0);

/// The coalesced calls of this process so far, across every node and
/// handle: for the bench (`bench coalesced`), not part of the API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalesceStats {
    /// Batch calls sent (an operation that went alone is not one).
    pub batches: u64,
    /// The operations they carried, in all.
    pub operations: u64,
    /// The most operations one of them carried.
    pub largest: u64,
}

/// The coalesced calls of this process so far (see [`CoalesceStats`]).
#[doc(hidden)]
pub fn coalesce_stats() -> CoalesceStats {
    CoalesceStats {
        batches: BATCHES.load(Ordering::Relaxed),
        operations: BATCHED.load(Ordering::Relaxed),
        largest: LARGEST.load(Ordering::Relaxed),
    }
}

/// A node's coalescer on one runtime.
pub(super) type NodeCoalescer = Coalescer<Queued>;

/// Where a node's coalescer lives: its connection state on one runtime
/// (`connection.rs`), which keeps it (one lookup of the runtime finds both)
/// and where a batch notes the node's answer once for all its operations.
/// A trait, so that this module does not name the connection state that
/// names it.
pub(super) trait Home: Send + Sync {
    /// The node's coalescer on this runtime, made at its first use.
    fn coalescer(&self) -> &Arc<NodeCoalescer>;
    /// The node answered on connection `generation`.
    fn answered_on(&self, generation: u64);
}

/// A new node coalescer, whose batches each go out from a task of their
/// own on the runtime of the call that ended before them. `shared`: its
/// node's connection state on that runtime, where a batch notes the node's
/// answer once for all its operations.
pub(super) fn new_coalescer(shared: Weak<dyn Home>) -> Arc<NodeCoalescer> {
    // The connection generation the batch script was last loaded on.
    let loaded = Arc::new(AtomicU64::new(0));
    Arc::new(Coalescer::new(
        Limits {
            ops: BATCH_OPS,
            bytes: BATCH_BYTES,
        },
        Box::new(move |turn: Turn<Queued>, batch: Vec<Queued>| {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(drive(
                        turn,
                        batch,
                        Arc::clone(&loaded),
                        Weak::clone(&shared),
                    ));
                }
                // Nothing can send: every queued caller is told so.
                Err(_) => {
                    drop(batch);
                    turn.give_up();
                }
            }
        }),
    ))
}

/// A batch's driver: sends it, answers each operation, and goes on with
/// the next batch until nothing is queued.
/// `loaded`: the connection generation the batch script was last loaded on.
async fn drive(
    mut turn: Turn<Queued>,
    mut batch: Vec<Queued>,
    loaded: Arc<AtomicU64>,
    shared: Weak<dyn Home>,
) {
    loop {
        send_batch(batch, &loaded, &shared, &mut turn).await;
        match turn.next() {
            Some(next) => batch = next,
            None => return,
        }
    }
}

/// The batch script's call for `ops` (releases and extends): `EVALSHA`,
/// or with `eval` the `EVAL` fallback (built only after a `NOSCRIPT`).
fn script_cmd(ops: &[(usize, &Op)], eval: bool) -> Cmd {
    // Sized up front: grown an argument at a time, its buffers were
    // reallocated a dozen times a batch.
    let bytes = ops.iter().fold(64usize, |n, (_, o)| {
        n.saturating_add(o.key.len())
            .saturating_add(o.token.len())
            .saturating_add(24)
    });
    let args = ops.len().saturating_mul(3).saturating_add(3);
    let mut cmd = if eval {
        let mut cmd = Cmd::with_capacity(args, bytes.saturating_add(BATCH.body.len()));
        cmd.arg("EVAL").arg(BATCH.body);
        cmd
    } else {
        let mut cmd = Cmd::with_capacity(args, bytes);
        cmd.arg("EVALSHA").arg(&BATCH.sha);
        cmd
    };
    cmd.arg(ops.len());
    for (_, o) in ops {
        cmd.arg(&*o.key);
    }
    for (_, o) in ops {
        cmd.arg(&*o.token);
        o.code.write_arg(&mut cmd);
    }
    cmd
}

/// One command of a batch's pipeline: an acquire's `SET`, or one script
/// call for releases and extends; each with its operations' places in the
/// batch.
enum Part<'a> {
    Set(usize, &'a Op),
    Script(Vec<(usize, &'a Op)>),
}

/// `ops` as the commands of one pipeline. Operations on different keys
/// commute on the node, and only an acquire's `SET` followed later in the
/// batch by a release or extend of its key must stay before it; so, unless
/// some key has that, every release and extend goes in **one** script call,
/// first, and the `SET`s after it, in their order (a batch of interleaved
/// locks and unlocks would otherwise be a script call per run of one or two
/// releases, each paying a script call's cost on the node). Otherwise, in
/// their order: one script call per run.
fn parts<'a>(ops: &[&'a Op]) -> Vec<Part<'a>> {
    let mut parts: Vec<Part<'a>> = Vec::with_capacity(ops.len());
    if may_reorder(ops) {
        let scripts: Vec<(usize, &Op)> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| !matches!(op.code, OpCode::Acquire(_)))
            .map(|(i, op)| (i, *op))
            .collect();
        if !scripts.is_empty() {
            parts.push(Part::Script(scripts));
        }
        for (i, op) in ops.iter().enumerate() {
            if matches!(op.code, OpCode::Acquire(_)) {
                parts.push(Part::Set(i, op));
            }
        }
        return parts;
    }
    for (i, op) in ops.iter().enumerate() {
        match (&op.code, parts.last_mut()) {
            (OpCode::Acquire(_), _) => parts.push(Part::Set(i, op)),
            (_, Some(Part::Script(run))) => run.push((i, op)),
            _ => parts.push(Part::Script(vec![(i, op)])),
        }
    }
    parts
}

/// Whether no release or extend in `ops` comes after an acquire of its key
/// (see [`parts`]). The acquires' keys are sorted with their places, and
/// each release or extend looks up the first acquire of its key: no hash
/// of every key (a `HashSet`'s SipHash and its growth were a tenth of a
/// batch's client work, callgrind at 36 operations a batch).
fn may_reorder(ops: &[&Op]) -> bool {
    let Some(first_set) = ops
        .iter()
        .position(|op| matches!(op.code, OpCode::Acquire(_)))
    else {
        return true;
    };
    if !ops
        .iter()
        .skip(first_set)
        .any(|op| !matches!(op.code, OpCode::Acquire(_)))
    {
        return true;
    }
    let mut sets: Vec<(&str, usize)> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(op.code, OpCode::Acquire(_)))
        .map(|(i, op)| (&*op.key, i))
        .collect();
    sets.sort_unstable();
    ops.iter().enumerate().skip(first_set).all(|(i, op)| {
        if matches!(op.code, OpCode::Acquire(_)) {
            return true;
        }
        // The first entry of the key, if any, is its earliest acquire.
        let at = sets.partition_point(|(k, _)| *k < &*op.key);
        !matches!(sets.get(at), Some((k, first)) if *k == &*op.key && *first < i)
    })
}

/// An error reply in a pipeline, made an error.
fn reply(v: Value) -> Result<Value, NodeError> {
    match v {
        Value::ServerError(e) => Err(NodeError::from_redis(&e.into())),
        v => Ok(v),
    }
}

/// Sends the batch of `ops` as one pipeline (see the module docs) and
/// splits its replies into one result per operation, in order. With
/// `load` (the script was not loaded on this connection yet), a pipeline
/// with script calls starts with `SCRIPT LOAD`, so that none of them is
/// refused for `NOSCRIPT` and sent again after what followed it. Also says
/// whether the script is known to be loaded now. `Err`: the whole call
/// failed, with whether the node answered.
pub(crate) async fn run_batch<'a>(
    conn: &mut Conn,
    ops: impl Iterator<Item = &'a Op>,
    load: bool,
) -> Result<(Vec<Result<Value, NodeError>>, bool), (NodeError, bool)> {
    let ops: Vec<&Op> = ops.collect();
    let parts = parts(&ops);
    let prefix = load && parts.iter().any(|p| matches!(p, Part::Script(_)));
    let mut pipe = redis::Pipeline::with_capacity(parts.len().saturating_add(4));
    if prefix {
        // With the scripts a release or an extend sent alone runs: the
        // batch script only wraps their text, and a lone call after the
        // first batch would otherwise find them missing (`NOSCRIPT`, and
        // its `EVAL` a second round trip: seen as a fencing test's release
        // sent as EVALSHA then EVAL, with the coalescer on).
        pipe.cmd("SCRIPT").arg("LOAD").arg(BATCH.body);
        for body in LOADED_WITH_BATCH {
            pipe.cmd("SCRIPT").arg("LOAD").arg(body);
        }
    }
    for part in &parts {
        match part {
            Part::Set(_, op) => {
                let ms = match op.code {
                    OpCode::Acquire(ms) => ms,
                    _ => 0,
                };
                // Sized up front (see `script_cmd`).
                let mut set = Cmd::with_capacity(
                    6,
                    op.key
                        .len()
                        .saturating_add(op.token.len())
                        .saturating_add(32),
                );
                set.arg("SET")
                    .arg(&*op.key)
                    .arg(&*op.token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ms);
                pipe.add_command(set);
            }
            Part::Script(run) => {
                pipe.add_command(script_cmd(run, false));
            }
        }
    }
    let skip = if prefix {
        1 + LOADED_WITH_BATCH.len()
    } else {
        0
    };
    let replies = match conn.send_packed_commands(&pipe, skip, parts.len()).await {
        Ok(replies) if replies.len() == parts.len() => replies,
        Ok(replies) => {
            return Err((
                NodeError::Protocol(format!(
                    "{} replies to a pipeline of {}",
                    replies.len(),
                    parts.len()
                )),
                true,
            ));
        }
        Err(e) => {
            let answered = e.code().is_some();
            return Err((NodeError::from_redis(&e), answered));
        }
    };
    // Loaded (before, or now) unless a script call says otherwise.
    let mut is_loaded = !load || prefix;
    let mut out: Vec<Option<Result<Value, NodeError>>> = (0..ops.len()).map(|_| None).collect();
    let mut put = |at: usize, result| {
        if let Some(slot) = out.get_mut(at) {
            *slot = Some(result);
        }
    };
    // The refused `SET`s, by their place in the batch, for the holder's probe.
    let mut refused = Vec::new();
    for (part, v) in parts.iter().zip(replies) {
        match part {
            Part::Set(at, op) => {
                if v == Value::Nil {
                    refused.push((*at, Arc::clone(&op.key)));
                }
                put(*at, reply(v));
            }
            Part::Script(run) => {
                let v = match v {
                    Value::ServerError(e) if e.code() == "NOSCRIPT" => {
                        // Rare: a flushed script cache, or a `SCRIPT LOAD`
                        // refused. The `EVAL` loads the script.
                        is_loaded = false;
                        match conn.send_packed_command(&script_cmd(run, true)).await {
                            Ok(Value::ServerError(e)) => Err(NodeError::from_redis(&e.into())),
                            Ok(v) => Ok(v),
                            Err(e) => Err(NodeError::from_redis(&e)),
                        }
                        .map_err(|e| {
                            NodeError::NoScript(format!(
                                "EVALSHA said NOSCRIPT and the EVAL fallback failed: {e}"
                            ))
                        })
                    }
                    v => reply(v),
                };
                match v {
                    Ok(Value::Array(items)) if items.len() == run.len() => {
                        for ((at, _), item) in run.iter().zip(items) {
                            put(*at, reply(item));
                        }
                    }
                    Ok(other) => {
                        let e = NodeError::Protocol(format!(
                            "batch script reply for {} operations: {other:?}",
                            run.len()
                        ));
                        for (at, _) in run {
                            put(*at, Err(e.clone()));
                        }
                    }
                    Err(e) => {
                        for (at, _) in run {
                            put(*at, Err(e.clone()));
                        }
                    }
                }
            }
        }
    }
    let mut out: Vec<Result<Value, NodeError>> = out
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(NodeError::Protocol("no reply in its batch".to_owned()))))
        .collect();
    if !refused.is_empty() {
        probe_holders(conn, &refused, &mut out).await;
    }
    Ok((out, is_loaded))
}

/// After refused `SET`s: each holder's `PTTL` and `TYPE`, in the
/// `[SET, PTTL, TYPE]` shape `parse_acquire` reads, as `Node::probe_holder`
/// gives them to a `SET` sent alone. A probe that fails leaves the holder
/// unknown (`[nil]`): the `SET` was refused all the same.
async fn probe_holders(
    conn: &mut Conn,
    refused: &[(usize, Arc<str>)],
    out: &mut [Result<Value, NodeError>],
) {
    let mut probe = redis::pipe();
    for (_, key) in refused {
        probe.cmd("PTTL").arg(&**key).cmd("TYPE").arg(&**key);
    }
    let count = refused.len().saturating_mul(2);
    let replies = conn.send_packed_commands(&probe, 0, count).await.ok();
    let mut replies = replies.filter(|r| r.len() == count).map(Vec::into_iter);
    for (at, _) in refused {
        let mut items = vec![Value::Nil];
        if let Some(r) = replies.as_mut() {
            items.extend(r.next());
            items.extend(r.next());
        }
        if let Some(slot) = out.get_mut(*at) {
            *slot = Ok(Value::Array(items));
        }
    }
}

/// Whether operation `op`, answered `result`, wrote on the node: an
/// acquire that took its key (a refused one's answer is the holder's
/// `[nil, PTTL, TYPE]`), an extend that found its key held (not `0`). A
/// release never waits for replicas, as alone (`replicas::waits`).
fn wrote(op: &Op, result: &Result<Value, NodeError>) -> bool {
    match (&op.code, result) {
        (OpCode::Acquire(_), Ok(v)) => !matches!(v, Value::Array(_) | Value::Nil),
        (OpCode::Extend(_) | OpCode::Renew(_), Ok(v)) => *v != Value::Int(0),
        _ => false,
    }
}

/// Replica acks for a batch (issue 50): one `WAIT` (or `WAITAOF`) on the
/// batch's connection after its pipeline, when some acquire or extend in it
/// wrote. `WAIT` counts the replicas that acknowledged the client's last
/// write on the connection, which is after every write of the batch, so its
/// count holds for each of them: a write whose operation alone would have
/// waited gets [`NodeError::ReplicaAcks`] (or the `WAIT`'s own error) in
/// place of its reply when the count falls short, as its own call does
/// (`replicas.rs`). The wait is cut to three quarters of what is left until
/// `deadline` (the batch's latest caller deadline). `waits` counts it in
/// flight, so that a call given up meanwhile says why
/// (`Node::queued_until`, `replicas.rs`).
///
/// `tests/models/tests/model_batch_acks.rs` checks that a counted `WAIT`
/// keeps every write of its batch across a failover, with a `WAIT` on
/// another connection and one between the writes as negative controls.
async fn wait_for_acks(
    conn: &mut Conn,
    (acks, waits): (ReplicaAcks, &Waits),
    ops: &[&Op],
    results: &mut [Result<Value, NodeError>],
    deadline: Option<Instant>,
) {
    let writes: Vec<usize> = ops
        .iter()
        .zip(results.iter())
        .enumerate()
        .filter(|(_, (op, r))| wrote(op, r))
        .map(|(i, _)| i)
        .collect();
    if writes.is_empty() {
        return;
    }
    let left = deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    });
    let wait_ms = acks.wait_ms(left);
    let _counted = waits.start();
    let verdict = match conn.send_packed_command(&acks.command(wait_ms)).await {
        Ok(Value::ServerError(e)) => Err(wait_failed(&e.into())),
        Ok(answer) => counted(acks, &answer, wait_ms, None),
        Err(e) => Err(wait_failed(&e)),
    };
    if let Err(e) = verdict {
        for i in writes {
            if let Some(r) = results.get_mut(i) {
                *r = Err(e.clone());
            }
        }
    }
}

/// Sends one batch on the newest connection its callers found, bounded by
/// the latest of their deadlines (after it, nobody waits for it), and
/// answers each operation.
async fn send_batch(
    batch: Vec<Queued>,
    loaded: &AtomicU64,
    shared: &Weak<dyn Home>,
    turn: &mut Turn<Queued>,
) {
    // A batch ends before a caller waiting for the turn (`coalesce/`): it
    // holds operations only.
    let batch: Vec<QueuedOp> = batch
        .into_iter()
        .filter_map(|q| match q {
            Queued::Op(q) => Some(q),
            Queued::Turn(_) => None,
        })
        .collect();
    let Some(newest) = batch.iter().max_by_key(|q| q.generation) else {
        return;
    };
    let (generation, mut conn) = (newest.generation, newest.conn.clone());
    let until = batch.iter().map(|q| q.until).max().flatten();
    let acks = batch.iter().find_map(|q| q.acks.clone());
    // Without a caller's deadline, the longest node timeout from now: what
    // a `WAIT` may take of it (`ReplicaAcks::wait_ms`).
    let ack_deadline = until.or_else(|| {
        batch
            .iter()
            .map(|q| q.timeout)
            .max()
            .and_then(|t| Instant::now().checked_add(t))
    });
    let n = batch.len();
    let size = u64::try_from(n).unwrap_or(u64::MAX);
    BATCHES.fetch_add(1, Ordering::Relaxed);
    BATCHED.fetch_add(size, Ordering::Relaxed);
    LARGEST.fetch_max(size, Ordering::Relaxed);
    let load = loaded.load(Ordering::Relaxed) != generation;
    let call = async {
        let (mut results, is_loaded) =
            run_batch(&mut conn, batch.iter().map(|q| &q.op), load).await?;
        if is_loaded {
            loaded.store(generation, Ordering::Relaxed);
        }
        if let Some((acks, waits)) = &acks {
            let ops: Vec<&Op> = batch.iter().map(|q| &q.op).collect();
            let acks = (*acks, &**waits);
            wait_for_acks(&mut conn, acks, &ops, &mut results, ack_deadline).await;
        }
        Ok(results)
    };
    let outcome = {
        // Polled once, the pipeline is on the connection (`Turn::written`).
        let mut call = std::pin::pin!(call);
        let mut first = true;
        let call = std::future::poll_fn(|cx| {
            let polled = call.as_mut().poll(cx);
            if std::mem::replace(&mut first, false) {
                turn.written();
            }
            polled
        });
        match until {
            Some(until) => tokio::time::timeout_at(until.into(), call).await.ok(),
            None => Some(call.await),
        }
    };
    // The node's answer, noted once for the batch before any caller
    // hears its own (a caller whose call failed then judges the connection
    // by it, as after a call of its own).
    let answered = matches!(outcome, Some(Ok(_)) | Some(Err((_, true))));
    if answered && let Some(shared) = shared.upgrade() {
        shared.answered_on(generation);
    }
    match outcome {
        Some(Ok(results)) => {
            for (q, result) in batch.into_iter().zip(results) {
                let _ = q.tx.send(Answer { result, generation });
            }
        }
        Some(Err((e, _))) => {
            for q in batch {
                let _ = q.tx.send(Answer {
                    result: Err(e.clone()),
                    generation,
                });
            }
        }
        None => {
            for q in batch {
                let _ = q.tx.send(Answer {
                    result: Err(NodeError::Timeout(q.timeout)),
                    generation,
                });
            }
        }
    }
}

/// What becomes of a call on a node with a coalescer; each with the
/// connection the call found, given back.
pub(super) enum Entered {
    /// It does not take part: today's path.
    No(Conn),
    /// It goes alone, now, holding the turn until its command answers.
    Alone(Turn<Queued>, Conn),
    /// It waits in the queue.
    Wait(Wait),
}

/// A call that waits in a node's queue.
pub(super) enum Wait {
    /// It was queued: its answer comes here.
    Queued(oneshot::Receiver<Answer>, Conn),
    /// It does not take part, but the node's queue is not empty: it goes
    /// once it has the turn, which comes here (or, the coalescer gone, an
    /// error: then at once).
    AfterQueue(oneshot::Receiver<Turn<Queued>>, Conn),
}

impl Node {
    /// The operation `call` is in a batch, if it may be coalesced on this
    /// node (see the module docs).
    pub(super) fn coalesces(&self, call: &Call) -> Option<Op> {
        if !self.coalesce || self.pool.is_cluster() || self.native_may_run(call) {
            return None;
        }
        match call {
            Call::Set {
                key, token, ttl_ms, ..
            } => Some(Op {
                key: Arc::clone(key),
                token: Arc::clone(token),
                code: OpCode::Acquire(*ttl_ms),
            }),
            Call::Release { key, token, .. } if self.db == 0 => Some(Op {
                key: Arc::clone(key),
                token: Arc::clone(token),
                code: OpCode::Release,
            }),
            Call::Script {
                script, key, args, ..
            } if std::ptr::eq(*script, &*EXTEND) => match args.as_slice() {
                [token, ms] => Some(Op {
                    key: Arc::clone(key),
                    token: token.as_str().into(),
                    code: OpCode::Extend(ms.as_str().into()),
                }),
                _ => None,
            },
            _ => None,
        }
    }

    /// `call` arrives at this node's coalescer on connection `generation`:
    /// it goes alone, is queued, or does not take part. `deadline`: when
    /// its caller gives up, if it set one.
    /// `shared`: this runtime's connection state, when the caller has it.
    pub(super) fn enter(
        &self,
        call: &Call,
        shared: Option<Arc<dyn Home>>,
        generation: u64,
        conn: Conn,
        timeout: Duration,
        deadline: Option<Instant>,
    ) -> Entered {
        if !self.coalesce || self.pool.is_cluster() {
            return Entered::No(conn);
        }
        let here = || self.shared_here().map(|s| -> Arc<dyn Home> { s });
        let Some(shared) = shared.or_else(here) else {
            return Entered::No(conn);
        };
        let coalescer = shared.coalescer();
        let Some(op) = self.coalesces(call) else {
            // Not batched: it must not overtake what is queued.
            let mut rx = None;
            let now = coalescer.after_queue(|| {
                let (tx, r) = oneshot::channel();
                rx = Some(r);
                Queued::Turn(tx)
            });
            return match (now, rx) {
                (false, Some(rx)) => Entered::Wait(Wait::AfterQueue(rx, conn)),
                _ => Entered::No(conn),
            };
        };
        let mut rx = None;
        let turn = coalescer.enter(|| {
            let (tx, r) = oneshot::channel();
            rx = Some(r);
            Queued::Op(QueuedOp {
                op,
                tx,
                generation,
                conn: conn.clone(),
                timeout,
                // The caller's deadline when it has one (a fan-out's
                // call): no clock read per queued operation.
                until: deadline.or_else(|| Instant::now().checked_add(timeout)),
                acks: self.replica_acks.map(|a| (a, Arc::clone(&self.waits))),
            })
        });
        match (turn, rx) {
            (Some(turn), _) => Entered::Alone(turn, conn),
            (None, Some(rx)) => Entered::Wait(Wait::Queued(rx, conn)),
            (None, None) => Entered::No(conn),
        }
    }

    /// A call that waits in the queue ([`Entered::Wait`]): its answer, or,
    /// for a call that is not batched, its own call once it has the turn
    /// (or at once when the queue was dropped: no runtime to send it).
    /// Given up with [`NodeError::Timeout`] when polled at or after
    /// `deadline` (`None`: the caller bounds it).
    pub(super) async fn wait_in_queue(
        &self,
        call: &Call,
        wait: Wait,
        generation: u64,
        timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<Value, NodeError> {
        match wait {
            Wait::Queued(rx, conn) => self.queued_until(call, rx, conn, timeout, deadline).await,
            Wait::AfterQueue(rx, conn) => {
                let turn = super::ByDeadline {
                    inner: rx,
                    deadline,
                }
                .await;
                let Some(turn) = turn else {
                    return Err(NodeError::Timeout(timeout));
                };
                super::Holding {
                    inner: self.run_call(call, generation, conn, timeout),
                    turn: turn.ok(),
                    check_clock: true,
                    deadline,
                    timeout,
                }
                .await
            }
        }
    }

    /// [`Node::queued_answer`], given up with [`NodeError::Timeout`] when
    /// polled at or after `deadline` (`None`: the caller bounds it), as
    /// `Node::run_inner` gives up a call it sends itself. Boxed there: a
    /// node call's future keeps only a pointer for it.
    pub(super) async fn queued_until(
        &self,
        call: &Call,
        rx: oneshot::Receiver<Answer>,
        conn: Conn,
        timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<Value, NodeError> {
        let start = Instant::now();
        let seen = self.waits.seen();
        let answer = super::ByDeadline {
            inner: self.queued_answer(call, rx, conn),
            deadline,
        };
        answer.await.unwrap_or_else(|| match self.replica_acks {
            // Out of time while a `WAIT` was in flight on the node (a
            // batch's, or a call's of its own): the cause is the missing
            // replicas, not a slow server, as for a call sent alone
            // (`Node::run_acked`).
            Some(acks) if super::replicas::waits(call) && self.waits.since(seen) => {
                Err(NodeError::ReplicaAcks {
                    acked: 0,
                    wanted: acks.replicas(),
                    waited: start.elapsed(),
                    master: None,
                    local_aof: None,
                    queued: true,
                })
            }
            _ => Err(NodeError::Timeout(timeout)),
        })
    }

    /// A queued call's answer, as its own call would have given it.
    pub(super) async fn queued_answer(
        &self,
        call: &Call,
        rx: oneshot::Receiver<Answer>,
        conn: Conn,
    ) -> Result<Value, NodeError> {
        let Ok(answer) = rx.await else {
            return Err(NodeError::Io(
                "the batch this call was queued in ended without an answer (its task was \
                 cancelled: the runtime is shutting down)"
                    .into(),
            ));
        };
        match (answer.result, call) {
            // An ACL that refuses the waiters flag's key: as the release
            // alone does (`run_written`).
            (Err(e), Call::Release { key, token, .. }) if super::dispatch::refused_flag(&e) => {
                Box::pin(self.release_unflagged(answer.generation, conn, key, token)).await
            }
            (result, _) => result,
        }
    }
}

/// Test-only (the `test-hooks` feature): one node's operations run as
/// separate calls and as one batch, for the test that they answer alike.
/// Not part of the API.
#[cfg(feature = "test-hooks")]
pub mod check {
    use std::sync::Arc;
    use std::time::Duration;

    use redis::Value;

    use super::{Op, OpCode, run_batch};
    use crate::error::{Error, NodeError};
    use crate::node::{Call, EXTEND, EXTEND_READER, Node};

    /// One operation on one key.
    #[derive(Debug, Clone)]
    pub enum CheckOp {
        /// The mutex's acquire, `SET key token NX PX ttl_ms`.
        Acquire {
            /// The key.
            key: String,
            /// The token.
            token: String,
            /// The TTL in ms.
            ttl_ms: u64,
        },
        /// The release.
        Release {
            /// The key.
            key: String,
            /// The token.
            token: String,
        },
        /// The extend.
        Extend {
            /// The key.
            key: String,
            /// The token.
            token: String,
            /// The new TTL in ms.
            ttl_ms: u64,
        },
        /// The batched renewal's extend; alone, a read share's extend.
        Renew {
            /// The key.
            key: String,
            /// The token.
            token: String,
            /// The new TTL in ms.
            ttl_ms: u64,
        },
    }

    impl CheckOp {
        fn call(&self) -> Call {
            match self {
                CheckOp::Acquire { key, token, ttl_ms } => {
                    Call::acquire(&key.as_str().into(), token, u128::from(*ttl_ms))
                }
                CheckOp::Release { key, token } => {
                    Call::release(key.as_str().into(), token.as_str().into())
                }
                CheckOp::Extend { key, token, ttl_ms } => Call::script(
                    &EXTEND,
                    key.as_str().into(),
                    vec![token.clone(), ttl_ms.to_string()],
                ),
                CheckOp::Renew { key, token, ttl_ms } => Call::script(
                    &EXTEND_READER,
                    key.as_str().into(),
                    vec![token.clone(), ttl_ms.to_string()],
                ),
            }
        }

        fn op(&self) -> Op {
            let (key, token, code) = match self {
                CheckOp::Acquire { key, token, ttl_ms } => (key, token, OpCode::Acquire(*ttl_ms)),
                CheckOp::Release { key, token } => (key, token, OpCode::Release),
                CheckOp::Extend { key, token, ttl_ms } => {
                    (key, token, OpCode::Extend(ttl_ms.to_string().into()))
                }
                CheckOp::Renew { key, token, ttl_ms } => {
                    (key, token, OpCode::Renew(u128::from(*ttl_ms)))
                }
            };
            Op {
                key: Arc::from(key.as_str()),
                token: Arc::from(token.as_str()),
                code,
            }
        }
    }

    /// `ops` on the node at `url`, one call each, one after the other, as
    /// the library sends a call that finds the node idle.
    pub async fn alone(
        url: &str,
        ops: &[CheckOp],
        timeout: Duration,
    ) -> Result<Vec<Result<Value, NodeError>>, Error> {
        let node = Node::from_url(url)?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(node.run(&op.call(), timeout).await.0);
        }
        Ok(out)
    }

    /// `ops` on the node at `url` as one batch call, each operation's reply
    /// as it reaches its caller.
    pub async fn batched(
        url: &str,
        ops: &[CheckOp],
        timeout: Duration,
    ) -> Result<Vec<Result<Value, NodeError>>, Error> {
        let node = Node::from_url(url)?;
        let mut used = None;
        let mut conn = match node.connection(timeout, &mut used).await {
            Ok((_, conn)) => conn,
            Err(e) => return Ok(vec![Err(e); ops.len()]),
        };
        let batch: Vec<Op> = ops.iter().map(CheckOp::op).collect();
        // A new connection: the script is loaded with the first batch.
        match tokio::time::timeout(timeout, run_batch(&mut conn, batch.iter(), true)).await {
            Ok(Ok((results, _))) => Ok(results),
            Ok(Err((e, _))) => Ok(vec![Err(e); ops.len()]),
            Err(_) => Ok(vec![Err(NodeError::Timeout(timeout)); ops.len()]),
        }
    }
}
