//! One Redis master: its pool, its cached multiplexed connection, and the three
//! Lua scripts run on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Pipeline, Value};

use crate::error::NodeError;

/// Extend: compare-and-pexpire. Only the token's owner may push the expiry.
const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Release: compare-and-delete (spec "Releasing the lock"). Never a bare `DEL`.
const RELEASE_LUA: &str = r#"
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
        Call::Acquire { pipeline }
    }
}

/// `EVAL body 1 key args..`: the fallback after `NOSCRIPT` (a restarted or flushed
/// node). It also loads the script for the next `EVALSHA`.
fn eval(script: &LuaScript, key: &str, args: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.body).arg(1).arg(key).arg(args);
    cmd
}

/// `EVAL` after `NOSCRIPT`. A failure here means the node cannot run scripts.
async fn eval_fallback(
    mut conn: MultiplexedConnection,
    script: &LuaScript,
    key: &str,
    args: &[String],
) -> Result<Value, NodeError> {
    conn.send_packed_command(&eval(script, key, args))
        .await
        .and_then(Value::extract_error)
        .map_err(|e| match NodeError::from_redis(&e) {
            NodeError::Server { code, message } => NodeError::NoScript(format!(
                "EVALSHA said NOSCRIPT and the EVAL fallback failed: {code} {message}"
            )),
            other => other,
        })
}

/// One independent Redis master.
pub(crate) struct Node {
    pub(crate) label: Arc<str>,
    /// The address the node was configured with (no password), when known; used
    /// to refuse the same server listed twice.
    pub(crate) address: Option<String>,
    pool: Pool,
    /// redis' multiplexed connection pipelines concurrent calls over one socket, so
    /// one connection per node is the fastest path. The pool creates it (and creates
    /// it again after a failure); taking it out of the pool skips the `PING` that
    /// deadpool-redis sends to recycle a connection on every checkout.
    cached: Mutex<Option<MultiplexedConnection>>,
    /// Bumped each time a new connection replaces the cached one. Two calls with
    /// the same generation went over the same socket, so the node ran them in the
    /// order they were sent.
    generation: AtomicU64,
}

impl Node {
    pub(crate) fn new(label: Arc<str>, address: Option<String>, pool: Pool) -> Self {
        Self {
            label,
            address,
            pool,
            cached: Mutex::new(None),
            generation: AtomicU64::new(0),
        }
    }

    async fn connection(&self) -> Result<MultiplexedConnection, NodeError> {
        if let Some(conn) = self
            .cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            return Ok(conn.clone());
        }
        let conn = self.pool.get().await.map_err(|e| match e {
            deadpool_redis::PoolError::Backend(err) => match NodeError::from_redis(&err) {
                NodeError::Io(m) | NodeError::Protocol(m) => NodeError::Connect(m),
                other => other,
            },
            other => NodeError::Connect(other.to_string()),
        })?;
        let conn = deadpool_redis::Connection::take(conn);
        *self.cached.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(conn)
    }

    /// The current connection generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn forget_connection(&self) {
        *self.cached.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Runs `call` by `EVALSHA`, falling back to `EVAL` on `NOSCRIPT`, all under
    /// `timeout`. Returns the reply and the time it took.
    pub(crate) async fn run(
        &self,
        call: &Call,
        timeout: Duration,
    ) -> (Result<Value, NodeError>, Duration) {
        let start = Instant::now();
        let result = match tokio::time::timeout(timeout, self.run_inner(call)).await {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        if let Err(e) = &result
            && e.breaks_connection()
        {
            self.forget_connection();
        }
        (result, start.elapsed())
    }

    async fn run_inner(&self, call: &Call) -> Result<Value, NodeError> {
        let mut conn = self.connection().await?;
        let (script, evalsha, key, args) = match call {
            Call::Acquire { pipeline } => {
                let replies = conn
                    .send_packed_commands(pipeline, 0, 3)
                    .await
                    .map_err(|e| NodeError::from_redis(&e))?;
                let replies = replies
                    .into_iter()
                    .map(Value::extract_error)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| NodeError::from_redis(&e))?;
                return Ok(Value::Array(replies));
            }
            Call::Script {
                script,
                evalsha,
                key,
                args,
            } => (script, evalsha, key, args),
        };
        // Error replies arrive as `Value::ServerError`; `extract_error` makes them
        // errors so they are classified.
        match conn
            .send_packed_command(evalsha)
            .await
            .and_then(Value::extract_error)
        {
            Ok(v) => Ok(v),
            // Rare (a restarted or flushed node): boxed, so its state does not
            // enlarge every call's future.
            Err(e) if e.code() == Some("NOSCRIPT") => {
                Box::pin(eval_fallback(conn, script, key, args)).await
            }
            Err(e) => Err(NodeError::from_redis(&e)),
        }
    }

    /// Runs a plain command (used for `INFO server`) under `timeout`.
    pub(crate) async fn query(&self, cmd: &Cmd, timeout: Duration) -> Result<Value, NodeError> {
        match tokio::time::timeout(timeout, async {
            let mut conn = self.connection().await?;
            conn.send_packed_command(cmd)
                .await
                .and_then(Value::extract_error)
                .map_err(|e| NodeError::from_redis(&e))
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout(timeout)),
        }
    }
}

/// The acquire script's answer on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Acquired,
    Busy { pttl_ms: i64 },
}

pub(crate) fn parse_acquire(v: Value) -> Result<AcquireReply, NodeError> {
    let Value::Array(items) = v else {
        return Err(NodeError::Protocol(format!("acquire reply {v:?}")));
    };
    let [set, pttl, ty] = items.as_slice() else {
        return Err(NodeError::Protocol(format!(
            "acquire reply of {} items",
            items.len()
        )));
    };
    match set {
        Value::Okay => return Ok(AcquireReply::Acquired),
        Value::SimpleString(s) if s == "OK" => return Ok(AcquireReply::Acquired),
        Value::Nil => {}
        other => return Err(NodeError::Protocol(format!("SET reply {other:?}"))),
    }
    let ty = match ty {
        Value::SimpleString(s) => s.as_str(),
        Value::Okay => "ok",
        other => return Err(NodeError::Protocol(format!("TYPE reply {other:?}"))),
    };
    let pttl_ms = match pttl {
        Value::Int(p) => *p,
        other => return Err(NodeError::Protocol(format!("PTTL reply {other:?}"))),
    };
    match ty {
        "string" => Ok(AcquireReply::Busy { pttl_ms }),
        // The holder's key expired between `SET` and `TYPE`: free now.
        "none" => Ok(AcquireReply::Busy { pttl_ms: 0 }),
        other => Err(NodeError::WrongType {
            found: other.to_owned(),
            pttl_ms,
        }),
    }
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
            Ok(AcquireReply::Acquired)
        );
        assert!(parse_acquire(Value::Nil).is_err());
    }
}
