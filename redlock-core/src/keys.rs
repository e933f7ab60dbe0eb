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

/// A mutex waiter as its key's waiters flag names it: its id, and how many
/// turns it has left to other waiters (`wait/`, issue 48 item 7).
///
/// Written as `w`, the id in 16 hex digits and the turns in 8. A release
/// announces the flag's value (`RELEASE_LUA`; a holder's attempt took its
/// own name off: `NAME_FLAG_LUA`), and of the names a release gave on the
/// nodes the one that left the most turns goes next. A flag set by a permit or share waiter, or by
/// an older client, holds `1`, which names nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) id: u64,
    pub(crate) turns: u32,
}

impl Named {
    /// The flag's value naming this waiter.
    pub(crate) fn value(self) -> String {
        format!("w{:016x}{:08x}", self.id, self.turns)
    }

    /// The waiter an announcement names, if any.
    pub(crate) fn parse(payload: &[u8]) -> Option<Self> {
        let hex = payload.strip_prefix(b"w")?;
        let (id, rest) = hex.split_at_checked(16)?;
        let (turns, rest) = rest.split_at_checked(8)?;
        if !(rest.is_empty() || rest.starts_with(b":")) {
            return None;
        }
        Some(Self {
            id: u64::from_str_radix(hex_text(id)?, 16).ok()?,
            turns: u32::from_str_radix(hex_text(turns)?, 16).ok()?,
        })
    }
}

/// What a release's announcement says of the next waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// `1`: a flag set by a permit or share waiter, a set's, an older
    /// client's, or a native delete's announcement (which does not read the
    /// flag): as before names.
    Legacy,
    /// The waiter that goes next, if the most patient ([`Named`]).
    Named(Named),
}

impl Heard {
    /// What `payload` says.
    pub(crate) fn parse(payload: &[u8]) -> Self {
        Named::parse(payload).map_or(Self::Legacy, Self::Named)
    }
}

/// `b` as text, if it is hex digits only (no sign, unlike what
/// `from_str_radix` takes).
fn hex_text(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b)
        .ok()
        .filter(|t| t.bytes().all(|c| c.is_ascii_hexdigit()))
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
        for (id, turns) in [(0, 0), (1, 7), (0xdead_beef, 0x1234), (u64::MAX, u32::MAX)] {
            let named = Named { id, turns };
            assert_eq!(named.value().len(), 25);
            assert_eq!(Named::parse(named.value().as_bytes()), Some(named));
            let with_token = format!("{}:0123abcd", named.value());
            assert_eq!(Named::parse(with_token.as_bytes()), Some(named));
        }
        for other in [
            &b"1"[..],
            b"",
            b"w",
            b"w123",
            b"x000000000000000100000000",
            b"w000000000000000g00000000",
            b"w0000000000000001000000001",
            b"w0000000000000001+0000000",
        ] {
            assert_eq!(Named::parse(other), None, "{other:?}");
            assert_eq!(Heard::parse(other), Heard::Legacy, "{other:?}");
        }
    }
}
