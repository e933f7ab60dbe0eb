//! Where a resource's keys live: the one layout every step uses, on single
//! servers and Redis Cluster nodes alike.
//!
//! A Redis Cluster puts a key in the slot of its hash tag (the text between
//! its first `{` and the first `}` after it, when not empty), else of the
//! whole key. Everything this library writes for one resource (the lock key,
//! its waiters flag, its fencing counter, its idempotency record and
//! generation, and the channel its release is announced on) must live in one
//! slot, so that a script over them runs on one shard, and the user's
//! characters must not move them: a resource `a{b}` must not put its lock key
//! in `b`'s slot and its flag elsewhere.
//!
//! The layout: a lock key's *tag* is the key (prefix and resource) itself
//! when it holds none of `{`, `}` and `%`, else the key with those three
//! escaped as `%7B`, `%7D` and `%25`. The lock key is the key itself in the
//! first case (so the names of ordinary resources' keys stay readable and
//! unchanged), `{tag}` in the second. Every other key of the resource is
//! `{tag}` and a suffix (`{tag}:redlock-waiters`, `{tag}:record`, ...), the
//! fencing counter `0xFF fence:{tag}`, and the release channel
//! `redlock:released:<db>:{tag}`. A permit slot of a semaphore is
//! `{tag}:redlock-permit:<i>` and a reader's share `{tag}:redlock-reader:<token>`:
//! each is held as a lock of its own (with a fence counter of its own,
//! `0xFF fence:` and the whole key), and its release clears the resource's
//! waiters flag and announces itself on the resource's channel. Then:
//!
//! - every key of one resource hashes by `tag`: a plain key hashes whole, and
//!   its tag is that whole key; a braced key hashes by its tag;
//! - tags are one-to-one with keys: a plain tag holds no `%`, an escaped one
//!   always does (the key held one of the three characters), and the escape
//!   is reversible;
//! - a lock key never equals another resource's derived key: derived keys
//!   start with `{` and continue past the closing `}`, lock keys either hold
//!   no `{` or end at their only `}`.

use std::borrow::Cow;

/// Whether `key` must be escaped into a braced tag.
fn needs_escape(key: &str) -> bool {
    key.bytes().any(|b| matches!(b, b'{' | b'}' | b'%'))
}

/// Whether the lock key of `resource` under an empty `prefix` is the
/// resource itself.
pub(crate) fn is_plain(prefix: &str, resource: &str) -> bool {
    prefix.is_empty() && !needs_escape(resource)
}

/// The tag of lock key material `key` (prefix and resource): see the module.
fn escape(key: &str) -> String {
    let mut tag = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '{' => tag.push_str("%7B"),
            '}' => tag.push_str("%7D"),
            '%' => tag.push_str("%25"),
            c => tag.push(c),
        }
    }
    tag
}

/// The Redis key of the lock on `resource` under key prefix `prefix`.
pub(crate) fn lock_key(prefix: &str, resource: &str) -> String {
    if needs_escape(prefix) || needs_escape(resource) {
        let mut key = String::with_capacity(prefix.len() + resource.len() + 8);
        key.push('{');
        key.push_str(&escape(prefix));
        key.push_str(&escape(resource));
        key.push('}');
        return key;
    }
    let mut key = String::with_capacity(prefix.len() + resource.len());
    key.push_str(prefix);
    key.push_str(resource);
    key
}

/// The braced tag `{tag}` of lock key `key` that every other key of its
/// resource starts with: the key itself when it is braced already. Of a key
/// derived from a lock key (`{tag}` and a suffix) that is held as a lock of
/// its own (a permit slot, a reader's share), the same `{tag}`: its release
/// announces itself on its resource's channel and clears its resource's
/// waiters flag, as the release scripts do (`node::RELEASE_LUA`).
pub(crate) fn tagged(key: &str) -> Cow<'_, str> {
    if key.starts_with('{') {
        Cow::Borrowed(key.find('}').map_or(key, |end| &key[..=end]))
    } else {
        Cow::Owned(format!("{{{key}}}"))
    }
}

/// `key` braced whole: `{key}`, or the key itself when it is braced already.
/// For what belongs to one held key rather than to its resource (a fence
/// counter: each permit slot counts its own holders); a lock key's is its
/// [`tagged`].
pub(crate) fn braced(key: &str) -> Cow<'_, str> {
    if key.starts_with('{') {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{{{key}}}"))
    }
}

/// The key of lock key `key`'s resource that ends with `suffix`:
/// `{tag}` then `suffix`.
pub(crate) fn derived(key: &str, suffix: &str) -> String {
    let tagged = tagged(key);
    let mut k = String::with_capacity(tagged.len() + suffix.len());
    k.push_str(&tagged);
    k.push_str(suffix);
    k
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    fn slot(key: &[u8]) -> Slot {
        Slot::for_key(key)
    }

    /// Every key of a resource, as the library names them.
    fn family(prefix: &str, resource: &str) -> Vec<Vec<u8>> {
        let key = lock_key(prefix, resource);
        let mut fence = b"\xfffence:".to_vec();
        fence.extend_from_slice(tagged(&key).as_bytes());
        vec![
            key.clone().into_bytes(),
            derived(&key, ":redlock-waiters").into_bytes(),
            derived(&key, ":record").into_bytes(),
            derived(&key, ":generation").into_bytes(),
            derived(&key, ":redlock-permit:3").into_bytes(),
            derived(&key, ":redlock-reader:t0k3n").into_bytes(),
            fence,
            format!("redlock:released:0:{}", tagged(&key)).into_bytes(),
        ]
    }

    #[test]
    fn every_key_of_a_resource_is_in_one_slot_whatever_its_characters() {
        let hostile = [
            "a",
            "a{b}c",
            "{b}",
            "{",
            "}",
            "}{",
            "a{",
            "a}",
            "{}",
            "{{}}",
            "%",
            "%7B",
            "a%7Bb",
            "x:y",
            "é{ü}",
            "{a}:redlock-waiters",
            "{a}:record",
        ];
        for prefix in ["", "lock:", "{p}", "p%"] {
            for r in hostile {
                let keys = family(prefix, r);
                let slot0 = slot(&keys[0]);
                for k in &keys {
                    assert_eq!(slot(k), slot0, "{prefix:?}{r:?}: {k:?}");
                }
            }
        }
    }

    #[test]
    fn a_key_held_as_a_lock_of_its_own_clears_and_announces_its_resources() {
        for (prefix, r) in [("", "a"), ("", "a{b}"), ("p:", "%"), ("{p}", "x")] {
            let key = lock_key(prefix, r);
            for held in [
                derived(&key, ":redlock-permit:7"),
                derived(&key, ":redlock-reader:t0k3n"),
            ] {
                assert_eq!(tagged(&held), tagged(&key), "{held}");
                assert_eq!(
                    derived(&held, ":redlock-waiters"),
                    derived(&key, ":redlock-waiters")
                );
                // What counts one held key's holders stays its own.
                assert_ne!(braced(&held), braced(&key));
            }
            assert_eq!(braced(&key), tagged(&key));
        }
    }

    #[test]
    fn plain_keys_keep_their_names_and_escaped_tags_never_meet_plain_ones() {
        assert_eq!(lock_key("", "orders:42"), "orders:42");
        assert_eq!(lock_key("lock:", "a"), "lock:a");
        assert_eq!(lock_key("", "a{b}"), "{a%7Bb%7D}");
        // The plain key `a%7B` and the resource `a{` must not share a tag.
        assert_ne!(
            derived(&lock_key("", "a%7B"), ":record"),
            derived(&lock_key("", "a{"), ":record")
        );
        let all = ["a", "a{", "a%7B", "{a}", "%7Ba%7D", "a}", "a%7D", "{a", "%"];
        let mut seen = std::collections::HashSet::new();
        for r in all {
            let key = lock_key("", r);
            for k in [key.clone(), derived(&key, ":redlock-waiters")] {
                assert!(seen.insert(k.clone()), "{r:?} gives {k:?} twice");
            }
        }
    }
}
