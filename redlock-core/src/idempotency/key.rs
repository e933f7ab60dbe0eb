//! The idempotency key: the client's value parsed and validated
//! ([`IdempotencyKey`]), and the scoped lookup key the lock and the record
//! live under ([`LookupKey`]).
//!
//! The IETF httpapi Idempotency-Key draft (-07) makes the header a Structured
//! Field String (`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`);
//! many clients send the value bare, so a bare token is accepted too.

use std::fmt;

use sha2::{Digest, Sha256};

pub(crate) use crate::request::keys::hex;
use crate::request::keys::update_prefixed;

/// The longest key accepted, in bytes (every accepted character is one byte).
pub const MAX_KEY_LEN: usize = 255;

/// Why a key was refused. Answered as 400 with problem+json.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty (or the quoted string holds nothing).
    #[error("the idempotency key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    #[error("the idempotency key is {len} bytes long; at most {MAX_KEY_LEN} are allowed")]
    TooLong {
        /// The length found (of the unquoted value).
        len: usize,
    },
    /// A byte outside the documented charset, at this position of the raw
    /// header value.
    #[error("the idempotency key has a character not allowed at byte {at}")]
    BadChar {
        /// Its position in the raw header value.
        at: usize,
    },
    /// A quoted string that does not end with its closing quote, has
    /// something after it, or escapes a character other than `"` or `\`.
    #[error("the idempotency key is not a valid structured-field string")]
    BadString,
}

/// A validated idempotency key.
///
/// Accepted forms (optional spaces or tabs around either are trimmed):
///
/// - an RFC 8941 sf-string: `"` … `"`, any printable ASCII character
///   (`0x20`–`0x7E`) inside, with `\"` and `\\` the only escapes;
/// - a bare token: one or more of the HTTP `tchar` characters
///   (`A–Z a–z 0–9 ! # $ % & ' * + - . ^ _ \` | ~`) and `:` and `/`, which
///   covers UUIDs, ULIDs, and the delivery ids of Stripe, GitHub, Shopify and
///   Standard Webhooks.
///
/// The value (unquoted, unescaped) must be 1 to [`MAX_KEY_LEN`] bytes long.
/// Anything else is a [`KeyError`], never a panic.
///
/// ```
/// use redlock_core::idempotency::IdempotencyKey;
///
/// let quoted = IdempotencyKey::parse(br#""8e03978e-40d5-43e8""#).unwrap();
/// let bare = IdempotencyKey::parse(b"8e03978e-40d5-43e8").unwrap();
/// assert_eq!(quoted, bare);
/// assert!(IdempotencyKey::parse(&[b'a'; 256]).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

impl IdempotencyKey {
    /// Parses a raw header value (see the type's docs for the accepted forms).
    ///
    /// # Errors
    /// A [`KeyError`] saying what is wrong.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
        let start = raw.iter().position(|b| !is_ows(b)).unwrap_or(raw.len());
        let end = raw
            .iter()
            .rposition(|b| !is_ows(b))
            .map_or(start, |i| i + 1);
        let trimmed = raw.get(start..end).unwrap_or_default();
        let value = match trimmed.first() {
            Some(b'"') => parse_sf_string(trimmed, start)?,
            Some(_) => parse_token(trimmed, start)?,
            None => return Err(KeyError::Empty),
        };
        Self::check(value)
    }

    /// A key from a value that is already unquoted (a named header such as
    /// `X-GitHub-Delivery`, or a field of the body): the same length bound,
    /// and the sf-string charset (printable ASCII).
    ///
    /// # Errors
    /// A [`KeyError`] saying what is wrong.
    pub fn from_value(value: &str) -> Result<Self, KeyError> {
        if let Some(at) = value.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
            return Err(KeyError::BadChar { at });
        }
        Self::check(value.to_owned())
    }

    fn check(value: String) -> Result<Self, KeyError> {
        match value.len() {
            0 => Err(KeyError::Empty),
            len if len > MAX_KEY_LEN => Err(KeyError::TooLong { len }),
            _ => Ok(Self(value)),
        }
    }

    /// The key's value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An RFC 8941 sf-string (section 3.3.3), `raw` starting with its `"`.
/// `offset` is where `raw` starts in the header value, for error positions.
fn parse_sf_string(raw: &[u8], offset: usize) -> Result<String, KeyError> {
    let mut out = String::new();
    let mut bytes = raw.iter().enumerate().skip(1);
    while let Some((i, &b)) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some((_, &c @ (b'"' | b'\\'))) => out.push(char::from(c)),
                _ => return Err(KeyError::BadString),
            },
            b'"' => {
                return if i + 1 == raw.len() {
                    Ok(out)
                } else {
                    Err(KeyError::BadString)
                };
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => return Err(KeyError::BadChar { at: offset + i }),
        }
        if out.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: out.len() });
        }
    }
    Err(KeyError::BadString)
}

/// A bare token: `tchar`, `:` and `/` only.
fn parse_token(raw: &[u8], offset: usize) -> Result<String, KeyError> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b);
    if let Some(at) = raw.iter().position(|&b| !tchar(b)) {
        return Err(KeyError::BadChar { at: offset + at });
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: raw.len() });
    }
    // Only ASCII passed the check above.
    Ok(raw.iter().map(|&b| char::from(b)).collect())
}

/// Where a request's lock and record live: the namespace in clear, then a
/// SHA-256 of the scope and the client's key, hex-encoded.
///
/// The scope (a tenant, an authenticated principal) keeps one client from
/// reading another's result with the same key (the draft's security
/// section). The hash keeps the Redis key a fixed length whatever the
/// client sends, as [`bound_key`](crate::request::bound_key) does for the
/// keys of per-request locks, and the scope and key are length-prefixed
/// before hashing, so `("ab", "c")` and `("a", "bc")` differ.
///
/// ```
/// use redlock_core::idempotency::{IdempotencyKey, LookupKey};
///
/// let key = IdempotencyKey::parse(b"order-1").unwrap();
/// let a = LookupKey::new("idem:", Some("tenant-a"), &key);
/// let b = LookupKey::new("idem:", Some("tenant-b"), &key);
/// assert_ne!(a, b);
/// assert!(a.resource().starts_with("idem:"));
/// assert_eq!(a.resource().len(), "idem:".len() + 64);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LookupKey {
    resource: String,
}

impl LookupKey {
    /// The lookup key of `key` in `namespace`, within `scope` if any.
    pub fn new(namespace: &str, scope: Option<&str>, key: &IdempotencyKey) -> Self {
        let mut hash = Sha256::new();
        match scope {
            Some(scope) => {
                hash.update([1u8]);
                update_prefixed(&mut hash, scope.as_bytes());
            }
            None => hash.update([0u8]),
        }
        update_prefixed(&mut hash, key.0.as_bytes());
        Self {
            resource: format!("{namespace}{}", hex(&hash.finalize())),
        }
    }

    /// The lock's resource name (the handle's key prefix goes before it).
    pub fn resource(&self) -> &str {
        &self.resource
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_bare_forms() {
        let k = |s: &str| IdempotencyKey::parse(s.as_bytes());
        assert_eq!(k(r#""abc""#).unwrap().as_str(), "abc");
        assert_eq!(k(r#" "a \"b\" \\c" "#).unwrap().as_str(), r#"a "b" \c"#);
        assert_eq!(k("evt_1:x/y").unwrap().as_str(), "evt_1:x/y");
        assert_eq!(k(""), Err(KeyError::Empty));
        assert_eq!(k("  "), Err(KeyError::Empty));
        assert_eq!(k(r#""""#), Err(KeyError::Empty));
        assert_eq!(k(r#""abc"#), Err(KeyError::BadString));
        assert_eq!(k(r#""a"b"#), Err(KeyError::BadString));
        assert_eq!(k(r#""a\b""#), Err(KeyError::BadString));
        assert_eq!(k("a b"), Err(KeyError::BadChar { at: 1 }));
        assert_eq!(k("\"a\u{7f}\""), Err(KeyError::BadChar { at: 2 }));
        assert_eq!(k("é"), Err(KeyError::BadChar { at: 0 }));
    }

    #[test]
    fn length_bounds() {
        let max = "a".repeat(MAX_KEY_LEN);
        assert!(IdempotencyKey::parse(max.as_bytes()).is_ok());
        assert!(IdempotencyKey::parse(format!("\"{max}\"").as_bytes()).is_ok());
        let long = "a".repeat(MAX_KEY_LEN + 1);
        assert_eq!(
            IdempotencyKey::parse(long.as_bytes()),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            IdempotencyKey::parse(format!("\"{long}\"").as_bytes()),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            IdempotencyKey::from_value(&long),
            Err(KeyError::TooLong { len: 256 })
        );
    }

    #[test]
    fn scopes_are_length_prefixed() {
        let k = |s: &str| IdempotencyKey::from_value(s).unwrap();
        assert_ne!(
            LookupKey::new("n:", Some("ab"), &k("c")),
            LookupKey::new("n:", Some("a"), &k("bc"))
        );
        assert_ne!(
            LookupKey::new("n:", None, &k("c")),
            LookupKey::new("n:", Some(""), &k("c"))
        );
        assert_eq!(
            LookupKey::new("n:", None, &k("c")),
            LookupKey::new("n:", None, &k("c"))
        );
    }
}
