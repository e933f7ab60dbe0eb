//! The lock key of a request: one, or several taken together under one lock
//! ([`Redlock::lock_many`](crate::Redlock::lock_many)), e.g. both accounts of
//! `/transfers/{from}/{to}`.

use std::fmt;

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
