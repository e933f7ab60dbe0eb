//! Release (spec step 5) and extend by the server's own compare-and-delete and
//! compare-and-set where a node has them, else by the Lua scripts:
//!
//! - release by `DELIFEQ key token` (Valkey 9.0+) or `DELEX key IFEQ token`
//!   (Redis 8.4, Valkey 9.2), then, only when it deleted, the wake-up
//!   `PUBLISH` the release script sends;
//! - extend by `SET key token IFEQ token PX ttl` (Valkey 8.1+, Redis 8.4),
//!   which sets the value and expiry only while the key holds the token and
//!   never creates the key.
//!
//! Support is asked on each new connection, right after it is open and
//! without holding up any call (until the answer, the scripts run), never assumed and never read
//! off the reported version (Dragonfly answers "redis 6.2.11"): `COMMAND
//! INFO` says whether `DELIFEQ` and `DELEX` exist, `COMMAND DOCS` whether
//! `SET` and `DELEX` take `IFEQ` (`COMMAND INFO` lists commands, not their
//! arguments). A reconnect may land on another server (a failover, an
//! upgrade), so what was found belongs to the connection it was found on.

use super::cluster::Conn;
use redis::{Cmd, Value};

use super::Node;
use super::scripts::{Call, EXTEND};
use crate::error::NodeError;

/// Which native commands a [`Redlock`](crate::Redlock) uses where a node has
/// them ([`RedlockBuilder::native_commands`](crate::RedlockBuilder::native_commands)).
/// Where a node lacks them, or refuses one (an ACL, a renamed command), the
/// Lua scripts run instead.
///
/// Measured on Valkey 9.1 (`bench -- native`: 5 nodes, 16 tasks, 2 cores,
/// three runs): a native extend cut the server CPU of lock+extend+unlock to
/// 0.83–0.90× and raised throughput 1.22–1.47×; a native release cut the
/// server CPU of lock+unlock to 0.84–0.89×, but its throughput went
/// 0.74–1.17× and its client CPU 0.99–1.17×. Hence the default: native
/// extend, release by the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NativeCommands {
    /// The Lua scripts on every node; nothing is detected.
    Off,
    /// Extend by `SET key token IFEQ token PX ttl`; release by the script,
    /// which deletes and publishes the wake-up in one step. An extend the
    /// node refuses for memory (`SET` is refused over `maxmemory`, the
    /// script's `PEXPIRE` is not) is sent again as the script.
    #[default]
    Extend,
    /// Also release by `DELIFEQ` / `DELEX … IFEQ`, followed by the wake-up
    /// `PUBLISH` when it deleted: two commands where the script runs three
    /// inside one, less server CPU, more client work, and the wake-up
    /// reaches other processes' waiters one client turn after the delete
    /// instead of with it. For nodes short of CPU.
    ReleaseAndExtend,
}

impl NativeCommands {
    fn release(self) -> bool {
        matches!(self, Self::ReleaseAndExtend)
    }

    fn extend(self) -> bool {
        matches!(self, Self::Extend | Self::ReleaseAndExtend)
    }
}

/// The native compare-and-delete a node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompareAndDelete {
    /// `DELIFEQ key value` (Valkey 9.0+).
    DelIfEq,
    /// `DELEX key IFEQ value` (Redis 8.4, Valkey 9.2).
    DelExIfEq,
}

/// What a node's current connection was found to offer
/// ([`NodeInfo::native`](crate::NodeInfo::native)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NativeSupport {
    /// Its compare-and-delete command, if any (`DELIFEQ` preferred).
    pub compare_and_delete: Option<CompareAndDelete>,
    /// Whether `SET` takes `IFEQ`.
    pub set_ifeq: bool,
}

impl NativeSupport {
    /// Neither command.
    pub fn none() -> Self {
        Self::default()
    }
}

/// Asks the node on `conn` which commands it has, in one round trip. A
/// refused or unreadable answer (an ACL without `COMMAND`, a proxy) means
/// none: the scripts always work.
pub(super) async fn detect(conn: &mut Conn) -> NativeSupport {
    let mut pipe = redis::pipe();
    pipe.cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .arg("DELEX")
        .cmd("COMMAND")
        .arg("DOCS")
        .arg("SET")
        .arg("DELEX");
    match conn.send_packed_commands(&pipe, 0, 2).await {
        Ok(replies) => match <[Value; 2]>::try_from(replies) {
            Ok([info, docs]) => support_from(&info, &docs),
            Err(_) => NativeSupport::none(),
        },
        Err(_) => NativeSupport::none(),
    }
}

/// Reads `COMMAND INFO DELIFEQ DELEX` and `COMMAND DOCS SET DELEX`.
fn support_from(info: &Value, docs: &Value) -> NativeSupport {
    let Value::Array(entries) = info else {
        return NativeSupport::none();
    };
    // An entry is nil for an unknown command, else `[name, arity, ..]`.
    let has = |i: usize, name: &str, arity: i64| {
        matches!(entries.get(i), Some(Value::Array(e))
            if e.first().and_then(text).is_some_and(|n| n.eq_ignore_ascii_case(name))
                && matches!(e.get(1), Some(Value::Int(a)) if *a == arity))
    };
    let takes_ifeq = |name: &str| {
        doc_of(docs, name)
            .and_then(|d| field(d, "arguments"))
            .is_some_and(|args| mentions_token(args, "IFEQ"))
    };
    let compare_and_delete = if has(0, "delifeq", 3) {
        Some(CompareAndDelete::DelIfEq)
    } else if has(1, "delex", -2) && takes_ifeq("delex") {
        Some(CompareAndDelete::DelExIfEq)
    } else {
        None
    };
    NativeSupport {
        compare_and_delete,
        set_ifeq: takes_ifeq("set"),
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The pairs of a RESP2 flat array or a RESP3 map.
fn pairs(v: &Value) -> Vec<(&Value, &Value)> {
    match v {
        Value::Array(items) => items.chunks_exact(2).map(|kv| (&kv[0], &kv[1])).collect(),
        Value::Map(kv) => kv.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    }
}

fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    pairs(v)
        .into_iter()
        .find(|(k, _)| text(k).is_some_and(|k| k.eq_ignore_ascii_case(name)))
        .map(|(_, v)| v)
}

/// The documentation of command `name` in a `COMMAND DOCS` reply.
fn doc_of<'a>(docs: &'a Value, name: &str) -> Option<&'a Value> {
    field(docs, name)
}

/// Whether an argument tree has an argument whose `token` is `token`.
fn mentions_token(args: &Value, token: &str) -> bool {
    let items: Vec<&Value> = match args {
        Value::Array(items) => items.iter().collect(),
        _ => return false,
    };
    items.into_iter().any(|arg| {
        field(arg, "token")
            .and_then(text)
            .is_some_and(|t| t.eq_ignore_ascii_case(token))
            || field(arg, "arguments").is_some_and(|a| mentions_token(a, token))
    })
}

/// Whether a native command's error means "not here after all" (unknown,
/// refused by an ACL, a syntax this server does not take), so the script
/// should run instead, and native commands stop on this connection.
fn not_supported(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("ERR" | "NOPERM"))
}

impl Node {
    /// Runs `call` by a native command when it is a release or an extend,
    /// the handle's [`NativeCommands`] allow it, and connection `generation`
    /// has it; `None` when the script must run. An extend refused for memory
    /// (`SET` is refused over `maxmemory`, the script's `PEXPIRE` is not) or
    /// a command the node turns out not to take also gives `None`.
    pub(super) async fn run_native(
        &self,
        call: &Call,
        generation: u64,
        conn: &mut Conn,
    ) -> Option<Result<Value, NodeError>> {
        if !self.native_may_run(call) {
            return None;
        }
        let mode = self.native;
        match call {
            Call::Release { key, token, .. } if mode.release() => {
                let delete = self.native_support(generation)?.compare_and_delete?;
                let mut cmd = match delete {
                    CompareAndDelete::DelIfEq => redis::cmd("DELIFEQ"),
                    CompareAndDelete::DelExIfEq => redis::cmd("DELEX"),
                };
                cmd.arg(&**key);
                if delete == CompareAndDelete::DelExIfEq {
                    cmd.arg("IFEQ");
                }
                cmd.arg(&**token);
                let reply = self.send_native(generation, conn, &cmd).await?;
                if matches!(reply, Ok(Value::Int(1))) {
                    self.announce(conn, key).await;
                }
                Some(reply)
            }
            Call::Script {
                script, key, args, ..
            } if mode.extend() && std::ptr::eq(*script, &*EXTEND) => {
                if !self.native_support(generation)?.set_ifeq {
                    return None;
                }
                let [token, ttl_ms] = args.as_slice() else {
                    return None;
                };
                let mut cmd = redis::cmd("SET");
                cmd.arg(&**key)
                    .arg(token)
                    .arg("IFEQ")
                    .arg(token)
                    .arg("PX")
                    .arg(ttl_ms);
                match self.send_native(generation, conn, &cmd).await? {
                    // The script's answers: 1 extended, 0 not held.
                    Ok(Value::Okay) => Some(Ok(Value::Int(1))),
                    Ok(Value::SimpleString(s)) if s == "OK" => Some(Ok(Value::Int(1))),
                    Ok(Value::Nil) => Some(Ok(Value::Int(0))),
                    Err(NodeError::OutOfMemory) => None,
                    other => Some(other),
                }
            }
            _ => None,
        }
    }

    /// Whether the handle's [`NativeCommands`] let a native command replace
    /// `call`'s script (the connection may still lack it): known without a
    /// wait, so that the other calls skip [`Node::run_native`] and its state.
    pub(super) fn native_may_run(&self, call: &Call) -> bool {
        let mode = self.native;
        match call {
            // A reader also leaves its index: only the script does that.
            Call::Release { key, .. } => mode.release() && !crate::keys::is_reader_key(key),
            Call::Script { script, .. } => mode.extend() && std::ptr::eq(*script, &*EXTEND),
            _ => false,
        }
    }

    /// Sends a native command; `None` (the script runs) when the node does
    /// not take it, which also stops native commands on this connection.
    async fn send_native(
        &self,
        generation: u64,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> Option<Result<Value, NodeError>> {
        match self.send(generation, conn, cmd).await {
            Ok(v) => Some(Ok(v)),
            Err(e) if not_supported(&e) => {
                tracing::debug!(node = %self.label, error = %e, "native command refused; using the scripts on this connection");
                self.forget_native(generation);
                None
            }
            Err(e) => Some(Err(NodeError::from_redis(&e))),
        }
    }

    /// The wake-up the release script sends after its delete, on the same
    /// channel (`keys::CHANNEL_PREFIX`, the node's database, the key). Its
    /// answer is not waited for: the release is decided by the delete, and,
    /// as with the script's `pcall`, a user not allowed to publish still
    /// releases. Sent after every native delete, waiters flag or not: the
    /// flag could be read only by one more command. A cluster node's is an
    /// `SPUBLISH`, which redis' cluster connection sends to the channel's
    /// slot, the key's.
    async fn announce(&self, conn: &mut Conn, key: &str) {
        let verb = if self.pool.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        };
        let mut publish = redis::cmd(verb);
        publish
            .arg(crate::keys::channel(self.db, key))
            .arg("1")
            .set_no_response(true);
        let _ = conn.send_packed_command(&publish).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::BulkString(x.as_bytes().to_vec())
    }

    fn docs_with(command: &str, token: &str) -> Value {
        let arg = Value::Array(vec![s("name"), s("comparison-value"), s("token"), s(token)]);
        let condition = Value::Array(vec![
            s("name"),
            s("condition"),
            s("arguments"),
            Value::Array(vec![arg]),
        ]);
        Value::Array(vec![
            s(command),
            Value::Array(vec![
                s("summary"),
                s("x"),
                s("arguments"),
                Value::Array(vec![condition]),
            ]),
        ])
    }

    #[test]
    fn reads_command_info_and_docs() {
        let info = |name: &str, arity: i64| Value::Array(vec![s(name), Value::Int(arity)]);
        let valkey = support_from(
            &Value::Array(vec![info("delifeq", 3), Value::Nil]),
            &docs_with("set", "IFEQ"),
        );
        assert_eq!(
            valkey,
            NativeSupport {
                compare_and_delete: Some(CompareAndDelete::DelIfEq),
                set_ifeq: true
            }
        );
        let redis7 = support_from(
            &Value::Array(vec![Value::Nil, Value::Nil]),
            &docs_with("set", "NX"),
        );
        assert_eq!(redis7, NativeSupport::none());
        // DELEX counts only when its docs say it takes IFEQ.
        let delex = Value::Array(vec![Value::Nil, info("delex", -2)]);
        assert_eq!(
            support_from(&delex, &docs_with("set", "IFEQ")).compare_and_delete,
            None
        );
        assert_eq!(
            support_from(&delex, &docs_with("delex", "IFEQ")).compare_and_delete,
            Some(CompareAndDelete::DelExIfEq)
        );
        // Another command under the name (another arity) is not used.
        assert_eq!(
            support_from(
                &Value::Array(vec![info("delifeq", -2), Value::Nil]),
                &Value::Nil
            ),
            NativeSupport::none()
        );
    }
}
