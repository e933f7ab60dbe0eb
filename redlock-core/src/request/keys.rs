//! The lock key of a request: one, or several taken together under one lock
//! ([`crate::Redlock::mutex_many`](crate::Redlock::mutex_many)), e.g. both accounts of
//! `/transfers/{from}/{to}`; and the two promises every key made from what a
//! client sent keeps, whatever it sent:
//!
//! - **it stays in its family** ([`KeyFamily`]): a value is percent-encoded
//!   before it joins its family's name, so no client value spells a path,
//!   another family's `name=value`, or a second `=` that moves the split
//!   between name and value;
//! - **it is bounded in bytes** ([`bound_key`]): a key longer than
//!   [`MAX_KEY_BYTES`] becomes its start and a SHA-256 digest of the whole,
//!   so a 60 KB path costs the nodes a few hundred bytes, not 60 KB per node
//!   and per flag. The idempotency layer's
//!   [`LookupKey`](crate::idempotency::LookupKey) is the same idea with no
//!   readable start; both hash through [`hex`] and [`update_prefixed`].
//!
//! The adapters' extractors build their keys with [`KeyFamily`]; the bound is
//! applied once, by [`LockPolicy::resource_for`](super::LockPolicy::resource_for),
//! to every key an extractor, a closure or a handler hands the lock.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

/// What an adapter's key extractor found in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestKey {
    /// One key: an ordinary lock.
    One(String),
    /// Several keys locked together: deduplicated and ordered by the lock, so
    /// `/transfers/7/9` and `/transfers/9/7` take the same lock and cannot
    /// deadlock each other.
    Many(Vec<String>),
}

impl RequestKey {
    /// The keys, in the order given.
    pub fn keys(&self) -> &[String] {
        match self {
            RequestKey::One(k) => std::slice::from_ref(k),
            RequestKey::Many(ks) => ks,
        }
    }
}

impl From<String> for RequestKey {
    fn from(key: String) -> Self {
        RequestKey::One(key)
    }
}

impl From<Vec<String>> for RequestKey {
    fn from(keys: Vec<String>) -> Self {
        RequestKey::Many(keys)
    }
}

/// The keys joined by `+`: what spans, logs and a rejection name the request's
/// lock by.
impl fmt::Display for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.keys().join("+"))
    }
}

/// The longest key, in bytes, that reaches the nodes as it is; a longer one
/// is replaced by [`bound_key`]'s digest form, which is never longer. The
/// policy's namespace and the handle's key prefix go before it, and a
/// waiters flag adds `:redlock-waiters` (16 bytes) after it.
pub const MAX_KEY_BYTES: usize = 256;

/// What separates a digest form's readable start from its digest. A key that
/// contains it is digested whatever its length, so no key kept as it is can
/// equal a digest form. No key the built-in extractors make contains `#`
/// (paths and values carry it as `%23`); and it holds no `:`, so a digest
/// form has a `:` only where its key's start had one (see [`KeyFamily`] on
/// namespaces).
const DIGEST_MARKER: &str = "#sha256-";

/// The length of a SHA-256 digest in hex.
const DIGEST_HEX: usize = 64;

/// How much of a long key is kept in clear before its digest.
const READABLE_START: usize = MAX_KEY_BYTES - DIGEST_MARKER.len() - DIGEST_HEX;

/// `key` if it is at most [`MAX_KEY_BYTES`] long (and does not contain the
/// digest marker `#sha256-`); else its first bytes (up to 184, cut at a
/// character boundary), `#sha256-`, and the SHA-256 of the whole key in
/// lower-case hex: at most [`MAX_KEY_BYTES`] bytes.
///
/// Two different keys never give one result (barring a SHA-256 collision):
/// a key kept as it is has no marker and a digest form has one, and two
/// digest forms differ in their digests. The start keeps logs and
/// `redis-cli` readable.
///
/// ```
/// use redlock_core::request::{MAX_KEY_BYTES, bound_key};
///
/// assert_eq!(bound_key("/orders/42"), "/orders/42");
/// let long = format!("/o/{}", "a".repeat(60_000));
/// let bounded = bound_key(&long);
/// assert!(bounded.len() <= MAX_KEY_BYTES);
/// assert!(bounded.starts_with("/o/aaaa"));
/// assert_ne!(bounded, bound_key(&format!("{long}b")));
/// ```
pub fn bound_key(key: &str) -> Cow<'_, str> {
    if key.len() <= MAX_KEY_BYTES && !key.contains(DIGEST_MARKER) {
        return Cow::Borrowed(key);
    }
    let mut cut = READABLE_START.min(key.len());
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut bounded = String::with_capacity(MAX_KEY_BYTES);
    bounded.push_str(key.get(..cut).unwrap_or_default());
    bounded.push_str(DIGEST_MARKER);
    bounded.push_str(&hex(&Sha256::digest(key.as_bytes())));
    Cow::Owned(bounded)
}

/// What stays raw in an escaped value or family name: RFC 3986's unreserved
/// characters (ASCII letters and digits, `-`, `.`, `_`, `~`). Everything
/// else is `%XX` of its UTF-8 bytes, upper-case hex: `%` itself (so that the
/// encoding is injective), the separators `=`, `,`, `:`, `+`, `/`, `#`,
/// `{`, `}`, controls, spaces and every non-ASCII byte.
const VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A client's value, percent-encoded so that it cannot carry a separator of
/// the key formats (see [`KeyFamily`]): every byte except ASCII letters,
/// digits, `-`, `.`, `_` and `~` becomes `%XX`. Injective, so two values
/// give two results; a value of the kept characters only (an id, a UUID, a
/// slug) is borrowed as it is.
///
/// For closures that build keys from client values (`by_fn`): escape each
/// value, and the closure's own separators stay unambiguous.
///
/// ```
/// use redlock_core::request::escape_value;
///
/// assert_eq!(escape_value("acme-1.2_x~"), "acme-1.2_x~");
/// assert_eq!(escape_value("tenant=acme"), "tenant%3Dacme");
/// assert_eq!(escape_value("a:b/c+d"), "a%3Ab%2Fc%2Bd");
/// assert_eq!(escape_value("50%"), "50%25");
/// assert_eq!(escape_value("é"), "%C3%A9");
/// ```
pub fn escape_value(value: &str) -> Cow<'_, str> {
    utf8_percent_encode(value, VALUE).into()
}

/// The family of the keys an extractor makes from client values: each key is
/// `<family>=<value>`, the value [escaped](escape_value).
///
/// - [`KeyFamily::named`]: the name given, escaped. `by_path_param(name)`,
///   `by_header_as(.., name)` and the named multi-parameter extractors use it,
///   so the same value under the same name is one lock wherever it was found
///   (`tenant=acme`).
/// - Unnamed extractors get a family from their source: `by_header(h)` the
///   header's name (`x-tenant-id=acme`), and `by_path_params([..])` the
///   parameters' names, escaped and joined by `,`, one family for all of them
///   (`from,to=7` and `from,to=9` for `/transfers/7/9`, the same two keys as
///   `/transfers/9/7`).
///
/// The value is escaped, so it holds no `=`, `,`, `:`, `/` or `%` of its own:
/// a key splits at its first `=` into family and value in one way only. A
/// path key (`by_path`) starts with `/`, which no escaped family starts
/// with, and a family made from several names holds a `,`, which no single
/// escaped name holds. So no client value gives another family's key.
///
/// The policy's namespace goes before the key. Namespaces of letters, digits,
/// `-`, `_` and `.`, each segment ended by `:` (the default `redlock:`,
/// `jobs:`, `app:jobs:`), cannot be told apart wrongly from a key: no key of
/// these extractors has a `:` before its first `/` or `=`, so `redlock:` +
/// a key never equals `redlock:jobs:` + another.
///
/// ```
/// use redlock_core::request::KeyFamily;
///
/// assert_eq!(KeyFamily::named("tenant").key("acme"), "tenant=acme");
/// assert_eq!(KeyFamily::named("a").key("b=c"), "a=b%3Dc");
/// assert_eq!(KeyFamily::named("a=b").key("c"), "a%3Db=c");
/// assert_eq!(KeyFamily::params(["from", "to"]).key("7"), "from,to=7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyFamily(Arc<str>);

impl KeyFamily {
    /// The family `name` (escaped).
    pub fn named(name: &str) -> Self {
        Self(escape_value(name).into())
    }

    /// The family of several parameters taken together: their names, each
    /// escaped, joined by `,`.
    pub fn params<I, S>(params: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let names: Vec<String> = params
            .into_iter()
            .map(|p| escape_value(p.as_ref()).into_owned())
            .collect();
        Self(names.join(",").into())
    }

    /// The key of `value` in this family: `<family>=<escaped value>`.
    pub fn key(&self, value: &str) -> String {
        let value = escape_value(value);
        let mut key = String::with_capacity(self.0.len() + 1 + value.len());
        key.push_str(&self.0);
        key.push('=');
        key.push_str(&value);
        key
    }

    /// The family as it appears in keys (escaped).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Feeds `part` to `hash` after its length (8 bytes, big-endian), so that
/// parts hashed one after the other cannot be regrouped: `("ab", "c")` and
/// `("a", "bc")` give two digests.
#[cfg(feature = "idempotency")]
pub(crate) fn update_prefixed(hash: &mut Sha256, part: &[u8]) {
    hash.update((part.len() as u64).to_be_bytes());
    hash.update(part);
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_stay_and_long_ones_are_bounded_and_distinct() {
        assert!(matches!(
            bound_key("/orders/42"),
            Cow::Borrowed("/orders/42")
        ));
        let max = "k".repeat(MAX_KEY_BYTES);
        assert!(matches!(bound_key(&max), Cow::Borrowed(_)));
        let over = "k".repeat(MAX_KEY_BYTES + 1);
        let bounded = bound_key(&over);
        assert_eq!(bounded.len(), MAX_KEY_BYTES);
        assert!(bounded.starts_with(&"k".repeat(READABLE_START)));
        assert_ne!(bounded, bound_key(&"k".repeat(MAX_KEY_BYTES + 2)));
        for len in [MAX_KEY_BYTES + 1, 1000, 60_000, 1 << 20] {
            assert!(bound_key(&"x".repeat(len)).len() <= MAX_KEY_BYTES);
        }
    }

    #[test]
    fn a_key_that_looks_like_a_digest_form_is_digested_too() {
        let long = "k".repeat(1000);
        let forged = bound_key(&long).into_owned();
        assert!(forged.len() <= MAX_KEY_BYTES);
        let again = bound_key(&forged);
        assert_ne!(again, forged, "a short key never equals a digest form");
        assert!(again.len() <= MAX_KEY_BYTES);
    }

    #[test]
    fn the_cut_respects_character_boundaries() {
        for pad in 0..4 {
            let key = format!("{}{}", "a".repeat(pad), "é".repeat(400));
            let bounded = bound_key(&key);
            assert!(bounded.len() <= MAX_KEY_BYTES, "{pad}");
            assert!(bounded.contains(DIGEST_MARKER));
        }
    }

    #[test]
    fn values_cannot_carry_separators() {
        for value in [
            "a=b", "a,b", "a:b", "a/b", "a+b", "a%3Db", "{x}", "a#b", "\n",
        ] {
            let escaped = escape_value(value);
            assert!(
                !escaped.contains(['=', ',', ':', '/', '+', '{', '}', '#', '\n']),
                "{value:?} gave {escaped:?}"
            );
        }
        assert_ne!(escape_value("a%3Db"), escape_value("a=b"));
    }

    #[test]
    fn families_and_values_split_one_way_only() {
        assert_ne!(
            KeyFamily::named("a").key("b=c"),
            KeyFamily::named("a=b").key("c")
        );
        assert_ne!(
            KeyFamily::params(["a,b"]).key("c"),
            KeyFamily::params(["a", "b"]).key("c")
        );
        assert_eq!(
            KeyFamily::params(["account"]).key("7"),
            KeyFamily::named("account").key("7"),
        );
        assert!(!KeyFamily::named("/x").key("y").starts_with('/'));
    }

    #[cfg(feature = "idempotency")]
    #[test]
    fn prefixed_parts_cannot_be_regrouped() {
        let digest = |parts: &[&str]| {
            let mut hash = Sha256::new();
            for p in parts {
                update_prefixed(&mut hash, p.as_bytes());
            }
            hex(&hash.finalize())
        };
        assert_ne!(digest(&["ab", "c"]), digest(&["a", "bc"]));
        assert_eq!(digest(&["ab", "c"]).len(), DIGEST_HEX);
    }
}
