//! The idempotency record's scripts (node layer, `idempotency` feature):
//! write, read, fast read and generation, each run only under the writer's
//! lock token.

use std::sync::LazyLock;

use super::scripts::LuaScript;

/// The idempotency record's write: sets the record (`KEYS[2]`) to `ARGV[2]`
/// for `ARGV[3]` ms, only while the lock key (`KEYS[1]`) still holds the
/// writer's token `ARGV[1]`. A holder whose key expired here, and perhaps
/// went to another holder, writes nothing on this node.
const RECORD_PUT_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"#;

/// The idempotency record's read.
const RECORD_GET_LUA: &str = "return redis.call('GET', KEYS[1])";

/// The idempotency record's fast read, with the lock key's value read in the
/// same step: `{record, lock value}`. A node whose lock key already holds the
/// reader's token answered under the reader's lock (see `RedisStore::peek`).
/// A lock key of another type reads as no holder.
const RECORD_PEEK_LUA: &str = r#"
local holder = redis.pcall('GET', KEYS[2])
if type(holder) ~= 'string' then holder = false end
return {redis.call('GET', KEYS[1]), holder}
"#;

/// The idempotency key's generation, taken by a holder before it runs the
/// work: only while the lock key (`KEYS[1]`) still holds the holder's token
/// `ARGV[1]`, the counter `KEYS[2]` is set to the largest of one more than
/// itself, the node's clock in whole seconds times 2^20 (`TIME`), and
/// `ARGV[3]` (the holder's generation, when it raises a node that lagged
/// behind), and expires after `ARGV[2]` ms. Returns the counter, or `false`
/// where the lock is not the holder's. See `RedisStore::generation`, which
/// says why the clock keeps the order once a counter has expired.
///
/// The counter is read and written as a decimal string formatted by
/// `%.0f`: it stays below 2^53 (the clock part until the year 2242), where
/// Lua's numbers (doubles) are exact, and `tostring` would write a large
/// number in exponent form.
const RECORD_GENERATION_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return false
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local now = redis.call('TIME')
local g = math.max(c + 1, tonumber(now[1]) * 1048576, tonumber(ARGV[3]))
redis.call('SET', KEYS[2], string.format('%.0f', g), 'PX', ARGV[2])
return g
"#;

pub(crate) static RECORD_GENERATION: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_GENERATION_LUA));
pub(crate) static RECORD_PUT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_PUT_LUA));
pub(crate) static RECORD_GET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_GET_LUA));
pub(crate) static RECORD_PEEK: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RECORD_PEEK_LUA));
