//! How one [`Call`] becomes commands on a node's connection (node layer):
//! the common shapes share one send, every rarer shape (a native command,
//! the busy probe, a pipeline, a script over several keys, the `EVAL`
//! fallback) is boxed.

use std::time::Duration;

use super::cluster::Conn;
use redis::{Cmd, Value};

use super::many::{release_many_cmds, release_many_unflagged_cmds};
use super::release_scripts::{Announce, release_eval, release_evalsha, release_unflagged};
use super::scripts::eval;
use super::{Call, Node};
use crate::error::NodeError;

impl Node {
    /// How this node's release scripts announce a delete: `SPUBLISH` on a
    /// cluster node, else `PUBLISH` in the node's database.
    fn announce_by(&self) -> Announce {
        if self.pool.is_cluster() {
            Announce::Shard
        } else {
            Announce::Publish { db: self.db }
        }
    }

    /// [`Node::run_inner`] once the connection is there.
    ///
    /// Every node call's future lives in its fan-out's set, so its size is
    /// copied into that allocation on every call: the common shapes (the
    /// acquire's `SET`, the release's and the extend's scripts) share one
    /// `send`, and every rarer shape (a native command, the busy probe, a
    /// pipeline, a script over several keys, the `EVAL` fallback) is boxed,
    /// so that its state costs only the calls that take it (BENCHMARKS.md,
    /// "Smaller node calls").
    pub(super) async fn run_call(
        &self,
        call: &Call,
        generation: u64,
        conn: Conn,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        if let Some(acks) = self.replica_acks.filter(|_| super::replicas::waits(call)) {
            return Box::pin(self.run_acked(acks, call, generation, conn, timeout)).await;
        }
        self.run_written(call, generation, conn).await
    }

    /// [`Node::run_call`] without replica acks.
    pub(super) async fn run_written(
        &self,
        call: &Call,
        generation: u64,
        mut conn: Conn,
    ) -> Result<Value, NodeError> {
        if self.native_may_run(call)
            && let Some(reply) = Box::pin(self.run_native(call, generation, &mut conn)).await
        {
            return reply;
        }
        let cmd = match call {
            Call::Set { set, .. } => set,
            Call::Release { evalsha, .. } if self.db == 0 && !self.pool.is_cluster() => evalsha,
            Call::Script { evalsha, .. } => evalsha,
            _ => return Box::pin(self.run_rare(call, generation, conn)).await,
        };
        // Error replies are made errors (by `send`) so they are classified.
        match (self.send(generation, &mut conn, cmd).await, call) {
            // A refused `SET`: who holds the key, one more round trip.
            (Ok(Value::Nil), Call::Set { key, .. }) => {
                Ok(Box::pin(self.probe_holder(generation, &mut conn, key)).await)
            }
            (Ok(v), _) => Ok(v),
            // Rare (a restarted or flushed node).
            (Err(e), Call::Release { key, token, .. }) if e.code() == Some("NOSCRIPT") => {
                let eval = release_eval(key, token, self.announce_by());
                match Box::pin(self.eval_fallback(generation, conn.clone(), &eval)).await {
                    Err(e) if refused_flag(&e) => {
                        Box::pin(self.release_unflagged(generation, conn, key, token)).await
                    }
                    other => other,
                }
            }
            // An ACL that refuses the waiters flag's key.
            (Err(e), Call::Release { key, token, .. })
                if refused_flag(&NodeError::from_redis(&e)) =>
            {
                Box::pin(self.release_unflagged(generation, conn, key, token)).await
            }
            (
                Err(e),
                Call::Script {
                    script, key, args, ..
                },
            ) if e.code() == Some("NOSCRIPT") => {
                Box::pin(self.eval_fallback(generation, conn, &eval(script, key, args))).await
            }
            (Err(e), _) => Err(NodeError::from_redis(&e)),
        }
    }

    /// Any call, the way [`Node::run_call`] runs it; boxed there, and used
    /// for the shapes it does not send itself: a fencing lock's acquire
    /// pipeline, scripts over several keys, and a release on a node of
    /// another database than 0 or on a cluster node.
    async fn run_rare(
        &self,
        call: &Call,
        generation: u64,
        mut conn: Conn,
    ) -> Result<Value, NodeError> {
        match call {
            Call::Acquire {
                pipeline,
                skip,
                tail,
            } => {
                // Error replies stay in the array: `parse_acquire` judges by the
                // `SET` reply first, and a refused `PTTL` or `TYPE` does not undo
                // a `SET` that ran. A refused waiters flag (an ACL, OOM) is
                // dropped with the flag's other reply: the waiter then wakes by
                // its timers alone.
                let replies = conn.send_packed_commands(pipeline, 0, pipeline.len()).await;
                if replies
                    .as_ref()
                    .map_or_else(|e| e.code().is_some(), |_| true)
                {
                    self.answered(generation);
                }
                replies
                    .map(|mut r| {
                        r.truncate(r.len().saturating_sub(*tail));
                        Value::Array(r.split_off((*skip).min(r.len())))
                    })
                    .map_err(|e| NodeError::from_redis(&e))
            }
            Call::Keys {
                per_slot: Some(per_slot),
                ..
            } if self.pool.is_cluster() => self.run_per_slot(generation, conn, per_slot).await,
            Call::Keys { evalsha, eval, .. } => {
                self.run_keys(generation, conn, evalsha, eval).await
            }
            Call::ReleaseMany { many, token } if self.pool.is_cluster() => {
                let per_slot = super::per_slot::release_many_per_slot(many, token, self.db);
                self.run_per_slot(generation, conn, &per_slot).await
            }
            Call::ReleaseMany { many, token } => {
                let (evalsha, eval) = release_many_cmds(many, token, self.db);
                match self
                    .run_keys(generation, conn.clone(), &evalsha, &eval)
                    .await
                {
                    // An ACL that refuses the waiters flags' keys.
                    Err(e) if refused_flag(&e) => {
                        let (evalsha, eval) = release_many_unflagged_cmds(many, token, self.db);
                        self.run_keys(generation, conn, &evalsha, &eval).await
                    }
                    other => other,
                }
            }
            Call::Release { key, token, .. } => {
                let evalsha = release_evalsha(key, token, self.announce_by());
                let eval = release_eval(key, token, self.announce_by());
                match self
                    .run_keys(generation, conn.clone(), &evalsha, &eval)
                    .await
                {
                    Err(e) if refused_flag(&e) => {
                        self.release_unflagged(generation, conn, key, token).await
                    }
                    other => other,
                }
            }
            // `run_call` sends these two itself; the same here.
            Call::Set { set, key, .. } => match self.send(generation, &mut conn, set).await {
                Ok(Value::Nil) => Ok(self.probe_holder(generation, &mut conn, key).await),
                Ok(v) => Ok(v),
                Err(e) => Err(NodeError::from_redis(&e)),
            },
            Call::Script {
                script,
                evalsha,
                key,
                args,
            } => {
                self.run_keys(generation, conn, evalsha, &eval(script, key, args))
                    .await
            }
        }
    }

    /// The release without the waiters flag, for a user whose ACL refused
    /// the flag's key: every delete announced, as before flags.
    pub(super) async fn release_unflagged(
        &self,
        generation: u64,
        conn: Conn,
        key: &str,
        token: &str,
    ) -> Result<Value, NodeError> {
        tracing::debug!(node = %self.label, "release refused: releasing without the waiters flag");
        let (evalsha, eval) = release_unflagged(key, token, self.announce_by());
        self.run_keys(generation, conn, &evalsha, &eval).await
    }

    /// A script over several keys by `EVALSHA`, then `EVAL` on `NOSCRIPT`.
    pub(super) async fn run_keys(
        &self,
        generation: u64,
        mut conn: Conn,
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
    async fn probe_holder(&self, generation: u64, conn: &mut Conn, key: &str) -> Value {
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
        mut conn: Conn,
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
}

/// Whether a release's refusal may be an ACL's refusal of the waiters flag's
/// key: `NOPERM`, the `ERR` a script gets for a key it names itself (the
/// release scripts build the flag's name; Redis and Valkey word that error
/// differently), or either of them from the `EVAL` after `NOSCRIPT`
/// (`NoScript`). The release then runs again without the flag, which fails
/// the same way when the flag was not the cause.
pub(super) fn refused_flag(e: &NodeError) -> bool {
    match e {
        NodeError::Auth(m) => m.starts_with("NOPERM"),
        NodeError::Server { code, .. } => code == "ERR",
        NodeError::NoScript(_) => true,
        _ => false,
    }
}
