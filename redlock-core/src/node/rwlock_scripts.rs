//! The read/write lock's acquire scripts (`rwlock/`), one atomic step per
//! node each. The keys of one resource: the writer key (the resource's own
//! lock key, so a writer is a mutex holder to every other step), the writers'
//! intent, the readers' index, and one key per reader. A reader's key holds
//! its token with its own expiry (`PX`, the node's clock), so the mutex's
//! compare-and-delete and compare-and-pexpire release and extend it; the
//! index lists the reader keys for the write acquire to check.
//!
//! The read/write lock's turns (issue 48) take two more keys: the readers
//! *waiting* (a hash: reader id to `<window ms>:<tag>`, the tag empty for a
//! reader a writer key refused, else the id of the writer whose intent
//! refused it) and the *read phase* (a hash of the reader ids it admits,
//! with the hand-off window's expiry). A reader is *owed* a read phase when
//! its tag is empty or no longer the intent's writer; an acquire that finds
//! the writer key gone and owed readers opens a phase, moving them into it.
//! While an intent stands, only the phase's readers are admitted, and no
//! writer is while a phase is open: the readers a writer held back go
//! before the next writer, and readers that came after a waiting writer
//! (behind its intent) go after it. A writer that holds runs
//! [`WRITER_HELD_LUA`] on every node (the readers marked there waited
//! through its phase: all owed now); a waiting reader that holds or gives up runs
//! [`READER_HELD_LUA`] (its marks and its place in the phase go, and the
//! phase ends once every reader it admits has held, else at its expiry).
//!
//! The acquires answer as `ACQUIRE_MANY_LUA` does (`parse_acquire_many`):
//! `{1}` (a fenced writer: `{1, time, counter}`), or `{0, i, pttl, type}` for
//! what was in the way.

use std::sync::LazyLock;

use super::scripts::{Call, LuaScript};

/// The Lua function `open_phase(intent)` of the acquires (`KEYS[4]` the
/// waiting readers, `KEYS[5]` the read phase): moves the owed readers from
/// the waiting ones into a new read phase that expires after the longest of
/// their hand-off windows; whether it opened one. `intent` is the intent's writer id,
/// `false` without one, `nil` to read it here (only when readers wait).
macro_rules! open_phase_lua {
    () => {
        r#"
local function open_phase(intent)
  local all = redis.call('HGETALL', KEYS[4])
  if #all == 0 then return false end
  if intent == nil then intent = redis.call('GET', KEYS[2]) end
  local owed, window = {}, 0
  for i = 1, #all, 2 do
    local w, tag = string.match(all[i + 1], '^(%d+):(.*)$')
    if w and tag ~= intent then
      owed[#owed + 1] = all[i]
      window = math.max(window, tonumber(w))
    end
  end
  if #owed == 0 then return false end
  redis.call('HDEL', KEYS[4], unpack(owed))
  local members = {}
  for _, id in ipairs(owed) do
    members[#members + 1] = id
    members[#members + 1] = '1'
  end
  redis.call('HSET', KEYS[5], unpack(members))
  redis.call('PEXPIRE', KEYS[5], math.max(window, 1))
  return true
end
"#
    };
}

/// Read acquire: `KEYS` = writer key, intent, index, waiting readers, read
/// phase, this reader's key; `ARGV` = token, TTL in ms, the reader's id (the
/// same for all its attempts), its hand-off window in ms, how long its mark
/// lives in ms (`0`: it will not try again, so it leaves none). Refused while
/// a writer holds (the reader is marked owed), or while a writer waits (its
/// intent: writer preference) unless the reader is in the open read phase,
/// after opening one if none is open and readers are owed; refused there,
/// it is marked behind that writer (an owed mark stays owed). Else the
/// reader's key is set with its own TTL and listed in the index. Up to
/// three listed readers are checked at random and dropped from the index if
/// their keys are gone, so that readers that died unreleased do not pile up
/// between writers. The index lives at least as long as the reader's key
/// (`list_reader`): here, and in every extend of a reader's key
/// (`EXTEND_READER_LUA`, the batch script's renewal code), so a writer sees every live
/// reader and no index outlives its readers by more than their TTL. A
/// reader's release takes it off the index (`RELEASE_LUA`), and Redis
/// deletes the set once it is empty.
const READ_ACQUIRE_LUA: &str = concat!(
    reader_index_lua!(),
    open_phase_lua!(),
    r#"
local function refused(tag, i, key, ty)
  if ARGV[5] ~= '0' then
    local old = tag ~= '' and redis.call('HGET', KEYS[4], ARGV[3])
    if not (old and string.sub(old, -1) == ':') then
      redis.call('HSET', KEYS[4], ARGV[3], ARGV[4] .. ':' .. tag)
    end
    if redis.call('PTTL', KEYS[4]) < tonumber(ARGV[5]) then
      redis.call('PEXPIRE', KEYS[4], ARGV[5])
    end
  end
  return {0, i, redis.call('PTTL', key), ty}
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t ~= 'string' then
    return {0, 1, redis.call('PTTL', KEYS[1]), t}
  end
  return refused('', 1, KEYS[1], t)
end
local intent = redis.call('GET', KEYS[2])
if intent then
  if redis.call('EXISTS', KEYS[5]) == 0 then open_phase(intent) end
  if redis.call('HEXISTS', KEYS[5], ARGV[3]) == 0 then
    return refused(intent, 2, KEYS[2], 'string')
  end
end
for _, r in ipairs(redis.call('SRANDMEMBER', KEYS[3], 3)) do
  if redis.call('EXISTS', r) == 0 then
    redis.call('SREM', KEYS[3], r)
  end
end
redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[2])
list_reader(KEYS[3], KEYS[6], ARGV[2])
return {1}
"#
);

/// Write acquire: `KEYS` = writer key, intent, index, waiting readers, read
/// phase, and for a fenced lock the writer key's fence counter; `ARGV` =
/// token, TTL in ms, the writer's id (the same for all its attempts), the
/// intent's TTL in ms. Refused while another writer holds, while a read
/// phase is open or owed readers wait (it opens their phase), or while any
/// listed reader's key is still there (listed keys that are gone are
/// dropped); a refused writer leaves its intent (or renews its own), which
/// refuses new readers. The intent is not deleted here: a failed attempt
/// must not lift it; the writer deletes it once it holds
/// ([`WRITER_HELD_LUA`]) or gives up (`rwlock/`), or it expires.
const WRITE_ACQUIRE_LUA: &str = concat!(
    open_phase_lua!(),
    r#"
local function intend()
  if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4]) then
    if redis.call('GET', KEYS[2]) == ARGV[3] then
      redis.call('PEXPIRE', KEYS[2], ARGV[4])
    end
  end
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t == 'string' then intend() end
  return {0, 1, redis.call('PTTL', KEYS[1]), t}
end
if redis.call('EXISTS', KEYS[5]) == 1 or open_phase(nil) then
  intend()
  return {0, 5, redis.call('PTTL', KEYS[5]), 'string'}
end
local longest = -2
for _, r in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local p = redis.call('PTTL', r)
  if p == -2 then
    redis.call('SREM', KEYS[3], r)
  elseif p == -1 or p > longest then
    longest = p
  end
end
if longest ~= -2 then
  intend()
  return {0, 3, longest, 'string'}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if #KEYS == 5 then
  return {1}
end
return {1, redis.call('TIME'), redis.call('GET', KEYS[6]) or false}
"#
);

/// A writer holds (its quorum): `KEYS` = intent, waiting readers; `ARGV` =
/// the writer's id. Its intent has done its work (its key keeps readers out
/// now) and goes where it is still its own; every reader marked here waited
/// through this writer's phase, behind whichever writer's intent, and is
/// owed the read phase after it. Run once the writer holds, not in its
/// acquire's OK: an attempt that took this node and lost elsewhere must not
/// let the readers behind a waiting writer pass it. No announcement: the
/// readers refused by the intent are refused by the writer key now, and are
/// woken by its release.
pub(crate) const WRITER_HELD_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
local all = redis.call('HGETALL', KEYS[2])
if #all > 0 then
  local marks = {}
  for i = 1, #all, 2 do
    marks[#marks + 1] = all[i]
    marks[#marks + 1] = string.match(all[i + 1], '^%d+:') or '0:'
  end
  redis.call('HSET', KEYS[2], unpack(marks))
end
return 1
"#;

/// A reader that waited holds (its quorum), or gives up: `KEYS` = waiting
/// readers, read phase; `ARGV` = the reader's id. Its mark and its place in
/// the read phase go: the phase ends once every reader it admits has held
/// or gone, instead of at its expiry. Not in the acquire's OK either: an attempt admitted here and
/// refused elsewhere keeps its place for the next one.
pub(crate) const READER_HELD_LUA: &str = r#"
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"#;

static READ_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(READ_ACQUIRE_LUA));
static WRITE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(WRITE_ACQUIRE_LUA));
static WRITER_HELD: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(WRITER_HELD_LUA));
static READER_HELD: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(READER_HELD_LUA));

/// The keys of one resource's read/write lock on a node.
pub(crate) struct RwKeys<'a> {
    /// The writer key: the resource's lock key.
    pub(crate) writer: &'a str,
    pub(crate) intent: &'a str,
    pub(crate) index: &'a str,
    /// The readers waiting for a read phase.
    pub(crate) waiting: &'a str,
    /// The open read phase.
    pub(crate) phase: &'a str,
}

impl Call {
    /// A reader's acquire of `reader` (its own key) with `token` for
    /// `ttl_ms`, as reader `reader_id` (the same for all its attempts) with
    /// a hand-off window of `window_ms`, whose mark lives `mark_ms` (zero:
    /// it will not try again, and leaves none).
    pub(crate) fn read_acquire(
        keys: &RwKeys<'_>,
        reader: &str,
        token: &str,
        ttl_ms: u128,
        reader_id: &str,
        (window_ms, mark_ms): (u128, u128),
    ) -> Self {
        let ttl = ttl_ms.to_string();
        let (window, mark) = (window_ms.max(1).to_string(), mark_ms.to_string());
        Call::keys(
            &READ_ACQUIRE,
            &[
                keys.writer.as_bytes(),
                keys.intent.as_bytes(),
                keys.index.as_bytes(),
                keys.waiting.as_bytes(),
                keys.phase.as_bytes(),
                reader.as_bytes(),
            ],
            &[
                token.as_bytes(),
                ttl.as_bytes(),
                reader_id.as_bytes(),
                window.as_bytes(),
                mark.as_bytes(),
            ],
        )
    }

    /// A writer's acquire with `token` for `ttl_ms`, as writer `writer_id`
    /// whose intent lives `intent_ms`; with `fence_key`, it reads the
    /// counter and the node's `TIME` once the key is set (fencing step 1).
    pub(crate) fn write_acquire(
        keys: &RwKeys<'_>,
        token: &str,
        ttl_ms: u128,
        writer_id: &str,
        intent_ms: u128,
        fence_key: Option<&[u8]>,
    ) -> Self {
        let mut k: Vec<&[u8]> = vec![
            keys.writer.as_bytes(),
            keys.intent.as_bytes(),
            keys.index.as_bytes(),
            keys.waiting.as_bytes(),
            keys.phase.as_bytes(),
        ];
        k.extend(fence_key);
        let (ttl, intent) = (ttl_ms.to_string(), intent_ms.max(1).to_string());
        Call::keys(
            &WRITE_ACQUIRE,
            &k,
            &[
                token.as_bytes(),
                ttl.as_bytes(),
                writer_id.as_bytes(),
                intent.as_bytes(),
            ],
        )
    }

    /// [`WRITER_HELD_LUA`]: writer `writer_id` holds.
    pub(crate) fn writer_held(keys: &RwKeys<'_>, writer_id: &str) -> Self {
        Call::keys(
            &WRITER_HELD,
            &[keys.intent.as_bytes(), keys.waiting.as_bytes()],
            &[writer_id.as_bytes()],
        )
    }

    /// [`READER_HELD_LUA`]: reader `reader_id`, which waited, holds.
    pub(crate) fn reader_held(keys: &RwKeys<'_>, reader_id: &str) -> Self {
        Call::keys(
            &READER_HELD,
            &[keys.waiting.as_bytes(), keys.phase.as_bytes()],
            &[reader_id.as_bytes()],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script touches only the keys its call declares (a Redis
    /// Cluster runs a script's keys by their slot): the acquires six (the
    /// writer's sixth is its fence counter), the *held* calls two.
    #[test]
    fn the_turns_scripts_touch_only_their_declared_keys() {
        for (lua, keys) in [
            (READ_ACQUIRE_LUA, 6),
            (WRITE_ACQUIRE_LUA, 6),
            (WRITER_HELD_LUA, 2),
            (READER_HELD_LUA, 2),
        ] {
            assert!(lua.contains(&format!("KEYS[{keys}]")), "{lua}");
            assert!(!lua.contains(&format!("KEYS[{}]", keys + 1)), "{lua}");
        }
    }
}
