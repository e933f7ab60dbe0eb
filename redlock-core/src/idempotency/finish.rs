//! Step 6 of the idempotency flow (idempotency layer): a [`Running`]
//! request's response recorded while its lock is held, then the release.

use std::sync::Arc;

use bytes::Bytes;

use super::flow::Running;
use super::policy::IdempotencyPolicy;
use super::record::{Outcome, Record};
use super::rejection::IdempotencyRejection;
use crate::request::{LostPolicy, RequestLock};

impl Running {
    /// The lock the handler runs under: guard the handler with
    /// [`request::guard`](crate::request::guard) and [`Running::lock_policy`], and put
    /// [`RequestLock::handle`] in the request.
    pub fn lock(&self) -> &RequestLock {
        &self.lock
    }

    /// The lock's policy.
    pub fn lock_policy(&self) -> &crate::request::LockPolicy {
        &self.policy.lock
    }

    /// The layer's policy.
    pub fn policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    /// Step 6: records the handler's response if its status is stored, while
    /// holding the lock, then releases the lock. `headers` are the
    /// response's (only the policy's allowlist is kept); `body` is the whole
    /// body, or `None` when it was over the cap (recorded "completed, not
    /// replayable").
    ///
    /// `Ok` means: answer with the response. When the record could not be
    /// written (the lock was lost before it, or the store failed), the
    /// response is not recorded and the next copy of the request runs the
    /// work; with [`LostPolicy::Abort`] (the default) this request is then
    /// answered with the error, with [`LostPolicy::Signal`] with its
    /// response.
    ///
    /// # Errors
    /// The rejection to answer with instead of the response (logged).
    pub async fn finish<'h>(
        self,
        status: u16,
        headers: impl Iterator<Item = (&'h str, &'h [u8])>,
        body: Option<Bytes>,
    ) -> Result<(), IdempotencyRejection> {
        if !self.policy.stores(status) {
            self.lock.release().await;
            return Ok(());
        }
        let outcome = match body {
            Some(body) => Outcome::Replayable {
                headers: headers
                    .filter(|(name, _)| self.policy.keeps_header(name))
                    .map(|(name, value)| (name.to_ascii_lowercase(), Bytes::copy_from_slice(value)))
                    .collect(),
                body,
            },
            None => Outcome::NotReplayable,
        };
        let holder = self.lock.handle();
        let record = Record {
            order: self.order,
            fencing_token: holder.fencing_token(),
            fingerprint: self.fingerprint,
            status,
            outcome,
        };
        let written = self.store.put(&self.lookup, &holder, &record).await;
        let Err(error) = written else {
            // A retry now replays from the record without the lock, so the
            // response need not wait for the release: it goes on in the
            // background (a key it misses expires with its TTL).
            release_in_background(self.lock);
            return Ok(());
        };
        self.lock.release().await;
        tracing::warn!(%error, "idempotency record not written; the next copy runs the work");
        match self.policy.lock.lost {
            LostPolicy::Signal => Ok(()),
            LostPolicy::Abort => {
                let rejection = match error {
                    super::store::StoreError::Lost | super::store::StoreError::NotHeld { .. } => {
                        IdempotencyRejection::Lock(crate::request::Rejection::Lost {
                            key: Arc::from(holder.key()),
                        })
                    }
                    other => IdempotencyRejection::Store(other),
                };
                Err(rejection)
            }
        }
    }
}

/// Releases `lock` in a task of its own, or (outside a Tokio runtime) by
/// dropping it, which releases in the background as well.
fn release_in_background(lock: RequestLock) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(lock.release());
        }
        Err(_) => drop(lock),
    }
}
