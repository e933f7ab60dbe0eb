//! Which lock a request takes: the mutex (the default), one of a number of
//! permits (the semaphore, `semaphore/`), or a read share for a safe method
//! and the write lock for any other (`rwlock/`), all on the same key.

use crate::error::Error;
use crate::guard::LockGuard;
use crate::primitive::Kind;
use crate::redlock::Redlock;
use crate::settings::LockOptions;

/// Which lock a request takes on its key (set with the adapters' `permits`
/// and `shared_for_safe_methods`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestLockKind {
    /// One request per key at a time (the default).
    #[default]
    Mutex,
    /// At most this many requests per key at once, across replicas
    /// ([`Redlock::semaphore`]); one over the limit is answered busy,
    /// `429 Too Many Requests` unless `busy_status` says otherwise.
    Permits(u32),
    /// `GET`, `HEAD` and `OPTIONS` take a read share, every other method
    /// the write lock, on the same key ([`Redlock::rw_lock`]).
    SharedForSafeMethods,
}

/// Whether a request of this method only reads, for
/// [`RequestLockKind::SharedForSafeMethods`]: `GET`, `HEAD`, `OPTIONS`
/// (by name, so that actix-web's own `Method` type can ask too).
pub fn is_read_method(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS")
}

impl RequestLockKind {
    /// The primitive a request of this kind takes; `reads`: whether the
    /// request's method only reads.
    pub fn primitive_kind(self, reads: bool) -> Kind {
        match self {
            RequestLockKind::Mutex => Kind::Mutex,
            RequestLockKind::Permits(n) => Kind::Permits(n),
            RequestLockKind::SharedForSafeMethods if reads => Kind::Read,
            RequestLockKind::SharedForSafeMethods => Kind::Write,
        }
    }
}

/// The guard of a request's lock of `kind` on `resources` (one, or several
/// taken together); `reads`: whether the request's method only reads.
pub(super) async fn guard(
    redlock: &Redlock,
    resources: &[String],
    options: &LockOptions,
    kind: RequestLockKind,
    reads: bool,
) -> Result<LockGuard, Error> {
    let primitive = kind.primitive_kind(reads);
    // Several keys are locked together only as the mutex (`Kind`): any
    // other kind is refused, never taken as the mutex (a write beside a
    // read, two holders of `permits(1)`), with what to change.
    if resources.len() > 1 && !primitive.takes_several_resources() {
        return Err(unsupported_for_many(kind));
    }
    redlock
        .primitive(resources, primitive)?
        .guard(options)
        .await
}

/// The error of a request whose extractor found several keys under a `kind`
/// other than the mutex: several keys are locked together only as one mutex
/// for now, and taking that instead would silently break what `kind`
/// promises (a write beside a read; two holders of `permits(1)`).
fn unsupported_for_many(kind: RequestLockKind) -> Error {
    let what = match kind {
        RequestLockKind::Mutex => "the mutex",
        RequestLockKind::Permits(_) => "permits(n)",
        RequestLockKind::SharedForSafeMethods => "shared_for_safe_methods()",
    };
    Error::InvalidConfig(format!(
        "{what} with a key extractor that finds several keys is not supported: \
         several keys are locked together only as one mutex (drop {what}, or extract one key)"
    ))
}

/// The error of an idempotency layer whose lock policy is not the mutex:
/// two copies of one idempotency key must never run together.
#[cfg(feature = "idempotency")]
pub(crate) fn idempotency_needs_the_mutex(kind: RequestLockKind) -> Option<Error> {
    let what = match kind {
        RequestLockKind::Mutex => return None,
        RequestLockKind::Permits(_) => "permits(n)",
        RequestLockKind::SharedForSafeMethods => "shared_for_safe_methods()",
    };
    Some(Error::InvalidConfig(format!(
        "the idempotency layer's lock is always exclusive: {what} in its lock policy would \
         let two copies of one key run the handler; remove it from `IdempotencyPolicy::lock`"
    )))
}
