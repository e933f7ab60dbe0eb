//! The scripts and calls of a multi-resource lock (node layer): the
//! all-or-none acquire, and the extend and release of every key of a set.

use std::sync::{Arc, LazyLock};

use redis::Cmd;

use super::scripts::{Call, LuaScript, Shape, keys_cmds};
use crate::keys::{Keys, Many};

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
const RELEASE_MANY_LUA: &str = release_many_lua!("PUBLISH");

/// [`RELEASE_MANY_LUA`]'s text, announcing by `$publish`.
macro_rules! release_many_lua {
    ($publish:literal) => {
        concat!(
            r#"
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    local t = KEYS[i]
    if string.byte(t) ~= 123 then t = '{' .. t .. '}' else t = string.match(t, '^{[^}]*}') or t end
    if redis.call('DEL', KEYS[i], t .. '"#,
            waiters_suffix!(),
            r#"') > 1 then
      redis.pcall('"#,
            $publish,
            r#"', 'redlock:released:' .. ARGV[2] .. ':' .. t, '1')
    end
    deleted = 1
  end
end
return deleted
"#
        )
    };
}
use release_many_lua;

/// [`RELEASE_MANY_LUA`] without the flags, every delete announced: for a user
/// whose ACL refuses the flags' keys (as `release_unflagged_lua`).
const RELEASE_MANY_UNFLAGGED_LUA: &str = r#"
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    local t = KEYS[i]
    if string.byte(t) ~= 123 then t = '{' .. t .. '}' else t = string.match(t, '^{[^}]*}') or t end
    redis.pcall('PUBLISH', 'redlock:released:' .. ARGV[2] .. ':' .. t, '1')
    deleted = 1
  end
end
return deleted
"#;

pub(crate) static ACQUIRE_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(ACQUIRE_MANY_LUA));
pub(crate) static EXTEND_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(EXTEND_MANY_LUA));
pub(super) static RELEASE_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RELEASE_MANY_LUA));
/// [`RELEASE_MANY_LUA`] on a cluster node, run per slot (`per_slot.rs`):
/// every key of one run is of one slot, and so is each key's channel, which
/// `SPUBLISH` announces on (as `SHARD_RELEASE_LUA` in `release_scripts.rs`).
pub(super) static SHARD_RELEASE_MANY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(release_many_lua!("SPUBLISH")));
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
        Call::keys_per_slot(
            &ACQUIRE_MANY,
            &keys,
            &[token.as_bytes(), ttl.as_bytes(), n.as_bytes()],
            Shape::AcquireMany {
                fenced: fence_keys.is_some(),
            },
        )
    }

    /// The extend (compare-and-pexpire) of every key of a multi-resource lock.
    pub(crate) fn extend_many(many: &Many, token: &str, ttl_ms: u128) -> Self {
        let keys: Vec<&[u8]> = many.keys.iter().map(|k| k.as_bytes()).collect();
        Call::keys_per_slot(
            &EXTEND_MANY,
            &keys,
            &[token.as_bytes(), ttl_ms.to_string().as_bytes()],
            Shape::AllOf,
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
