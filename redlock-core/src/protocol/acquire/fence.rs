//! Fencing steps 2 and 3 (protocol layer, part of the acquire), the round trip a fencing lock adds to its acquire:
//! pick the token, raise the counters to it, decided at quorum within the
//! validity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::error::{Error, NodeStatus};
use crate::fencing::{FencingMode, FencingToken, counter_ttl, fence_key, pick_token};
use crate::node::{AcquireReply, Call, FENCE, parse_flag};
use crate::protocol::fan_out::Settled;
use crate::protocol::redlock::Core;
use crate::protocol::steps::validity;

/// The outcome of a fence phase that reached its quorum in time.
pub(crate) struct Fenced {
    pub(crate) token: FencingToken,
    /// Since the acquire was sent.
    pub(crate) elapsed: Duration,
    pub(crate) validity: Duration,
}

impl Core {
    /// Fencing steps 2 and 3, after an acquire quorum: picks the token from the
    /// counters the OK nodes returned, then raises the counter to it on every
    /// node that may hold the key (the OK nodes and those that have not
    /// answered yet; the script checks the token first). Decided at quorum
    /// within the validity counted from `start`; the other nodes' answers are
    /// driven in the background, as extend does. `retained` is the expiry
    /// of a per-request resource's Durable counter (`fencing::counter_ttl`).
    ///
    /// # Errors
    /// [`Error::NoFenceQuorum`] when fewer than a quorum applied it,
    /// [`Error::NoValidity`] when the quorum came too late.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fence_phase(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        token: &str,
        mode: FencingMode,
        acquired: &[Option<Settled<AcquireReply>>],
        start: Instant,
        ttl: Duration,
        retained: Option<Duration>,
        index: usize,
    ) -> Result<Fenced, Error> {
        let fencing_token = self.pick_fencing_token(resource, mode, acquired, index)?;
        let targets = fence_targets(self.inner.nodes.len(), acquired);
        let expiry = counter_ttl(mode, self.inner.settings.fence_counter_ttl, ttl, retained);
        let (applied, settled) = self
            .send_fences(key, token, fencing_token, expiry, targets)
            .await;
        let elapsed = start.elapsed();
        let report = self.report(&settled, |&b| {
            if b {
                NodeStatus::Ok
            } else {
                NodeStatus::NotHeld
            }
        });
        tracing::debug!(token = fencing_token.get(), applied, report = %report, "fence");
        let q = self.inner.quorum;
        if applied < q {
            crate::metrics::fence_refused(self.metrics_key(key));
            return Err(Error::NoFenceQuorum {
                resource: Arc::clone(resource),
                applied,
                quorum: q,
                report,
            });
        }
        match validity(ttl, elapsed, &self.inner.settings) {
            Some(validity) => Ok(Fenced {
                token: fencing_token,
                elapsed,
                validity,
            }),
            None => Err(Error::NoValidity {
                resource: Arc::clone(resource),
                elapsed,
                ttl,
            }),
        }
    }

    /// Fencing step 2: the token, picked from the counters the OK nodes
    /// returned for the lock's key number `index` (0 but for a
    /// multi-resource lock, whose keys are fenced each on its own).
    ///
    /// # Errors
    /// [`Error::NoFenceQuorum`] (applied nowhere) when no OK node returned a
    /// counter.
    fn pick_fencing_token(
        &self,
        resource: &Arc<str>,
        mode: FencingMode,
        acquired: &[Option<Settled<AcquireReply>>],
        index: usize,
    ) -> Result<FencingToken, Error> {
        let reads = acquired
            .iter()
            .flatten()
            .filter_map(|s| s.result.as_ref().ok()?.fence_read(index));
        pick_token(mode, reads).ok_or_else(|| Error::NoFenceQuorum {
            resource: Arc::clone(resource),
            applied: 0,
            quorum: self.inner.quorum,
            report: self.report(acquired, |_| NodeStatus::NotHeld),
        })
    }

    /// Fencing step 3: raises the counter to `fencing_token` on every node of
    /// `targets` at once (the script checks the key still holds `token`
    /// first), and gives it `expiry` (none: permanent), decided at quorum.
    /// Returns how many nodes applied it, and the answers that came before
    /// the outcome was decided.
    async fn send_fences(
        &self,
        key: &Arc<str>,
        token: &str,
        fencing_token: FencingToken,
        expiry: Option<Duration>,
        targets: Vec<usize>,
    ) -> (usize, Vec<Option<Settled<bool>>>) {
        let q = self.inner.quorum;
        let expiry_ms = expiry.map_or(0, |d| d.as_millis()).to_string();
        let call = Arc::new(Call::keys(
            &FENCE,
            &[key.as_bytes(), &fence_key(key)],
            &[
                token.as_bytes(),
                fencing_token.get().to_string().as_bytes(),
                expiry_ms.as_bytes(),
            ],
        ));
        let sent = targets.len();
        let (mut applied, mut refused) = (0, 0);
        let mut pending = self.fan_out(&call, parse_flag, targets.into_iter());
        let settled = self
            .settle(&mut pending, |s| {
                if matches!(s.result, Ok(true)) {
                    applied += 1;
                } else {
                    refused += 1;
                }
                applied >= q || sent - refused < q
            })
            .await;
        // The other nodes still get their fence: dropping their calls could
        // cancel them unsent, leaving those counters behind this token.
        if !pending.is_empty()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { while pending.next().await.is_some() {} });
        }
        (applied, settled)
    }
}

/// The nodes the fence goes to: every node that may hold the key, that is the
/// OK nodes and those that have not answered yet.
fn fence_targets(n: usize, acquired: &[Option<Settled<AcquireReply>>]) -> Vec<usize> {
    (0..n)
        .filter(|&i| match acquired.get(i) {
            Some(Some(s)) => s.result.as_ref().is_ok_and(AcquireReply::acquired),
            _ => true,
        })
        .collect()
}
