//! One Redis master: its pool, its one cached multiplexed connection (and the
//! single reconnect shared by its callers), the acquire pipeline and the Lua
//! scripts run on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Pipeline, Value};
use tokio::sync::watch;

use crate::error::NodeError;
use crate::fencing::{FenceRead, bad_read};

/// Extend: compare-and-pexpire. Only the token's owner may push the expiry.
const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Release: compare-and-delete (spec "Releasing the lock"). Never a bare `DEL`.
pub(crate) const RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// A Lua script with its SHA1 computed once per process.
pub(crate) struct LuaScript {
    body: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(body: &'static str) -> Self {
        let sha = redis::Script::new(body).get_hash().to_owned();
        Self { body, sha }
    }
}

/// Fencing step 3: raises the key's fence counter (`KEYS[2]`) to the token
/// `ARGV[2]`, never lowers it, and only while the lock key (`KEYS[1]`) still
/// holds this attempt's token `ARGV[1]`: a fence that lands after the key
/// expired (and another holder may have read the counter) must not count.
/// Counters are decimal strings compared by length, then digits, so that the
/// whole `u64` range compares right (Lua numbers are doubles).
const FENCE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local c = redis.call('GET', KEYS[2])
if not c or #c < #ARGV[2] or (#c == #ARGV[2] and c < ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
"#;

pub(crate) static FENCE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(FENCE_LUA));
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(EXTEND_LUA));
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_LUA));

/// One call, encoded once and sent to every node.
pub(crate) enum Call {
    /// A Lua script by `EVALSHA`, with the arguments kept for the `EVAL` fallback.
    Script {
        script: &'static LuaScript,
        evalsha: Cmd,
        key: Arc<str>,
        args: Vec<String>,
    },
    /// Spec step 2, the acquire: `SET key token NX PX ttl`, pipelined with `PTTL`
    /// and `TYPE` of the key so a refusal says, in the same round trip, how long
    /// the holder has left and whether the key is a foreign non-string value.
    /// Plain commands cost the node less than a script; the answers to `PTTL` and
    /// `TYPE` only matter when `SET` refused.
    Acquire { pipeline: Pipeline },
    /// A Lua script over several keys (the fence: the lock key and its
    /// counter), both forms built up front: `EVALSHA`, and the `EVAL` fallback.
    Keys { evalsha: Cmd, eval: Cmd },
}

impl Call {
    /// `EVALSHA sha 1 key args..`, built once per operation.
    pub(crate) fn script(script: &'static LuaScript, key: Arc<str>, args: Vec<String>) -> Self {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(1).arg(&*key).arg(&args);
        Call::Script {
            script,
            evalsha,
            key,
            args,
        }
    }

    /// The acquire pipeline for `key`, `token` and `ttl_ms`.
    pub(crate) fn acquire(key: &str, token: &str, ttl_ms: u128) -> Self {
        Call::Acquire {
            pipeline: acquire_pipeline(key, token, ttl_ms),
        }
    }

    /// The acquire pipeline of a fencing lock: the same `SET`, `PTTL` and
    /// `TYPE`, then (fencing step 1) the key's fence counter and the node's
    /// `TIME`. Read after the `SET` on the same connection, so after any fence
    /// of an earlier holder whose key the `SET` found gone.
    pub(crate) fn fenced_acquire(key: &str, token: &str, ttl_ms: u128, fence_key: &[u8]) -> Self {
        let mut pipeline = acquire_pipeline(key, token, ttl_ms);
        pipeline.cmd("GET").arg(fence_key).cmd("TIME");
        Call::Acquire { pipeline }
    }

    /// `EVALSHA sha <keys> keys.. args..`, and its `EVAL` fallback.
    pub(crate) fn keys(script: &'static LuaScript, keys: &[&[u8]], args: &[&[u8]]) -> Self {
        let build = |name: &str, first: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(first).arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        Call::Keys {
            evalsha: build("EVALSHA", &script.sha),
            eval: build("EVAL", script.body),
        }
    }
}

/// Spec step 2's `SET key token NX PX ttl`, then `PTTL` and `TYPE` of the key.
fn acquire_pipeline(key: &str, token: &str, ttl_ms: u128) -> Pipeline {
    let mut pipeline = redis::pipe();
    pipeline
        .cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms.to_string())
        .cmd("PTTL")
        .arg(key)
        .cmd("TYPE")
        .arg(key);
    pipeline
}

/// `EVAL body 1 key args..`: the fallback after `NOSCRIPT` (a restarted or flushed
/// node). It also loads the script for the next `EVALSHA`.
fn eval(script: &LuaScript, key: &str, args: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.body).arg(1).arg(key).arg(args);
    cmd
}

/// The shortest and the longest a background connection attempt may take (it
/// gets ten node timeouts within these bounds): long enough for a handshake over
/// a slow link that no single call could wait for, short enough that a node
/// which accepts connections but never answers is tried again soon.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a background connection attempt started by a call with `timeout`
/// may take.
fn connect_timeout(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(10)
        .min(MAX_CONNECT_TIMEOUT.max(timeout))
        .max(MIN_CONNECT_TIMEOUT)
}

/// A connection attempt's outcome, as its waiters see it: the connection and its
/// generation, or why it could not be made. `None` while it runs.
type Attempt = Option<Result<(u64, MultiplexedConnection), NodeError>>;

/// The connection calls use.
struct Cached {
    generation: u64,
    conn: MultiplexedConnection,
    /// When the node last answered anything on this connection (the handshake
    /// counts). A call that timed out with nothing answered since it started
    /// says the connection is dead; one that timed out while answers kept
    /// arriving says only that this call was slow (waiting for the reconnect or
    /// an `EVAL` fallback used up its time), and dropping the connection then
    /// would make the next call pay the handshake again.
    answered_at: Instant,
}

/// The node's connection state, shared with the background connection attempt.
#[derive(Default)]
struct Slot {
    cached: Option<Cached>,
    /// The attempt under way, if any: its number, and where its outcome appears.
    connecting: Option<(u64, watch::Receiver<Attempt>)>,
    /// The number of the next attempt.
    next_attempt: u64,
}

struct Shared {
    slot: Mutex<Slot>,
    /// Bumped each time a new connection replaces the cached one. Two calls with
    /// the same generation went over the same socket, so the node ran them in the
    /// order they were sent.
    generation: AtomicU64,
}

impl Shared {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One independent Redis master.
pub(crate) struct Node {
    pub(crate) label: Arc<str>,
    /// The address the node was configured with (no password), when known; used
    /// to refuse the same server listed twice.
    pub(crate) address: Option<String>,
    /// redis' multiplexed connection pipelines concurrent calls over one socket, so
    /// one connection per node is the fastest path. The pool creates it (and creates
    /// it again after a failure); taking it out of the pool skips the `PING` that
    /// deadpool-redis sends to recycle a connection on every checkout.
    pool: Pool,
    /// The cached connection and the connection attempt under way. Attempts run
    /// one at a time in a task of their own, so a call that gives up does not
    /// cancel the handshake the next call needs, and concurrent calls on a cold
    /// node share one connection instead of each opening their own.
    shared: Arc<Shared>,
}

impl Node {
    pub(crate) fn new(label: Arc<str>, address: Option<String>, pool: Pool) -> Self {
        Self {
            label,
            address,
            pool,
            shared: Arc::new(Shared {
                slot: Mutex::new(Slot::default()),
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// The cached connection, else the outcome of the connection attempt under
    /// way (starting one if there is none), with its generation, which is also
    /// put in `used` so that it is known after a timeout.
    async fn connection(
        &self,
        timeout: Duration,
        used: &mut Option<u64>,
    ) -> Result<(u64, MultiplexedConnection), NodeError> {
        let mut rx = {
            let mut slot = self.shared.slot();
            if let Some(c) = &slot.cached {
                *used = Some(c.generation);
                return Ok((c.generation, c.conn.clone()));
            }
            match &slot.connecting {
                // A closed channel is an attempt whose task ended without an
                // outcome (a panic, or its runtime shut down): start another.
                Some((_, rx)) if rx.has_changed().is_ok() => rx.clone(),
                _ => self.start_connect(&mut slot, timeout)?,
            }
        };
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone(),
            Err(_) => None,
        };
        match outcome {
            Some(Ok((generation, conn))) => {
                *used = Some(generation);
                Ok((generation, conn))
            }
            Some(Err(e)) => Err(e),
            None => Err(NodeError::Connect(
                "the connection attempt ended without an outcome (its task panicked, or its \
                 Tokio runtime shut down)"
                    .into(),
            )),
        }
    }

    /// Spawns a connection attempt on the current Tokio runtime and records it in
    /// `slot`. It caches its connection when done, whether or not anyone still
    /// waits for it.
    fn start_connect(
        &self,
        slot: &mut Slot,
        timeout: Duration,
    ) -> Result<watch::Receiver<Attempt>, NodeError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            NodeError::Connect("no Tokio runtime to run the connection attempt on".into())
        })?;
        let id = slot.next_attempt;
        slot.next_attempt = slot.next_attempt.wrapping_add(1);
        let (tx, rx) = watch::channel(None);
        slot.connecting = Some((id, rx.clone()));
        let pool = self.pool.clone();
        let shared = Arc::clone(&self.shared);
        let limit = connect_timeout(timeout);
        runtime.spawn(async move {
            let result = match tokio::time::timeout(limit, connect(&pool)).await {
                Ok(r) => r,
                Err(_) => Err(NodeError::Connect(format!(
                    "no connection within {limit:?}"
                ))),
            };
            let outcome = {
                let mut slot = shared.slot();
                if slot.connecting.as_ref().is_some_and(|(i, _)| *i == id) {
                    slot.connecting = None;
                }
                result.map(|conn| {
                    let generation = shared
                        .generation
                        .fetch_add(1, Ordering::SeqCst)
                        .wrapping_add(1);
                    slot.cached = Some(Cached {
                        generation,
                        conn: conn.clone(),
                        answered_at: Instant::now(),
                    });
                    (generation, conn)
                })
            };
            // Nobody may be waiting any more; the connection is cached anyway.
            let _ = tx.send(Some(outcome));
        });
        Ok(rx)
    }

    /// The current connection generation.
    pub(crate) fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::SeqCst)
    }

    /// The node answered on connection `generation`.
    fn answered(&self, generation: u64) {
        let mut slot = self.shared.slot();
        if let Some(c) = slot.cached.as_mut()
            && c.generation == generation
        {
            c.answered_at = Instant::now();
        }
    }

    /// After a call that started at `started` failed with `error` on connection
    /// `generation`: drops that connection if the error says it is broken, and
    /// only that one, never a newer connection that replaced it meanwhile. A
    /// timeout says it is broken only if the node has answered nothing on it
    /// since the call started.
    fn forget_connection(&self, error: &NodeError, generation: Option<u64>, started: Instant) {
        let Some(generation) = generation else {
            return;
        };
        let mut slot = self.shared.slot();
        let Some(c) = &slot.cached else {
            return;
        };
        if c.generation != generation {
            return;
        }
        let broken = match error {
            NodeError::Timeout(_) => c.answered_at < started,
            other => other.breaks_connection(),
        };
        if broken {
            slot.cached = None;
        }
    }

    /// Sends one command on connection `generation`, noting any answer.
    async fn send(
        &self,
        generation: u64,
        conn: &mut MultiplexedConnection,
        cmd: &Cmd,
    ) -> redis::RedisResult<Value> {
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
        let start = Instant::now();
        let mut used = None;
        let result =
            match tokio::time::timeout(timeout, self.run_inner(call, timeout, &mut used)).await {
                Ok(r) => r,
                Err(_) => Err(NodeError::Timeout(timeout)),
            };
        if let Err(e) = &result {
            self.forget_connection(e, used, start);
        }
        (result, start.elapsed())
    }

    async fn run_inner(
        &self,
        call: &Call,
        timeout: Duration,
        used: &mut Option<u64>,
    ) -> Result<Value, NodeError> {
        let (generation, mut conn) = self.connection(timeout, used).await?;
        let (script, evalsha, key, args) = match call {
            Call::Acquire { pipeline } => {
                // Error replies stay in the array: `parse_acquire` judges by the
                // `SET` reply first, and a refused `PTTL` or `TYPE` does not undo
                // a `SET` that ran.
                let replies = conn.send_packed_commands(pipeline, 0, pipeline.len()).await;
                if replies
                    .as_ref()
                    .map_or_else(|e| e.code().is_some(), |_| true)
                {
                    self.answered(generation);
                }
                return replies
                    .map(Value::Array)
                    .map_err(|e| NodeError::from_redis(&e));
            }
            Call::Keys { evalsha, eval } => {
                return match self.send(generation, &mut conn, evalsha).await {
                    Ok(v) => Ok(v),
                    Err(e) if e.code() == Some("NOSCRIPT") => {
                        Box::pin(self.eval_fallback(generation, conn, eval)).await
                    }
                    Err(e) => Err(NodeError::from_redis(&e)),
                };
            }
            Call::Script {
                script,
                evalsha,
                key,
                args,
            } => (script, evalsha, key, args),
        };
        // Error replies are made errors (by `send`) so they are classified.
        match self.send(generation, &mut conn, evalsha).await {
            Ok(v) => Ok(v),
            // Rare (a restarted or flushed node): boxed, so its state does not
            // enlarge every call's future.
            Err(e) if e.code() == Some("NOSCRIPT") => {
                Box::pin(self.eval_fallback(generation, conn, &eval(script, key, args))).await
            }
            Err(e) => Err(NodeError::from_redis(&e)),
        }
    }

    /// `EVAL` after `NOSCRIPT`. A failure here means the node cannot run scripts.
    async fn eval_fallback(
        &self,
        generation: u64,
        mut conn: MultiplexedConnection,
        eval: &Cmd,
    ) -> Result<Value, NodeError> {
        self.send(generation, &mut conn, eval)
            .await
            .map_err(|e| match NodeError::from_redis(&e) {
                NodeError::Server { code, message } => NodeError::NoScript(format!(
                    "EVALSHA said NOSCRIPT and the EVAL fallback failed: {code} {message}"
                )),
                other => other,
            })
    }

    /// Runs a plain command (used for `INFO server`) under `timeout`.
    pub(crate) async fn query(&self, cmd: &Cmd, timeout: Duration) -> Result<Value, NodeError> {
        let start = Instant::now();
        let mut used = None;
        let result = match tokio::time::timeout(timeout, async {
            let (generation, mut conn) = self.connection(timeout, &mut used).await?;
            self.send(generation, &mut conn, cmd)
                .await
                .map_err(|e| NodeError::from_redis(&e))
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        if let Err(e) = &result {
            self.forget_connection(e, used, start);
        }
        result
    }
}

/// Gives rustls a process-level crypto provider before the first TLS handshake:
/// redis builds its TLS configuration with `ClientConfig::builder()`, which
/// panics when no provider was installed and the crate features do not name
/// exactly one. An application that installed its own keeps it.
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first; any installed provider will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Takes a new connection out of the pool.
async fn connect(pool: &Pool) -> Result<MultiplexedConnection, NodeError> {
    let conn = pool.get().await.map_err(|e| match e {
        deadpool_redis::PoolError::Backend(err) => match NodeError::from_redis(&err) {
            NodeError::Io(m) | NodeError::Protocol(m) => NodeError::Connect(m),
            other => other,
        },
        other => NodeError::Connect(other.to_string()),
    })?;
    Ok(deadpool_redis::Connection::take(conn))
}

/// The acquire script's answer on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// `fence`: what a fenced acquire read (fencing step 1); `None` unfenced.
    Acquired {
        fence: Option<FenceRead>,
    },
    Busy {
        pttl_ms: i64,
    },
}

/// Judges the acquire pipeline by its `SET` reply: `OK` is acquired whatever
/// `PTTL` and `TYPE` said (the key is set; a user not allowed those commands
/// must still be able to lock), an error is the node's error, and nil is busy.
/// Only then do `PTTL` and `TYPE` describe the holder; a refused one leaves that
/// part unknown. A fenced acquire's two more replies (counter and `TIME`) must
/// be readable when `SET` said OK: a token picked without them could be too
/// small, so the node then counts as failed (and is released).
pub(crate) fn parse_acquire(v: Value) -> Result<AcquireReply, NodeError> {
    let Value::Array(mut items) = v else {
        return Err(NodeError::Protocol(format!("acquire reply {v:?}")));
    };
    let fenced = match items.len() {
        5 => items.split_off(3),
        _ => Vec::new(),
    };
    let [set, pttl, ty] = <[Value; 3]>::try_from(items)
        .map_err(|items| NodeError::Protocol(format!("acquire reply of {} items", items.len())))?;
    let acquired = || -> Result<AcquireReply, NodeError> {
        let fence = match <[Value; 2]>::try_from(fenced) {
            Ok([counter, time]) => Some(FenceRead {
                counter: parse_counter(counter)?,
                time_us: parse_time_us(time)?,
            }),
            Err(_) => None,
        };
        Ok(AcquireReply::Acquired { fence })
    };
    match set {
        Value::Okay => return acquired(),
        Value::SimpleString(s) if s == "OK" => return acquired(),
        Value::Nil => {}
        Value::ServerError(e) => return Err(NodeError::from_redis(&e.into())),
        other => return Err(NodeError::Protocol(format!("SET reply {other:?}"))),
    }
    let pttl_ms = match pttl {
        Value::Int(p) => Some(p),
        Value::ServerError(_) => None,
        other => return Err(NodeError::Protocol(format!("PTTL reply {other:?}"))),
    };
    let ty = match &ty {
        Value::SimpleString(s) => Some(s.as_str()),
        Value::Okay => Some("ok"),
        Value::ServerError(_) => None,
        other => return Err(NodeError::Protocol(format!("TYPE reply {other:?}"))),
    };
    // -2 is what `PTTL` says of a missing key; it maps to "no known PTTL".
    let pttl_ms = pttl_ms.unwrap_or(-2);
    match ty {
        // An unknown type is most likely our kind of holder: SET NX refused
        // because the key exists.
        Some("string") | None => Ok(AcquireReply::Busy { pttl_ms }),
        // The holder's key expired between `SET` and `TYPE`: free now.
        Some("none") => Ok(AcquireReply::Busy { pttl_ms: 0 }),
        Some(other) => Err(NodeError::WrongType {
            found: other.to_owned(),
            pttl_ms,
        }),
    }
}

/// A fence counter as `GET` returns it: none yet is 0. `u64::MAX` is refused,
/// so that `max + 1` can never overflow.
fn parse_counter(v: Value) -> Result<u64, NodeError> {
    let n = match &v {
        Value::Nil => return Ok(0),
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::ServerError(e) => return Err(NodeError::from_redis(&e.clone().into())),
        _ => None,
    };
    n.filter(|&n| n < u64::MAX)
        .ok_or_else(|| bad_read("fence counter", &v))
}

/// The node's `TIME` (seconds, microseconds) in microseconds since the epoch.
fn parse_time_us(v: Value) -> Result<u64, NodeError> {
    let part = |p: &Value| -> Option<u64> {
        match p {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::SimpleString(s) => s.parse().ok(),
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    };
    let us = match &v {
        Value::Array(parts) => match parts.as_slice() {
            [secs, micros] => part(secs)
                .zip(part(micros))
                .and_then(|(s, m)| s.checked_mul(1_000_000)?.checked_add(m)),
            _ => None,
        },
        Value::ServerError(e) => return Err(NodeError::from_redis(&e.clone().into())),
        _ => None,
    };
    us.filter(|&us| us < u64::MAX)
        .ok_or_else(|| bad_read("TIME", &v))
}

/// The extend and release scripts answer 1 (done) or 0 (token not there).
pub(crate) fn parse_flag(v: Value) -> Result<bool, NodeError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(NodeError::Protocol(format!("script reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_hash_once_and_match_redis() {
        assert_eq!(RELEASE.sha, redis::Script::new(RELEASE_LUA).get_hash());
        assert_eq!(RELEASE.sha.len(), 40);
        assert_ne!(EXTEND.sha, RELEASE.sha);
    }

    #[test]
    fn parses_busy_and_foreign_types() {
        let reply = |set: Value, pttl: i64, ty: &str| {
            Value::Array(vec![set, Value::Int(pttl), Value::SimpleString(ty.into())])
        };
        assert_eq!(
            parse_acquire(reply(Value::Nil, 1500, "string")),
            Ok(AcquireReply::Busy { pttl_ms: 1500 })
        );
        assert_eq!(
            parse_acquire(reply(Value::Nil, -1, "hash")),
            Err(NodeError::WrongType {
                found: "hash".into(),
                pttl_ms: -1
            })
        );
        assert_eq!(
            parse_acquire(reply(Value::Nil, -2, "none")),
            Ok(AcquireReply::Busy { pttl_ms: 0 })
        );
        assert_eq!(
            parse_acquire(reply(Value::Okay, 1000, "string")),
            Ok(AcquireReply::Acquired { fence: None })
        );
        assert!(parse_acquire(Value::Nil).is_err());
    }

    #[test]
    fn parses_fenced_acquire_reads() {
        let time = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        let reply = |set: Value, counter: Value| {
            Value::Array(vec![
                set,
                Value::Int(900),
                Value::SimpleString("string".into()),
                counter,
                time.clone(),
            ])
        };
        let read = |counter| {
            Ok(AcquireReply::Acquired {
                fence: Some(FenceRead {
                    counter,
                    time_us: 1_700_000_000_123_456,
                }),
            })
        };
        assert_eq!(parse_acquire(reply(Value::Okay, Value::Nil)), read(0));
        assert_eq!(
            parse_acquire(reply(Value::Okay, Value::BulkString(b"41".to_vec()))),
            read(41)
        );
        let max = u64::MAX.to_string().into_bytes();
        for bad in [b"x".to_vec(), max] {
            assert!(matches!(
                parse_acquire(reply(Value::Okay, Value::BulkString(bad))),
                Err(NodeError::Protocol(_))
            ));
        }
        // Busy: the reads do not matter.
        assert_eq!(
            parse_acquire(reply(Value::Nil, Value::BulkString(b"x".to_vec()))),
            Ok(AcquireReply::Busy { pttl_ms: 900 })
        );
    }

    #[test]
    fn judges_by_set_when_pttl_or_type_is_refused() {
        let refused = || {
            redis::parse_redis_value(b"-NOPERM this user has no permissions\r\n")
                .expect("an error reply parses")
        };
        assert!(matches!(refused(), Value::ServerError(_)));
        let reply = |set: Value| Value::Array(vec![set, refused(), refused()]);
        assert_eq!(
            parse_acquire(reply(Value::Okay)),
            Ok(AcquireReply::Acquired { fence: None })
        );
        assert_eq!(
            parse_acquire(reply(Value::Nil)),
            Ok(AcquireReply::Busy { pttl_ms: -2 })
        );
        assert_eq!(
            parse_acquire(Value::Array(vec![Value::Nil, Value::Int(700), refused()])),
            Ok(AcquireReply::Busy { pttl_ms: 700 })
        );
        assert!(matches!(
            parse_acquire(reply(refused())),
            Err(NodeError::Auth(_))
        ));
    }
}
