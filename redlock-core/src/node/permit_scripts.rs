//! A permit slot's acquire script (`semaphore/`), one atomic step per node:
//! the semaphore's count is checked and kept on the node, then the slot is
//! taken as the mutex takes its key. Answered as `ACQUIRE_MANY_LUA` answers
//! (`parse_acquire_many`): `{1}` (fenced: `{1, time, counter}`), or
//! `{0, i, pttl, type}` for what was in the way; a count other than the
//! caller's is `{0, 2, pttl, 'redlock-permits:<n>'}`
//! ([`NodeError::PermitsMismatch`](crate::NodeError::PermitsMismatch)).

use std::sync::LazyLock;

use super::scripts::{Call, LuaScript};

/// `KEYS` = the slot's key, the semaphore's count key, the resource's
/// waiters flag, and for a fenced lock the slot's fence counter; `ARGV` =
/// token, TTL in ms, the caller's number of permits, the waiters flag's TTL
/// in ms (`0`: not a subscribed waiter's attempt).
///
/// The count: a node that holds another count refuses, and takes nothing;
/// else it keeps this count, alive at least as long as the slot's TTL (the
/// slots' extends keep it so too, `keep_companion`), so that while any
/// permit of the semaphore is held a client with another count is refused
/// (a rolling deploy from `permits(2)` to `permits(3)`, `redlock run
/// --permits 5` next to an application with 3). Once every permit is gone
/// the count expires and the next client's count holds.
///
/// The waiters flag is set (or kept, if it lives longer) before the slot is
/// tried, as a waiter's `SET` pipeline does (`Call::waiting_acquire`).
const PERMIT_ACQUIRE_LUA: &str = r#"
local c = redis.call('GET', KEYS[2])
if c and c ~= ARGV[3] then
  return {0, 2, redis.call('PTTL', KEYS[2]), 'redlock-permits:' .. c}
end
local p = redis.call('PTTL', KEYS[2])
if p == -2 then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
elseif p >= 0 and p < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
if ARGV[4] ~= '0' then
  local f = redis.call('PTTL', KEYS[3])
  if f < tonumber(ARGV[4]) and f ~= -1 then
    redis.call('SET', KEYS[3], 1, 'PX', ARGV[4])
  end
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  return {0, 1, redis.call('PTTL', KEYS[1]), t}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if #KEYS == 3 then
  return {1}
end
return {1, redis.call('TIME'), redis.call('GET', KEYS[4]) or false}
"#;

static PERMIT_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(PERMIT_ACQUIRE_LUA));

impl Call {
    /// A permit's attempt on `slot` with `token` for `ttl_ms`, as one of
    /// `permits` (count kept at `count`); `flag`: the resource's waiters flag
    /// and its TTL for a subscribed waiter; `fence_key`: the slot's fence
    /// counter for a fenced lock.
    pub(crate) fn permit_acquire(
        slot: &str,
        count: &str,
        (token, ttl_ms): (&str, u128),
        permits: u32,
        flag: (&str, u64),
        fence_key: Option<&[u8]>,
    ) -> Self {
        let mut k: Vec<&[u8]> = vec![slot.as_bytes(), count.as_bytes(), flag.0.as_bytes()];
        k.extend(fence_key);
        let (ttl, permits, flag_ms) = (ttl_ms.to_string(), permits.to_string(), flag.1.to_string());
        Call::keys(
            &PERMIT_ACQUIRE,
            &k,
            &[
                token.as_bytes(),
                ttl.as_bytes(),
                permits.as_bytes(),
                flag_ms.as_bytes(),
            ],
        )
    }
}
