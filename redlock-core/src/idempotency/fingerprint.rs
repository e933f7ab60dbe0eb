//! The request fingerprint: what makes a retry "the same request". A key
//! reused with another fingerprint is answered 422 (the IETF draft; Stripe
//! compares the parameters the same way).

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A request's fingerprint: a SHA-256 over the fields a [`Fingerprinter`]
/// chose.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub(crate) [u8; 32]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", super::key::hex(&self.0))
    }
}

impl Fingerprint {
    /// Hashes `fields` in order, each length-prefixed so that field
    /// boundaries count (`["ab", "c"]` and `["a", "bc"]` differ).
    pub fn of_fields<'a>(fields: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut hash = Sha256::new();
        for field in fields {
            hash.update((field.len() as u64).to_be_bytes());
            hash.update(field);
        }
        Self(hash.finalize().into())
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// What a [`Fingerprinter`] may read of a request: its method, path, query,
/// headers and buffered body.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// The method, e.g. `"POST"`.
    pub method: &'a str,
    /// The path the client sent, without the query: the full path, not
    /// what a nested router sees after its prefix (the adapters take axum's
    /// `OriginalUri`; actix's `path()` is already the full path).
    pub path: &'a str,
    /// The query, without the `?`, if any.
    pub query: Option<&'a str>,
    /// The request headers.
    pub headers: &'a http::HeaderMap,
    /// The whole request body.
    pub body: &'a [u8],
}

type FingerprintFn = dyn Fn(&RequestParts<'_>) -> Fingerprint + Send + Sync;

/// Chooses the fields of a request's [`Fingerprint`]. The default is what
/// identifies the request: the method, the path the client sent, the query
/// (as sent: `?a=1&b=2` and `?b=2&a=1` differ) and a SHA-256 of the body;
/// headers are not in it. A key is not scoped by path: the same key on
/// another path or query is the key reused for another request, answered
/// 422, never the other request's response (to keep tenants' keys apart
/// altogether, scope them with the layer's `scope`).
///
/// ```
/// use redlock_core::idempotency::{Fingerprint, Fingerprinter};
///
/// // Only the body: a webhook sender may retry to another path.
/// let by_body = Fingerprinter::from_fn(|req| Fingerprint::of_fields([req.body]));
/// # let _ = by_body;
/// ```
#[derive(Clone)]
pub struct Fingerprinter(Arc<FingerprintFn>);

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprinter(..)")
    }
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Self::from_fn(|req| {
            let body: [u8; 32] = Sha256::digest(req.body).into();
            // "No query" and "an empty query" (`/pay?`) are one request.
            let query = req.query.unwrap_or("");
            Fingerprint::of_fields([
                req.method.as_bytes(),
                req.path.as_bytes(),
                query.as_bytes(),
                &body,
            ])
        })
    }
}

impl Fingerprinter {
    /// A fingerprinter from a closure.
    pub fn from_fn(f: impl Fn(&RequestParts<'_>) -> Fingerprint + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// The fingerprint of `req`.
    pub fn fingerprint(&self, req: &RequestParts<'_>) -> Fingerprint {
        (self.0)(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_covers_method_path_query_and_body() {
        let headers = http::HeaderMap::new();
        let parts = |method, path, query, body| RequestParts {
            method,
            path,
            query,
            headers: &headers,
            body,
        };
        let f = Fingerprinter::default();
        let a = f.fingerprint(&parts("POST", "/pay", None, b"{}"));
        assert_ne!(a, f.fingerprint(&parts("POST", "/pay", Some("x=1"), b"{}")));
        assert_eq!(a, f.fingerprint(&parts("POST", "/pay", Some(""), b"{}")));
        assert_ne!(
            f.fingerprint(&parts("POST", "/pay", Some("to=x"), b"{}")),
            f.fingerprint(&parts("POST", "/pay", Some("to=y"), b"{}"))
        );
        // The query's boundary with the path counts.
        assert_ne!(
            f.fingerprint(&parts("POST", "/pay", Some("a"), b"{}")),
            f.fingerprint(&parts("POST", "/paya", None, b"{}"))
        );
        assert_ne!(a, f.fingerprint(&parts("PUT", "/pay", None, b"{}")));
        assert_ne!(a, f.fingerprint(&parts("POST", "/pay2", None, b"{}")));
        assert_ne!(a, f.fingerprint(&parts("POST", "/pay", None, b"{ }")));
        assert_ne!(
            Fingerprint::of_fields([&b"ab"[..], b"c"]),
            Fingerprint::of_fields([&b"a"[..], b"bc"])
        );
    }
}
