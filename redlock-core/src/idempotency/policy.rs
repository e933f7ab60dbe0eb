//! [`IdempotencyPolicy`]: the documented defaults of the layer, each
//! configurable, and [`StorePolicy`], which statuses are recorded.

use std::sync::Arc;

use http::StatusCode;

use super::fingerprint::Fingerprinter;
use crate::request::{LockPolicy, MissingKeyPolicy};

/// One MiB, the default cap of request and response bodies.
pub const DEFAULT_BODY_CAP: usize = 1024 * 1024;

/// Which response statuses are recorded (and so replayed to retries).
///
/// By default 2xx and 4xx are, except `408 Request Timeout`, `409 Conflict`,
/// `425 Too Early` and `429 Too Many Requests` (transient: a retry should run
/// again); 1xx, 3xx and 5xx are not, so a retry after a server error runs the
/// work again. [`StorePolicy::status`] overrides one status.
///
/// ```
/// use redlock_core::idempotency::StorePolicy;
///
/// let p = StorePolicy::default().status(404, false).status(503, true);
/// assert!(p.stores(201) && p.stores(400) && !p.stores(409) && !p.stores(500));
/// assert!(!p.stores(404) && p.stores(503));
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct StorePolicy {
    overrides: Vec<(u16, bool)>,
}

impl StorePolicy {
    /// Records (`true`) or never records (`false`) responses with `status`.
    pub fn status(mut self, status: u16, store: bool) -> Self {
        self.overrides.retain(|(s, _)| *s != status);
        self.overrides.push((status, store));
        self
    }

    /// Whether a response with `status` is recorded.
    pub fn stores(&self, status: u16) -> bool {
        if let Some((_, store)) = self.overrides.iter().find(|(s, _)| *s == status) {
            return *store;
        }
        match status {
            408 | 409 | 425 | 429 => false,
            200..=299 | 400..=499 => true,
            _ => false,
        }
    }
}

/// The settings of an idempotency layer, shared by both web adapters.
///
/// | case | default |
/// | --- | --- |
/// | no key | 400 problem+json ([`MissingKeyPolicy::PassThrough`] runs it unprotected) |
/// | key not 1–255 allowed characters | 400 problem+json |
/// | duplicate while the first is in flight | 409 + `Retry-After` (or wait, [`LockPolicy::wait`]) |
/// | completed | the stored status, allowlisted headers and body, with `Idempotent-Replayed: true` |
/// | same key, other fingerprint | 422 problem+json |
/// | recorded statuses | 2xx and 4xx except 408, 409, 425, 429 ([`StorePolicy`]) |
/// | request body over 1 MiB | 413 |
/// | response body over 1 MiB | passed through, recorded "completed, not replayable"; a retry gets 410 problem+json |
/// | record TTL | 24 h ([`RedisStore::record_ttl`](super::RedisStore::record_ttl)) |
/// | lock lost before the record | no record; 503 (or, with [`LostPolicy::Signal`](crate::request::LostPolicy::Signal), the response unrecorded) |
/// | namespace | `"idempotency:"` |
///
/// ```
/// use std::time::Duration;
/// use redlock_core::idempotency::{IdempotencyPolicy, StorePolicy};
///
/// let policy = IdempotencyPolicy::default()
///     .lock(|l| l.wait(Duration::from_secs(2)).namespace("payments:"))
///     .store_statuses(StorePolicy::default().status(404, false))
///     .max_request_body(64 * 1024);
/// # let _ = policy;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotencyPolicy {
    pub(crate) lock: LockPolicy,
    pub(crate) statuses: StorePolicy,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) replay_headers: Arc<[String]>,
    pub(crate) not_replayable_status: StatusCode,
    pub(crate) fingerprinter: Fingerprinter,
}

impl Default for IdempotencyPolicy {
    fn default() -> Self {
        Self {
            lock: LockPolicy::default()
                .namespace("idempotency:")
                .on_missing_key(MissingKeyPolicy::Reject),
            statuses: StorePolicy::default(),
            max_request_body: DEFAULT_BODY_CAP,
            max_response_body: DEFAULT_BODY_CAP,
            replay_headers: [
                "content-type",
                "content-language",
                "content-location",
                "location",
                "etag",
                "last-modified",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            not_replayable_status: StatusCode::GONE,
            fingerprinter: Fingerprinter::default(),
        }
    }
}

impl IdempotencyPolicy {
    /// Changes the lock's policy: TTL, busy answer or wait, missing key,
    /// fail-open, loss, namespace (see [`LockPolicy`]). The lock's release
    /// setting does not apply: the layer releases once the record is written.
    /// The lock is always the mutex: `permits(n)` or
    /// `shared_for_safe_methods()` here would let two copies of one key run
    /// the handler, so every request of such a layer is answered 500 (a
    /// misconfiguration, logged) before anything runs.
    pub fn lock(mut self, f: impl FnOnce(LockPolicy) -> LockPolicy) -> Self {
        self.lock = f(self.lock);
        self
    }

    /// Which statuses are recorded.
    pub fn store_statuses(mut self, statuses: StorePolicy) -> Self {
        self.statuses = statuses;
        self
    }

    /// The largest request body accepted, in bytes (default 1 MiB); larger
    /// ones get 413.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// The largest response body recorded, in bytes (default 1 MiB); a larger
    /// one is passed through and recorded "completed, not replayable".
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// The response headers kept in a record and replayed (default
    /// `content-type`, `content-language`, `content-location`, `location`,
    /// `etag`, `last-modified`). Case-insensitive.
    pub fn replay_headers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.replay_headers = names
            .into_iter()
            .map(|n| n.as_ref().to_ascii_lowercase())
            .collect();
        self
    }

    /// The status a retry gets when the first response was too large to
    /// record (default `410 Gone`, with problem+json naming the original
    /// status). The work does not run again.
    pub fn not_replayable_status(mut self, status: StatusCode) -> Self {
        self.not_replayable_status = status;
        self
    }

    /// What makes two requests "the same" (default: method, path and a
    /// SHA-256 of the body).
    pub fn fingerprinter(mut self, fingerprinter: Fingerprinter) -> Self {
        self.fingerprinter = fingerprinter;
        self
    }

    /// The lock's policy.
    pub fn lock_policy(&self) -> &LockPolicy {
        &self.lock
    }

    /// Whether a response with `status` is recorded.
    pub fn stores(&self, status: u16) -> bool {
        self.statuses.stores(status)
    }

    /// The request body cap.
    pub fn request_body_cap(&self) -> usize {
        self.max_request_body
    }

    /// The response body cap.
    pub fn response_body_cap(&self) -> usize {
        self.max_response_body
    }

    /// The fingerprinter.
    pub fn fingerprint_with(&self) -> &Fingerprinter {
        &self.fingerprinter
    }

    /// Whether a response header named `name` is recorded.
    pub fn keeps_header(&self, name: &str) -> bool {
        self.replay_headers
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_statuses() {
        let p = StorePolicy::default();
        for s in [200, 201, 204, 400, 404, 410, 422] {
            assert!(p.stores(s), "{s}");
        }
        for s in [100, 301, 408, 409, 425, 429, 500, 502, 503] {
            assert!(!p.stores(s), "{s}");
        }
        let p = p.status(500, true).status(500, false);
        assert!(!p.stores(500));
    }
}
