//! The commands and Lua scripts a node runs, encoded once per operation and
//! sent to every node: the acquire pipeline (spec step 2), compare-and-pexpire
//! (extend), compare-and-delete (release) and the fence (fencing step 3).

use std::sync::{Arc, LazyLock};

use redis::{Cmd, Pipeline};

use crate::keys::{Keys, Many};

/// Extend: compare-and-pexpire. Only the token's owner may push the expiry.
const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Release: compare-and-delete (spec "Releasing the lock"). Never a bare `DEL`.
/// The key's waiters flag (the key and `wake::WAITERS_SUFFIX`) goes in the
/// same `DEL`: only when it was there, i.e. some waiter set it before its
/// attempt on this node, is the delete announced on the key's channel
/// (`wake::channel`) to wake the waiters. A release nobody waits for thus
/// runs two commands on the node, not three: each `redis.call` costs the
/// node about 3,900 instructions, 12% of the call (BENCHMARKS.md, "Announce
/// a release only to waiters"). The `PUBLISH` is a `pcall`, so that a user
/// not allowed to publish still releases. This one is for database 0, what
/// nearly every node uses: its channel is written in, since every argument
/// costs the node about 1,800 instructions; [`RELEASE_IN_DB_LUA`] takes the
/// database as `ARGV[2]`.
///
/// The flag's name is built here from `KEYS[1]` rather than passed as
/// `KEYS[2]`: one argument less cuts the node's work per release by about
/// 1,300 instructions of 34,000 (BENCHMARKS.md, "The release script names
/// the waiters flag"). Redis asks scripts to declare their keys for Redis
/// Cluster's sake; every node here is a standalone master, and a cluster
/// node would have refused the two-key form too (the key and its flag hash
/// to different slots). A user whose ACL refuses the flag's key gets an
/// `ERR` from this script before anything is deleted, and the release runs
/// again without the flag ([`RELEASE_UNFLAGGED_LUA`]).
pub(crate) const RELEASE_LUA: &str = concat!(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[1] .. '"#,
    waiters_suffix!(),
    r#"') > 1 then
    redis.pcall('PUBLISH', 'redlock:released:0:' .. KEYS[1], '1')
  end
  return 1
end
return 0
"#
);

/// [`RELEASE_LUA`] for a node of another database than 0, named by `ARGV[2]`
/// (`PUBLISH` reaches every database of a server, and a script cannot read
/// which database it runs in).
const RELEASE_IN_DB_LUA: &str = concat!(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[1] .. '"#,
    waiters_suffix!(),
    r#"') > 1 then
    redis.pcall('PUBLISH', 'redlock:released:' .. ARGV[2] .. ':' .. KEYS[1], '1')
  end
  return 1
end
return 0
"#
);

/// The release for a user whose ACL refuses the waiters flag's key
/// (`ERR` from [`RELEASE_LUA`]): the key alone, every delete announced on
/// the channel `ARGV[2]`, as before waiters set flags.
const RELEASE_UNFLAGGED_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
"#;

/// Batched extend (`extend_batch.rs`): compare-and-pexpire of every key
/// `KEYS[i]` held with token `ARGV[2i-1]` to `ARGV[2i]` ms, one flag per key.
/// The `GET` is a `pcall`: a key holding a foreign non-string value is "not
/// held" for that lock alone instead of failing the whole batch on the node.
const EXTEND_BATCH_LUA: &str = r#"
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
    pub(super) fn new(body: &'static str) -> Self {
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

/// The idempotency record's fast read, with the lock key's value read in the
/// same step: `{record, lock value}`. A node whose lock key already holds the
/// reader's token answered under the reader's lock (see `RedisStore::peek`).
/// A lock key of another type reads as no holder.
#[cfg(feature = "idempotency")]
const RECORD_PEEK_LUA: &str = r#"
local holder = redis.pcall('GET', KEYS[2])
if type(holder) ~= 'string' then holder = false end
return {redis.call('GET', KEYS[1]), holder}
"#;

/// The idempotency key's generation, taken by a holder before it runs the
/// work: only while the lock key (`KEYS[1]`) still holds the holder's token
/// `ARGV[1]`, the counter `KEYS[2]` goes up by one, and to at least `ARGV[3]`
/// (the holder's generation, when it raises a node that lagged behind), and
/// expires with the records (`ARGV[2]` ms). Returns the counter, or `false`
/// where the lock is not the holder's. See `RedisStore::generation`.
#[cfg(feature = "idempotency")]
const RECORD_GENERATION_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return false
end
local g = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if g < floor then
  redis.call('SET', KEYS[2], ARGV[3])
  g = floor
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return g
"#;

#[cfg(feature = "idempotency")]
pub(crate) static RECORD_GENERATION: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_GENERATION_LUA));
#[cfg(feature = "idempotency")]
pub(crate) static RECORD_PUT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_PUT_LUA));
#[cfg(feature = "idempotency")]
pub(crate) static RECORD_GET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_GET_LUA));
#[cfg(feature = "idempotency")]
pub(crate) static RECORD_PEEK: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_PEEK_LUA));
pub(crate) static FENCE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(FENCE_LUA));
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(EXTEND_LUA));
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_LUA));
static RELEASE_IN_DB: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_IN_DB_LUA));
pub(crate) static RELEASE_UNFLAGGED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RELEASE_UNFLAGGED_LUA));
pub(crate) static EXTEND_BATCH: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(EXTEND_BATCH_LUA));

/// One call, encoded once and sent to every node.
pub(crate) enum Call {
    /// A Lua script by `EVALSHA`, with the arguments kept for the `EVAL` fallback.
    Script {
        script: &'static LuaScript,
        evalsha: Cmd,
        key: Arc<str>,
        args: Vec<String>,
    },
    /// Spec step 2, the acquire: `SET key token NX PX ttl` alone. Only when
    /// `SET` refused does the node get `PTTL` and `TYPE` of `key`, so a
    /// refusal still says how long the holder has left and whether the key is
    /// a foreign non-string value, at the cost of a second round trip; the
    /// common path, a free key, costs each node one command instead of three
    /// (BENCHMARKS.md, "Client and server CPU per lock").
    Set { set: Cmd, key: Arc<str> },
    /// An acquire pipelined with more commands, in one round trip: a fencing
    /// lock's (the same `SET`, `PTTL` and `TYPE`, then its reads, which must
    /// follow the `SET`), and a waiter's (the waiters flag first, see
    /// [`Call::waiting_acquire`]). The first `skip` replies (the flag's) are
    /// not part of the answer.
    Acquire { pipeline: Pipeline, skip: usize },
    /// A Lua script over several keys (the fence: the lock key and its
    /// counter), both forms built up front: `EVALSHA`, and the `EVAL` fallback.
    Keys { evalsha: Cmd, eval: Cmd },
    /// The release script for `key` and `token`, which announces the delete
    /// on a channel of the node's own database. `evalsha` is encoded once
    /// for database 0, what nearly every node uses; a node of another
    /// database sends `RELEASE_IN_DB_LUA`, encoded for it (`release_evalsha`).
    Release {
        key: Arc<str>,
        token: Arc<str>,
        evalsha: Cmd,
    },
    /// The release script of a multi-resource lock (`RELEASE_MANY_LUA`),
    /// encoded per node.
    ReleaseMany { many: Arc<Many>, token: String },
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
    pub(crate) fn release(key: Arc<str>, token: Arc<str>) -> Self {
        let evalsha = release_evalsha(&key, &token, 0);
        Call::Release {
            key,
            token,
            evalsha,
        }
    }

    /// The acquire's `SET` for `key`, `token` and `ttl_ms`.
    pub(crate) fn acquire(key: &Arc<str>, token: &str, ttl_ms: u128) -> Self {
        Call::Set {
            set: set_nx(key, token, ttl_ms),
            key: Arc::clone(key),
        }
    }

    /// The acquire pipeline of a fencing lock: the same `SET`, `PTTL` and
    /// `TYPE`, then (fencing step 1) the key's fence counter and the node's
    /// `TIME`. Read after the `SET` on the same connection, so after any fence
    /// of an earlier holder whose key the `SET` found gone.
    pub(crate) fn fenced_acquire(key: &str, token: &str, ttl_ms: u128, fence_key: &[u8]) -> Self {
        Self::acquire_pipeline(key, token, ttl_ms, Some(fence_key), None)
    }

    /// A waiter's acquire: the key's waiters flag is set for `flag_ms` (or
    /// kept, if it lives longer) before the `SET`, in the same round trip,
    /// so that a release that runs on this node after the `SET` was refused
    /// finds the flag and announces itself (`RELEASE_LUA`). A waiter usually
    /// finds the key held, so its `PTTL` and `TYPE` come in the same round
    /// trip too. `fence_key` as for [`Call::fenced_acquire`].
    pub(crate) fn waiting_acquire(
        key: &str,
        token: &str,
        ttl_ms: u128,
        fence_key: Option<&[u8]>,
        flag_ms: u64,
    ) -> Self {
        Self::acquire_pipeline(key, token, ttl_ms, fence_key, Some(flag_ms))
    }

    fn acquire_pipeline(
        key: &str,
        token: &str,
        ttl_ms: u128,
        fence_key: Option<&[u8]>,
        flag_ms: Option<u64>,
    ) -> Self {
        let mut pipeline = redis::pipe();
        let mut skip = 0;
        if let Some(ms) = flag_ms {
            push_flag(&mut pipeline, key, ms);
            skip = FLAG_COMMANDS;
        }
        pipeline
            .add_command(set_nx(key, token, ttl_ms))
            .cmd("PTTL")
            .arg(key)
            .cmd("TYPE")
            .arg(key);
        if let Some(fence_key) = fence_key {
            pipeline.cmd("GET").arg(fence_key).cmd("TIME");
        }
        Call::Acquire { pipeline, skip }
    }

    /// The waiters flags of `keys`, set for `flag_ms` (or kept, if they live
    /// longer), alone: a multi-resource waiter's, sent and answered before
    /// its attempt's script (see [`Call::waiting_acquire`]).
    pub(crate) fn waiters_flags(keys: &[Arc<str>], flag_ms: u64) -> Self {
        let mut pipeline = redis::pipe();
        for key in keys {
            push_flag(&mut pipeline, key, flag_ms);
        }
        Call::Acquire { pipeline, skip: 0 }
    }

    /// `EVALSHA sha <keys> keys.. args..`, and its `EVAL` fallback.
    pub(crate) fn keys(script: &'static LuaScript, keys: &[&[u8]], args: &[&[u8]]) -> Self {
        let (evalsha, eval) = keys_cmds(script, keys, args);
        Call::Keys { evalsha, eval }
    }
}

/// `EVALSHA sha <keys> keys.. args..` and `EVAL body <keys> keys.. args..`.
pub(super) fn keys_cmds<K, A>(script: &LuaScript, keys: &[K], args: &[A]) -> (Cmd, Cmd)
where
    K: redis::ToRedisArgs,
    A: redis::ToRedisArgs,
{
    let build = |name: &str, first: &str| {
        let mut cmd = redis::cmd(name);
        cmd.arg(first).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    (build("EVALSHA", &script.sha), build("EVAL", script.body))
}

/// How many commands set one waiters flag ([`push_flag`]).
const FLAG_COMMANDS: usize = 2;

/// Sets `key`'s waiters flag for `ms`: created if absent, else lengthened if
/// shorter, so that of several waiters the one that waits longest keeps it.
fn push_flag(pipeline: &mut Pipeline, key: &str, ms: u64) {
    let flag = crate::wake::waiters_flag(key);
    let ms = ms.max(1);
    pipeline
        .cmd("SET")
        .arg(&flag)
        .arg(1)
        .arg("NX")
        .arg("PX")
        .arg(ms)
        .cmd("PEXPIRE")
        .arg(&flag)
        .arg(ms)
        .arg("GT");
}

/// Spec step 2's `SET key token NX PX ttl`.
fn set_nx(key: &str, token: &str, ttl_ms: u128) -> Cmd {
    let mut cmd = redis::cmd("SET");
    // `u128` is no `ToRedisArgs`; a TTL is checked to fit a `u64` earlier.
    let ttl_ms = u64::try_from(ttl_ms).unwrap_or(u64::MAX);
    cmd.arg(key).arg(token).arg("NX").arg("PX").arg(ttl_ms);
    cmd
}

/// The release's `EVALSHA` as node database `db` runs it: the key and its
/// waiters flag, the token, and for a database other than 0 the database
/// (for the channel).
pub(super) fn release_evalsha(key: &str, token: &str, db: i64) -> Cmd {
    release_cmd("EVALSHA", key, token, db)
}

/// The release's `EVAL`, after `NOSCRIPT`.
pub(super) fn release_eval(key: &str, token: &str, db: i64) -> Cmd {
    release_cmd("EVAL", key, token, db)
}

fn release_cmd(name: &str, key: &str, token: &str, db: i64) -> Cmd {
    let script = if db == 0 { &*RELEASE } else { &*RELEASE_IN_DB };
    let mut cmd = redis::cmd(name);
    cmd.arg(if name == "EVAL" {
        script.body
    } else {
        script.sha.as_str()
    })
    .arg(1)
    .arg(key)
    .arg(token);
    if db != 0 {
        cmd.arg(db);
    }
    cmd
}

/// The release without the waiters flag (`RELEASE_UNFLAGGED_LUA`), by
/// `EVALSHA` and `EVAL`, for a user whose ACL refuses the flag's key.
pub(super) fn release_unflagged(key: &str, token: &str, db: i64) -> (Cmd, Cmd) {
    keys_cmds(
        &RELEASE_UNFLAGGED,
        &[key],
        &[token.to_owned(), crate::wake::channel(db, key)],
    )
}

/// `EVAL body 1 key args..`: the fallback after `NOSCRIPT` (a restarted or flushed
/// node). It also loads the script for the next `EVALSHA`.
pub(super) fn eval(script: &LuaScript, key: &str, args: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.body).arg(1).arg(key).arg(args);
    cmd
}

/// Acquire of a multi-resource lock (spec step 2 over several keys): every
/// lock key (`KEYS[1..n]`, `n = ARGV[3]`) is set to the token `ARGV[1]` for
/// `ARGV[2]` ms, only if none of them exists: all or none on this node, so a
/// node counts for the quorum only with every key. A refusal names the first
/// key found (1-based), its `PTTL` and its `TYPE`, as the single-key pipeline
/// does: `{0, i, pttl, type}`. A fenced acquire passes the keys' fence
/// counters as `KEYS[n+1..2n]` and reads them, and the node's `TIME`, after
/// the `SET`s (fencing step 1): `{1, time, counter_1, ..}`; unfenced, `{1}`.
/// Checked first and set after, inside one script, so nothing runs between.
const ACQUIRE_MANY_LUA: &str = r#"
local n = tonumber(ARGV[3])
for i = 1, n do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' then
    return {0, i, redis.call('PTTL', KEYS[i]), t}
  end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
if #KEYS == n then
  return {1}
end
local r = {1, redis.call('TIME')}
for i = n + 1, #KEYS do
  r[#r + 1] = redis.call('GET', KEYS[i]) or false
end
return r
"#;

/// Extend of a multi-resource lock: compare-and-pexpire, where the node
/// agrees only if every key still holds the token; then all of them get the
/// new expiry, else none.
const EXTEND_MANY_LUA: &str = r#"
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
"#;

/// Release of a multi-resource lock: compare-and-delete of every key that
/// still holds the token (`KEYS[i]`), each with its waiters flag (named here,
/// as in [`RELEASE_LUA`]), each delete announced on its key's channel as
/// `RELEASE_LUA` does, only where the flag was there (the database as
/// `ARGV[2]`). A key that no longer holds the token (expired, taken, a
/// foreign type: `pcall`) is left alone and the others are still released.
/// Answers 1 if it deleted any.
const RELEASE_MANY_LUA: &str = concat!(
    r#"
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    if redis.call('DEL', KEYS[i], KEYS[i] .. '"#,
    waiters_suffix!(),
    r#"') > 1 then
      redis.pcall('PUBLISH', 'redlock:released:' .. ARGV[2] .. ':' .. KEYS[i], '1')
    end
    deleted = 1
  end
end
return deleted
"#
);

/// [`RELEASE_MANY_LUA`] without the flags, every delete announced: for a user
/// whose ACL refuses the flags' keys (as [`RELEASE_UNFLAGGED_LUA`]).
const RELEASE_MANY_UNFLAGGED_LUA: &str = r#"
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    redis.pcall('PUBLISH', 'redlock:released:' .. ARGV[2] .. ':' .. KEYS[i], '1')
    deleted = 1
  end
end
return deleted
"#;

pub(crate) static ACQUIRE_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(ACQUIRE_MANY_LUA));
pub(crate) static EXTEND_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(EXTEND_MANY_LUA));
static RELEASE_MANY: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_MANY_LUA));
static RELEASE_MANY_UNFLAGGED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RELEASE_MANY_UNFLAGGED_LUA));

impl Call {
    /// The acquire of a multi-resource lock: `ACQUIRE_MANY_LUA` over its
    /// keys, and with `fence_keys` (a fencing lock) their counters.
    pub(crate) fn acquire_many(
        many: &Many,
        token: &str,
        ttl_ms: u128,
        fence_keys: Option<Vec<Vec<u8>>>,
    ) -> Self {
        let mut keys: Vec<&[u8]> = many.keys.iter().map(|k| k.as_bytes()).collect();
        if let Some(fence_keys) = &fence_keys {
            keys.extend(fence_keys.iter().map(Vec::as_slice));
        }
        let (ttl, n) = (ttl_ms.to_string(), many.keys.len().to_string());
        Call::keys(
            &ACQUIRE_MANY,
            &keys,
            &[token.as_bytes(), ttl.as_bytes(), n.as_bytes()],
        )
    }

    /// The extend (compare-and-pexpire) of every key of a multi-resource lock.
    pub(crate) fn extend_many(many: &Many, token: &str, ttl_ms: u128) -> Self {
        let keys: Vec<&[u8]> = many.keys.iter().map(|k| k.as_bytes()).collect();
        Call::keys(
            &EXTEND_MANY,
            &keys,
            &[token.as_bytes(), ttl_ms.to_string().as_bytes()],
        )
    }

    /// The release (compare-and-delete) of the lock's keys held with `token`.
    pub(crate) fn release_keys(keys: Keys, token: Arc<str>) -> Self {
        match keys {
            Keys::One(key) => Call::release(key, token),
            Keys::Many(many) => Call::ReleaseMany {
                many,
                token: token.to_string(),
            },
        }
    }
}

/// A multi-resource release's `EVALSHA` and `EVAL` as node `db` runs them.
pub(super) fn release_many_cmds(many: &Many, token: &str, db: i64) -> (Cmd, Cmd) {
    many_release_cmds(&RELEASE_MANY, many, token, db)
}

/// [`release_many_cmds`] without the flags, for a user whose ACL refuses them.
pub(super) fn release_many_unflagged_cmds(many: &Many, token: &str, db: i64) -> (Cmd, Cmd) {
    many_release_cmds(&RELEASE_MANY_UNFLAGGED, many, token, db)
}

fn many_release_cmds(script: &LuaScript, many: &Many, token: &str, db: i64) -> (Cmd, Cmd) {
    let keys: Vec<&str> = many.keys.iter().map(|k| &**k).collect();
    keys_cmds(script, &keys, &[token.to_owned(), db.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_hash_once_and_match_redis() {
        assert_eq!(RELEASE.sha, redis::Script::new(RELEASE_LUA).get_hash());
        assert_eq!(RELEASE.sha.len(), 40);
        assert_ne!(EXTEND.sha, RELEASE.sha);
        assert_ne!(RELEASE_UNFLAGGED.sha, RELEASE.sha);
        assert_ne!(RELEASE_IN_DB.sha, RELEASE.sha);
    }
}
