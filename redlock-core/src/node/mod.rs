//! One Redis master: its pool and its connection (`connection`), the commands
//! and scripts run on it (`scripts`), the reading of their replies (`parse`),
//! and the bounded send of one call.

mod connection;
mod from_url;
mod native;
mod parse;
mod scripts;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};

use crate::error::NodeError;
use connection::Shared;
#[cfg(feature = "tls")]
pub(crate) use connection::ensure_crypto_provider;
#[cfg(feature = "tls")]
pub(crate) use from_url::{invalid_url, pool_from_info};
pub(crate) use parse::{AcquireReply, parse_acquire, parse_acquire_many, parse_flag};
pub(crate) use scripts::RELEASE_LUA;
pub(crate) use scripts::{Call, EXTEND, EXTEND_BATCH, FENCE, RELEASE};
use scripts::{LuaScript, eval, release_many_cmds, release_parts};
#[cfg(feature = "idempotency")]
pub(crate) use scripts::{RECORD_GET, RECORD_PEEK, RECORD_PUT};

pub use native::{CompareAndDelete, NativeCommands, NativeSupport};

/// How one call went.
pub(crate) struct Ran {
    pub(crate) result: Result<Value, NodeError>,
    pub(crate) latency: Duration,
    /// The connection generation the call went out on (`None`: it never had a
    /// connection).
    pub(crate) generation: Option<u64>,
    /// The call's number among this node's calls, taken once its command was
    /// on the connection (0: it never got that far). If a later reading of
    /// [`Node::sends`] is at least this, the command was on the connection
    /// before anything sent after that reading.
    pub(crate) sent: u64,
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
    /// How to open this node's pub/sub connection for wake-ups; known only for
    /// nodes given by URL.
    pub(crate) pubsub: Option<redis::ConnectionInfo>,
    /// How many calls have put their command on a connection of this node
    /// (see [`Node::run_on`]): a call that took number `n` was ahead of every
    /// call that starts sending after this counter was read at `n` or more.
    sends: AtomicU64,
    /// The node's database, when known (0 for a node given as a pool): the
    /// release announces itself on a channel of this database's.
    pub(crate) db: i64,
    /// Which native commands may replace the scripts on this node (the
    /// handle's setting, given by `Inner::new`).
    pub(crate) native: NativeCommands,
}

impl Node {
    pub(crate) fn new(label: Arc<str>, address: Option<String>, pool: Pool) -> Self {
        Self {
            label,
            address,
            pool,
            shared: Arc::new(Shared::new()),
            sends: AtomicU64::new(0),
            pubsub: None,
            db: 0,
            native: NativeCommands::Off,
        }
    }

    /// Lets waiters subscribe to this node's release messages.
    pub(crate) fn with_pubsub(mut self, info: redis::ConnectionInfo) -> Self {
        self.db = info.redis_settings().db();
        self.pubsub = Some(info);
        self
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
        let ran = self.run_on(call, timeout).await;
        (ran.result, ran.latency)
    }

    /// [`Node::run`], also telling which connection the call went out on and
    /// when (see [`Ran`]).
    pub(crate) async fn run_on(&self, call: &Call, timeout: Duration) -> Ran {
        let start = Instant::now();
        let (mut used, mut sent) = (None, 0);
        let result = match tokio::time::timeout(
            timeout,
            self.run_inner(call, timeout, &mut used, &mut sent),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        if let Err(e) = &result {
            self.forget_connection(e, used, start);
        }
        Ran {
            result,
            latency: start.elapsed(),
            generation: used,
            sent,
        }
    }

    /// The number the next call to send will take, minus one: every call
    /// numbered up to this value put its command on its connection before
    /// this was read (see [`Ran::sent`]).
    pub(crate) fn sends(&self) -> u64 {
        self.sends.load(Ordering::SeqCst)
    }

    async fn run_inner(
        &self,
        call: &Call,
        timeout: Duration,
        used: &mut Option<u64>,
        sent: &mut u64,
    ) -> Result<Value, NodeError> {
        let (generation, conn) = self.connection(timeout, used).await?;
        // The first poll of what follows reaches the first send's first poll
        // (nothing before it waits), which hands the command to the
        // connection's queue or takes a place in its fair wait for room: from
        // then on, a command sent later on this connection runs after it. The
        // call is numbered only once that poll returned.
        let mut rest = pin!(self.run_call(call, generation, conn));
        let mut first = true;
        std::future::poll_fn(|cx| {
            let polled = rest.as_mut().poll(cx);
            if std::mem::take(&mut first) {
                *sent = self.sends.fetch_add(1, Ordering::SeqCst).saturating_add(1);
            }
            polled
        })
        .await
    }

    /// [`Node::run_inner`] once the connection is there.
    async fn run_call(
        &self,
        call: &Call,
        generation: u64,
        mut conn: MultiplexedConnection,
    ) -> Result<Value, NodeError> {
        if let Some(reply) = self.run_native(call, generation, &mut conn).await {
            return reply;
        }
        let release;
        let (script, evalsha, key, args): (&LuaScript, _, _, _) = match call {
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
            Call::Set { set, key } => {
                let reply = self.send(generation, &mut conn, set).await;
                return match reply {
                    Ok(Value::Nil) => Ok(self.probe_holder(generation, &mut conn, key).await),
                    Ok(v) => Ok(v),
                    Err(e) => Err(NodeError::from_redis(&e)),
                };
            }
            Call::Keys { evalsha, eval } => {
                return self.run_keys(generation, conn, evalsha, eval).await;
            }
            Call::ReleaseMany { many, token } => {
                let (evalsha, eval) = release_many_cmds(many, token, self.db);
                return self.run_keys(generation, conn, &evalsha, &eval).await;
            }
            Call::Script {
                script,
                evalsha,
                key,
                args,
            } => (*script, evalsha, key, args),
            // Nearly every node is database 0, which the call encoded once.
            Call::Release {
                evalsha,
                key,
                token,
            } if self.db == 0 => {
                return match self.send(generation, &mut conn, evalsha).await {
                    Ok(v) => Ok(v),
                    Err(e) if e.code() == Some("NOSCRIPT") => {
                        let (_, args) = release_parts(key, token, self.db);
                        Box::pin(self.eval_fallback(generation, conn, &eval(&RELEASE, key, &args)))
                            .await
                    }
                    Err(e) => Err(NodeError::from_redis(&e)),
                };
            }
            Call::Release { key, token, .. } => {
                release = release_parts(key, token, self.db);
                (&RELEASE, &release.0, key, &release.1)
            }
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

    /// A script over several keys by `EVALSHA`, then `EVAL` on `NOSCRIPT`.
    async fn run_keys(
        &self,
        generation: u64,
        mut conn: MultiplexedConnection,
        evalsha: &Cmd,
        eval: &Cmd,
    ) -> Result<Value, NodeError> {
        match self.send(generation, &mut conn, evalsha).await {
            Ok(v) => Ok(v),
            Err(e) if e.code() == Some("NOSCRIPT") => {
                Box::pin(self.eval_fallback(generation, conn, eval)).await
            }
            Err(e) => Err(NodeError::from_redis(&e)),
        }
    }

    /// After a refused `SET`: the holder's `PTTL` and `TYPE`, in the
    /// `[SET, PTTL, TYPE]` shape `parse_acquire` reads. A probe that fails
    /// leaves the holder unknown (`[nil]`): the `SET` was refused all the same.
    async fn probe_holder(
        &self,
        generation: u64,
        conn: &mut MultiplexedConnection,
        key: &str,
    ) -> Value {
        let mut probe = redis::pipe();
        probe.cmd("PTTL").arg(key).cmd("TYPE").arg(key);
        let mut items = vec![Value::Nil];
        if let Ok(replies) = conn.send_packed_commands(&probe, 0, 2).await {
            self.answered(generation);
            items.extend(replies);
        }
        Value::Array(items)
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
