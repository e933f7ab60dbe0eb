//! An acquire attempt whose call on each node is a script of another
//! primitive's (the read/write lock's, `rwlock/`), answered as
//! `ACQUIRE_MANY_LUA` answers: everything after the call (settle at quorum,
//! the fence of a fenced writer, validity, the release of a failed attempt,
//! late answers) is the mutex's own [`Attempt`].

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use super::Ttl;
use super::attempt::Attempt;
use crate::error::Error;
use crate::keys::Keys;
use crate::node::{Call, parse_acquire_many};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;

/// What a scripted attempt holds once it succeeds.
pub(crate) struct Scripted {
    /// The key the attempt's token is stored under (the lock's key: what
    /// release and extend compare and delete or push).
    pub(crate) key: Arc<str>,
    /// Whether a fencing handle fences the attempt (the fence counter is that
    /// of `key`).
    pub(crate) fenced: bool,
}

impl Core {
    /// One attempt that sends `call` (built for `token`) to every node and
    /// holds `target.key` on a quorum, as [`Redlock::attempt`] does for the
    /// mutex's `SET`.
    pub(crate) async fn attempt_scripted(
        &self,
        resource: &Arc<str>,
        target: Scripted,
        token: Arc<str>,
        ttl: Ttl,
        call: Call,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let span = super::acquire_span(resource, attempt, ttl);
        async {
            let start = Instant::now();
            let pending = self.fan_out(
                &Arc::new(call),
                parse_acquire_many,
                0..self.inner.nodes.len(),
            );
            let keys = Keys::One(Arc::clone(&target.key));
            let mut attempt = Attempt::new(self, resource, &target.key, keys, token, ttl, start);
            attempt.fenced = target.fenced;
            attempt.run(pending).await
        }
        .instrument(span)
        .await
    }
}
