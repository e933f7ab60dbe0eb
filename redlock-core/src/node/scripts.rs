//! The commands and Lua scripts a node runs, encoded once per operation and
//! sent to every node: the acquire pipeline (spec step 2), compare-and-pexpire
//! (extend), compare-and-delete (release) and the fence (fencing step 3).

use std::sync::{Arc, LazyLock};

use redis::{Cmd, Pipeline};

/// Extend: compare-and-pexpire. Only the token's owner may push the expiry.
const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Release: compare-and-delete (spec "Releasing the lock"). Never a bare `DEL`.
/// A delete is announced on the key's channel (`wake::channel`) to wake the
/// waiters; by `pcall`, so that a user not allowed to publish still releases.
/// `PUBLISH` reaches every database of the server, and a script cannot read
/// which database it runs in: the node's database comes as `ARGV[2]` and is
/// part of the channel, so a release in one database wakes no waiter of
/// another.
pub(crate) const RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', 'redlock:released:' .. (ARGV[2] or '0') .. ':' .. KEYS[1], '1')
  return 1
end
return 0
"#;

/// Batched extend (`extend_batch.rs`): compare-and-pexpire of every key
/// `KEYS[i]` held with token `ARGV[2i-1]` to `ARGV[2i]` ms, one flag per key.
/// The `GET` is a `pcall`: a key holding a foreign non-string value is "not
/// held" for that lock alone instead of failing the whole batch on the node.
const EXTEND_MANY_LUA: &str = r#"
local out = {}
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
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
///
/// `ARGV[3]` is the counter's expiry in ms (`fencing::counter_ttl`), `0` for
/// none: every applied fence sets or refreshes it, so a counter expires only
/// after that long without a holder; a `Durable` fence makes it permanent.
const FENCE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local c = redis.call('GET', KEYS[2])
if not c or #c < #ARGV[2] or (#c == #ARGV[2] and c < ARGV[2]) then
  if ARGV[3] == '0' then
    redis.call('SET', KEYS[2], ARGV[2])
  else
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
elseif ARGV[3] == '0' then
  redis.call('PERSIST', KEYS[2])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
"#;

/// The idempotency record's write: sets the record (`KEYS[2]`) to `ARGV[2]`
/// for `ARGV[3]` ms, only while the lock key (`KEYS[1]`) still holds the
/// writer's token `ARGV[1]`. A holder whose key expired here, and perhaps
/// went to another holder, writes nothing on this node.
#[cfg(feature = "idempotency")]
const RECORD_PUT_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"#;

/// The idempotency record's read.
#[cfg(feature = "idempotency")]
const RECORD_GET_LUA: &str = "return redis.call('GET', KEYS[1])";

#[cfg(feature = "idempotency")]
pub(crate) static RECORD_PUT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_PUT_LUA));
#[cfg(feature = "idempotency")]
pub(crate) static RECORD_GET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_GET_LUA));
pub(crate) static FENCE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(FENCE_LUA));
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(EXTEND_LUA));
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_LUA));
pub(crate) static EXTEND_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(EXTEND_MANY_LUA));

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
    /// The release script for `key` and `token`: its last argument is each
    /// node's own database (the channel it announces on), so it is encoded
    /// per node (`release_parts`).
    Release { key: Arc<str>, token: String },
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

    /// The release (compare-and-delete) of `key` held with `token`.
    pub(crate) fn release(key: Arc<str>, token: String) -> Self {
        Call::Release { key, token }
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

/// The release's `EVALSHA` and arguments as node `db` runs it: the database
/// names the channel the release is announced on.
pub(super) fn release_parts(key: &str, token: &str, db: i64) -> (Cmd, Vec<String>) {
    let args = vec![token.to_owned(), db.to_string()];
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(&RELEASE.sha).arg(1).arg(key).arg(&args);
    (evalsha, args)
}

/// `EVAL body 1 key args..`: the fallback after `NOSCRIPT` (a restarted or flushed
/// node). It also loads the script for the next `EVALSHA`.
pub(super) fn eval(script: &LuaScript, key: &str, args: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.body).arg(1).arg(key).arg(args);
    cmd
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
}
