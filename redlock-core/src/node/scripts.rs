//! The commands and Lua scripts a node runs, encoded once per operation and
//! sent to every node: the acquire pipeline (spec step 2), compare-and-pexpire
//! (extend), compare-and-delete (release) and the fence (fencing step 3).

use std::sync::{Arc, LazyLock};

use redis::{Cmd, Pipeline};

pub(crate) use super::lua::{LuaScript, keys_cmds};
use super::release_scripts::{Announce, release_evalsha};
use crate::keys::Many;

/// Extend: compare-and-pexpire. Only the token's owner may push the expiry.
pub(super) const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// A read share's or a permit's extend (`rwlock/`, `semaphore/`):
/// [`EXTEND_LUA`], and the reader's index or the permit count kept alive as
/// long as the key (`reader_index_lua`), so that a writer still finds a
/// reader whose key outlived the expiry its acquire gave the index, and a
/// client with another count is refused while a permit is held. Never
/// replaced by a native `SET … IFEQ`, which could not touch them
/// (`native.rs` replaces [`EXTEND`] only).
const EXTEND_READER_LUA: &str = concat!(
    reader_index_lua!(),
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local r = redis.call('PEXPIRE', KEYS[1], ARGV[2])
  keep_companion(KEYS[1], ARGV[2])
  return r
end
return 0
"#
);

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

pub(crate) static FENCE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(FENCE_LUA));
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(EXTEND_LUA));
pub(crate) static EXTEND_READER: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(EXTEND_READER_LUA));

/// How a script over several locks' keys is cut by slot and put together.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    /// The batch script (`node/coalesce.rs`, [`BATCH`](super::BATCH)) of
    /// the batched renewal: `KEYS[i]` with `ARGV[2i-1]`, `ARGV[2i]`; a flag
    /// per key. A slot whose script failed reads as "not extended" there.
    ExtendBatch,
    /// `ACQUIRE_MANY_LUA`: `n` lock keys, then as many fence counters when
    /// `fenced`; `ARGV` token, TTL, `n`.
    AcquireMany {
        fenced: bool,
    },
    /// `EXTEND_MANY_LUA` and the multi-resource release: every key, the
    /// same `ARGV`. Extend: 1 only if every slot said 1. Release: 1 if any
    /// slot deleted.
    AllOf,
    AnyOf,
}

/// A script over several locks' keys, kept whole so that a cluster node can
/// cut it by slot.
pub(crate) struct PerSlot {
    pub(crate) script: &'static LuaScript,
    pub(crate) shape: Shape,
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) args: Vec<Vec<u8>>,
}

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
    /// (BENCHMARKS.md at 9debf85, "Client and server CPU per lock").
    Set {
        set: Cmd,
        key: Arc<str>,
        token: Arc<str>,
        ttl_ms: u64,
    },
    /// An acquire pipelined with more commands, in one round trip: a fencing
    /// lock's (the same `SET`, `PTTL` and `TYPE`, then its reads, which must
    /// follow the `SET`), and a waiter's (the waiters flag first, see
    /// [`Call::waiting_acquire`]). The first `skip` replies (the flag's) and
    /// the last `tail` (a mutex waiter's name) are not part of the answer.
    Acquire {
        pipeline: Pipeline,
        skip: usize,
        tail: usize,
    },
    /// A Lua script over several keys (the fence: the lock key and its
    /// counter), both forms built up front: `EVALSHA`, and the `EVAL` fallback.
    /// Scripts over several locks' keys keep them whole (`per_slot`), so
    /// that a cluster node runs one script per slot (`per_slot.rs`).
    Keys {
        evalsha: Cmd,
        eval: Cmd,
        per_slot: Option<Box<PerSlot>>,
    },
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
        let evalsha = release_evalsha(&key, &token, Announce::Publish { db: 0 });
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
            token: token.into(),
            // `u128` is no `ToRedisArgs`; a TTL is checked to fit a `u64` earlier.
            ttl_ms: u64::try_from(ttl_ms).unwrap_or(u64::MAX),
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
    ///
    /// With `name` (a mutex waiter's, `keys::Named`), a script after the
    /// `SET` names the waiter on the flag if it did not take the key there
    /// and is the most patient, and names nobody in its place if it did
    /// ([`NAME_FLAG_LUA`]).
    pub(crate) fn waiting_acquire(
        key: &str,
        token: &str,
        ttl_ms: u128,
        fence_key: Option<&[u8]>,
        flag_ms: u64,
        name: Option<&str>,
    ) -> Self {
        Self::acquire_pipeline(key, token, ttl_ms, fence_key, Some((flag_ms, name)))
    }

    fn acquire_pipeline(
        key: &str,
        token: &str,
        ttl_ms: u128,
        fence_key: Option<&[u8]>,
        flag: Option<(u64, Option<&str>)>,
    ) -> Self {
        let mut pipeline = redis::pipe();
        let mut skip = 0;
        let mut named = None;
        if let Some((ms, name)) = flag {
            skip = push_flag(&mut pipeline, key, ms);
            named = name.map(|n| (n, ms));
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
        let mut tail = 0;
        if let Some((name, ms)) = named {
            // After the `SET`: the name goes on the flag unless the attempt
            // took the key there ([`NAME_FLAG_LUA`]). `EVAL`, not
            // `EVALSHA`: a pipeline cannot fall back after `NOSCRIPT`.
            let flag = crate::keys::waiters_flag(key);
            pipeline
                .cmd("EVAL")
                .arg(NAME_FLAG_LUA)
                .arg(2)
                .arg(&flag)
                .arg(key)
                .arg(name)
                .arg(ms.max(1))
                .arg(token);
            tail = 1;
        }
        Call::Acquire {
            pipeline,
            skip,
            tail,
        }
    }

    /// The waiters flags of `keys`, set for `flag_ms` (or kept, if they live
    /// longer), alone: a multi-resource waiter's, sent and answered before
    /// its attempt's script (see [`Call::waiting_acquire`]).
    pub(crate) fn waiters_flags(keys: &[Arc<str>], flag_ms: u64) -> Self {
        let mut pipeline = redis::pipe();
        for key in keys {
            push_flag(&mut pipeline, key, flag_ms);
        }
        Call::Acquire {
            pipeline,
            skip: 0,
            tail: 0,
        }
    }

    /// `EVALSHA sha <keys> keys.. args..`, and its `EVAL` fallback.
    pub(crate) fn keys(script: &'static LuaScript, keys: &[&[u8]], args: &[&[u8]]) -> Self {
        let (evalsha, eval) = keys_cmds(script, keys, args);
        Call::Keys {
            evalsha,
            eval,
            per_slot: None,
        }
    }
}

/// Sets `key`'s waiters flag for `ms`: created (naming nobody, `1`) if
/// absent, else lengthened if shorter, so that of several waiters the one
/// that waits longest keeps it. Returns how many commands it added.
fn push_flag(pipeline: &mut Pipeline, key: &str, ms: u64) -> usize {
    let flag = crate::keys::waiters_flag(key);
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
    2
}

/// A mutex waiter's name in its key's flag (`wait/`, issue 48 item 7):
/// `KEYS[1]` names `ARGV[1]` (a `keys::Named` value) if it named nobody or
/// a waiter that left fewer turns (the turns are the 8 hex digits after the
/// id, so their text orders as their number), and lives `ARGV[2]` ms or
/// longer. So each node's flag names its most patient waiter.
///
/// Run after an attempt's `SET` (`KEYS[2]` its lock key, `ARGV[3]` its
/// token): if the attempt took the key there, the waiter waits no more, and
/// a flag naming it (its id, the first 17 characters) names nobody instead
/// (`1`); the flag keeps its expiry. Run by a deferring waiter, with the
/// flag alone.
const NAME_FLAG_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if #KEYS > 1 and redis.call('GET', KEYS[2]) == ARGV[3] then
  if v and string.sub(v, 1, 17) == string.sub(ARGV[1], 1, 17) then
    redis.call('SET', KEYS[1], '1', 'KEEPTTL')
  end
  return 0
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == '1' or (string.byte(v) == 119 and string.sub(v, 18, 25) < string.sub(ARGV[1], 18, 25)) then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
return 1
"#;

static NAME_FLAG: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(NAME_FLAG_LUA));

impl Call {
    /// A deferring mutex waiter's flag of `key`, naming it as `named` (a
    /// `keys::Named` value) for `flag_ms` ([`NAME_FLAG_LUA`]).
    pub(crate) fn defer_flag(key: &str, named: &str, flag_ms: u64) -> Self {
        let flag = crate::keys::waiters_flag(key);
        Call::keys(
            &NAME_FLAG,
            &[flag.as_bytes()],
            &[named.as_bytes(), flag_ms.max(1).to_string().as_bytes()],
        )
    }
}

/// Spec step 2's `SET key token NX PX ttl`.
fn set_nx(key: &str, token: &str, ttl_ms: u128) -> Cmd {
    // Sized up front: grown an argument at a time, its buffers were
    // reallocated four times per command.
    let mut cmd = Cmd::with_capacity(6, key.len().saturating_add(token.len()).saturating_add(32));
    // `u128` is no `ToRedisArgs`; a TTL is checked to fit a `u64` earlier.
    let ttl_ms = u64::try_from(ttl_ms).unwrap_or(u64::MAX);
    cmd.arg("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms);
    cmd
}

/// `EVAL body 1 key args..`: the fallback after `NOSCRIPT` (a restarted or flushed
/// node). It also loads the script for the next `EVALSHA`.
pub(super) fn eval(script: &LuaScript, key: &str, args: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.body).arg(1).arg(key).arg(args);
    cmd
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::*;

    #[test]
    fn extend_and_release_are_two_scripts() {
        assert_eq!(EXTEND.sha, redis::Script::new(EXTEND_LUA).get_hash());
        assert_ne!(EXTEND.sha, super::super::release_scripts::RELEASE.sha);
    }
}
