//! One Redis master: its pool, its cached multiplexed connection, and the three
//! Lua scripts run on it.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};

use crate::error::NodeError;

/// Acquire: `SET NX PX`, and when the key is taken, the holder's `TYPE` and `PTTL`
/// in the same round trip (spec step 2, plus "retry after" information).
const ACQUIRE_LUA: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return {redis.call('TYPE', KEYS[1])['ok'], redis.call('PTTL', KEYS[1])}
"#;

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

pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(ACQUIRE_LUA));
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(EXTEND_LUA));
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_LUA));

/// One script call, encoded once and sent to every node.
pub(crate) struct Call {
    script: &'static LuaScript,
    evalsha: Cmd,
    key: Arc<str>,
    args: Vec<String>,
}

impl Call {
    /// `EVALSHA sha 1 key args..`, built once per operation.
    pub(crate) fn new(script: &'static LuaScript, key: Arc<str>, args: Vec<String>) -> Self {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(1).arg(&*key).arg(&args);
        Self {
            script,
            evalsha,
            key,
            args,
        }
    }

    /// `EVAL body 1 key args..`: the fallback after `NOSCRIPT` (a restarted or
    /// flushed node). It also loads the script for the next `EVALSHA`.
    fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.script.body)
            .arg(1)
            .arg(&*self.key)
            .arg(&self.args);
        cmd
    }
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
}

impl Node {
    pub(crate) fn new(label: Arc<str>, address: Option<String>, pool: Pool) -> Self {
        Self {
            label,
            address,
            pool,
            cached: Mutex::new(None),
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
        Ok(conn)
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
        if let Err(e) = &result {
            if e.breaks_connection() {
                self.forget_connection();
            }
        }
        (result, start.elapsed())
    }

    async fn run_inner(&self, call: &Call) -> Result<Value, NodeError> {
        let mut conn = self.connection().await?;
        // Error replies arrive as `Value::ServerError`; `extract_error` makes them
        // errors so they are classified.
        match conn
            .send_packed_command(&call.evalsha)
            .await
            .and_then(Value::extract_error)
        {
            Ok(v) => Ok(v),
            Err(e) if e.code() == Some("NOSCRIPT") => conn
                .send_packed_command(&call.eval())
                .await
                .and_then(Value::extract_error)
                .map_err(|e| match NodeError::from_redis(&e) {
                    NodeError::Server { code, message } => NodeError::NoScript(format!(
                        "EVALSHA said NOSCRIPT and the EVAL fallback failed: {code} {message}"
                    )),
                    other => other,
                }),
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
    match v {
        Value::Int(1) | Value::Okay => Ok(AcquireReply::Acquired),
        Value::Array(items) if items.len() == 2 => {
            let ty = match &items[0] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                other => return Err(NodeError::Protocol(format!("TYPE reply {other:?}"))),
            };
            let pttl_ms = match &items[1] {
                Value::Int(p) => *p,
                other => return Err(NodeError::Protocol(format!("PTTL reply {other:?}"))),
            };
            if ty == "string" {
                Ok(AcquireReply::Busy { pttl_ms })
            } else {
                Err(NodeError::WrongType { found: ty, pttl_ms })
            }
        }
        other => Err(NodeError::Protocol(format!("acquire reply {other:?}"))),
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
        assert_eq!(ACQUIRE.sha, redis::Script::new(ACQUIRE_LUA).get_hash());
        assert_eq!(RELEASE.sha.len(), 40);
        assert_ne!(EXTEND.sha, RELEASE.sha);
    }

    #[test]
    fn parses_busy_and_foreign_types() {
        let busy = Value::Array(vec![
            Value::BulkString(b"string".to_vec()),
            Value::Int(1500),
        ]);
        assert_eq!(
            parse_acquire(busy),
            Ok(AcquireReply::Busy { pttl_ms: 1500 })
        );
        let foreign = Value::Array(vec![Value::SimpleString("hash".into()), Value::Int(-1)]);
        assert_eq!(
            parse_acquire(foreign),
            Err(NodeError::WrongType {
                found: "hash".into(),
                pttl_ms: -1
            })
        );
        assert_eq!(parse_acquire(Value::Int(1)), Ok(AcquireReply::Acquired));
        assert!(parse_acquire(Value::Nil).is_err());
    }
}
