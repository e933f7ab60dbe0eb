//! *Layer 1, values (see `lib.rs`).*
//!
//! Which keys a lock holds: one resource's, or several resources taken
//! together under one token ([`crate::Redlock::mutex_many`](crate::Redlock::mutex_many)).
//! Every step that sends a lock's keys (release, extend, the release of late
//! answers) takes a [`Keys`], so one path serves both.

use std::sync::Arc;

use crate::slots::{derived, tagged};

/// The most resources one lock may hold together. Each one is a key the
/// acquire script checks and sets on every node in one atomic step, so the
/// number bounds how long one script blocks a node.
pub const MAX_RESOURCES: usize = 64;

/// Several resources locked together: deduplicated, in the order of their
/// keys (the same set always gives the same order and the same label).
#[derive(Debug)]
pub(crate) struct Many {
    /// The resources, in key order.
    pub(crate) resources: Box<[Arc<str>]>,
    /// Their Redis keys, in the same order.
    pub(crate) keys: Box<[Arc<str>]>,
    /// What errors, spans and `Lock::resource` name the set by: `{a, b}`.
    pub(crate) label: Arc<str>,
}

/// The keys one lock holds.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    One(Arc<str>),
    Many(Arc<Many>),
}

impl Keys {
    /// The first key (the only one of a single-resource lock): the one the
    /// local waiter queue and the metrics go by.
    pub(crate) fn first(&self) -> &Arc<str> {
        match self {
            Keys::One(k) => k,
            Keys::Many(m) => &m.keys[0],
        }
    }
}

/// The resources of a multi-resource lock as the acquire takes them: each
/// checked, duplicates dropped, sorted by key.
pub(crate) enum Resources {
    /// Only one resource once duplicates are dropped: the single-key path.
    One(String),
    Many(Arc<Many>),
}

/// What the release script's channel names start with; the database, a colon
/// and the key follow. Keys are unique within a database, so channels of
/// different keys never collide, and the prefix keeps them apart from the
/// application's own channels.
pub(crate) const CHANNEL_PREFIX: &str = "redlock:released:";

/// What the channels of database `db`'s releases start with; the key follows.
pub(crate) fn channel_prefix(db: i64) -> String {
    format!("{CHANNEL_PREFIX}{db}:")
}

/// The channel a release of `key` in database `db` is published on.
pub(crate) fn channel(db: i64, key: &str) -> String {
    format!("{CHANNEL_PREFIX}{db}:{}", tagged(key))
}

/// What a lock key's waiters flag is named by: the key, then this. A waiter
/// sets the flag on a node before each of its attempts there, and the release
/// script announces a delete only when it deletes the flag with the key, so a
/// release that nobody waits for costs the node no `PUBLISH`
/// (BENCHMARKS.md at 9debf85, "Announce a release only to waiters"). No lock key may end
/// with it ([`crate::Error::ReservedResource`]), so a flag is never a lock.
pub(crate) const WAITERS_SUFFIX: &str = waiters_suffix!();

/// What a read share's key is named by: its resource's tag, this, and the
/// reader's token (`rwlock/`).
pub(crate) const READER_INFIX: &str = reader_infix!();

/// What a resource's readers index is named by: its tag, then this.
pub(crate) const READERS_SUFFIX: &str = readers_suffix!();

/// Whether `key` is a read share's key: its tag followed by
/// [`READER_INFIX`]. Its release also takes it off its readers index, which
/// only the scripts do (`node/scripts.rs`), never a native command.
pub(crate) fn is_reader_key(key: &str) -> bool {
    // The tag of a key that starts with `{` ends at its first `}` (as
    // `slots::tagged` and the script cut it); any other key is its own tag,
    // with nothing after it.
    key.starts_with('{')
        && key
            .find('}')
            .and_then(|end| key.get(end + 1..))
            .is_some_and(|rest| rest.starts_with(READER_INFIX))
}

/// What a permit slot's key is named by: its resource's tag, this, and the
/// slot (`semaphore/`).
pub(crate) const PERMIT_INFIX: &str = permit_infix!();

/// What a semaphore's permit count is named by: its tag, then this.
pub(crate) const PERMITS_SUFFIX: &str = permits_suffix!();

/// Whether `key` is a permit slot's key: its tag followed by
/// [`PERMIT_INFIX`]. Its extend also keeps the semaphore's count alive,
/// which only the scripts do, never a native command.
pub(crate) fn is_permit_key(key: &str) -> bool {
    key.starts_with('{')
        && key
            .find('}')
            .and_then(|end| key.get(end + 1..))
            .is_some_and(|rest| rest.starts_with(PERMIT_INFIX))
}

/// The waiters flag of `key` (see [`WAITERS_SUFFIX`]).
pub(crate) fn waiters_flag(key: &str) -> String {
    derived(key, WAITERS_SUFFIX)
}

/// The name a mutex waiter writes in its key's waiters flag: `w` and its
/// id in 16 hex digits (an attempt adds `:` and its token). The last waiter
/// to set the flag on a node before a release is named in that release's
/// announcement (`RELEASE_LUA` publishes the flag's value, but never the
/// name the releasing holder's own attempt wrote), and the waiter named
/// tries first (`wait/`, issue 48 item 7). A flag set by a permit or share
/// waiter, or by an older client, holds `1`, which names nobody.
pub(crate) fn waiter_name(id: u64) -> String {
    format!("w{id:016x}")
}

/// The waiter an announcement names ([`waiter_name`], alone or followed by
/// `:` and the token of the attempt that wrote it), if any.
pub(crate) fn named_waiter(payload: &[u8]) -> Option<u64> {
    let hex = payload.strip_prefix(b"w")?;
    let (hex, rest) = hex.split_at_checked(16)?;
    if !(rest.is_empty() || rest.starts_with(b":")) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// Whether the key `prefix` + `resource` ends with [`WAITERS_SUFFIX`], without
/// building it.
pub(crate) fn is_reserved(prefix: &str, resource: &str) -> bool {
    let n = WAITERS_SUFFIX.len();
    if resource.len() >= n {
        return resource.ends_with(WAITERS_SUFFIX);
    }
    // The resource is a tail of the suffix, and the prefix ends with the rest.
    WAITERS_SUFFIX.ends_with(resource)
        && WAITERS_SUFFIX
            .get(..n - resource.len())
            .is_some_and(|head| prefix.ends_with(head))
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_reader_key_is_told_by_what_follows_its_tag() {
        let writer = crate::slots::lock_key("redlock:", "reports/7");
        let reader = derived(&writer, &format!("{READER_INFIX}abc123"));
        assert!(is_reader_key(&reader), "{reader}");
        assert!(!is_reader_key(&writer));
        assert!(!is_reader_key(&derived(&writer, READERS_SUFFIX)));
        assert!(!is_reader_key(&waiters_flag(&writer)));
        // A lock key that merely contains the infix after other text.
        assert!(!is_reader_key("redlock:x:redlock-reader:abc"));
        assert_eq!(reader_infix_len!(), READER_INFIX.len().to_string());
    }

    #[test]
    fn a_waiter_name_reads_back_and_nothing_else_names_a_waiter() {
        for id in [0, 1, 0xdead_beef, u64::MAX] {
            assert_eq!(named_waiter(waiter_name(id).as_bytes()), Some(id));
            let with_token = format!("{}:0123abcd", waiter_name(id));
            assert_eq!(named_waiter(with_token.as_bytes()), Some(id));
        }
        for other in [
            &b"1"[..],
            b"",
            b"w",
            b"w123",
            b"x0000000000000001",
            b"w000000000000000g",
            b"w00000000000000011",
        ] {
            assert_eq!(named_waiter(other), None, "{other:?}");
        }
    }
}
