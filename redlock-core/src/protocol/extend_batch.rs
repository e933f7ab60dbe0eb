//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! The distlock page's extension for many locks at once: one call per node
//! of the coalescer's batch script (`node/coalesce.rs`), a compare-and-pexpire
//! per key of the batch, each lock counted on its own
//! quorum inside its own validity.
//!
//! The auto-extension schedule (`guard/schedule.rs`) renews a handle's held
//! locks this way, so that renewing a hundred locks costs each node one call
//! rather than a hundred.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::Value;

use crate::error::{Error, NodeError, NodeStatus, Report};
use crate::node::{BATCH as BATCH_SCRIPT, BATCH_OPS, Call, Shape, renewal_code};
use crate::protocol::extend::{Extended, answered};
use crate::protocol::fan_out::Settled;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::validity;

/// At most this many keys go in one script call: a coalesced batch's bound
/// (a node runs a script alone, so a batch is kept short enough not to hold
/// up other clients' calls; Redisson renews 100 locks per call for the same
/// reason).
pub(crate) const BATCH: usize = BATCH_OPS;

/// One lock's outcome in a batch.
pub(crate) struct BatchOutcome {
    /// When this lock's outcome was decided.
    pub(crate) decided: Instant,
    /// The extend's verdict, as [`Redlock::extend`] gives it.
    pub(crate) result: Result<(), Error>,
}

/// One lock's tally while the nodes answer.
struct Tally {
    ok: usize,
    not_ok: usize,
    not_held: usize,
    decided: Option<Instant>,
}

/// The batch script's reply: one flag per key, in the order sent.
fn parse_flags(v: Value) -> Result<Vec<bool>, NodeError> {
    match v {
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Int(1) => Ok(true),
                Value::Int(0) => Ok(false),
                other => Err(NodeError::Protocol(format!("batch extend flag {other:?}"))),
            })
            .collect(),
        other => Err(NodeError::Protocol(format!("batch extend reply {other:?}"))),
    }
}

impl Core {
    /// Spec step "extend" for each `(lock, ttl, deadline)` of `batch` (at most [`BATCH`]),
    /// in one script call per node. Each lock is judged as by
    /// [`Redlock::extend`]: its TTL and extension limit are checked first, a
    /// shorter TTL lowers its validity before anything is sent, and it counts
    /// as extended only if a quorum of nodes extended *its* key with *its*
    /// token before its validity ended; its new validity is
    /// `ttl - elapsed - drift` from its own start. A node's failure (timeout,
    /// error reply, a reply of the wrong length) counts against every lock of
    /// the batch on that node. A lock not decided before `deadline` (its
    /// holder's: the validity less the loss margin) is `Expired`, not
    /// extended: its holder was told "lost" by then.
    ///
    /// A batch of one is [`Redlock::extend`] itself: its script is the one
    /// every node already runs for manual extends, and a lone lock saves
    /// nothing by the batch script. So is a batch with a lock over several
    /// resources: the batch script extends one key per lock, and such a lock
    /// counts only where every one of its keys was extended.
    ///
    /// Returns one outcome per lock, in order.
    pub(crate) async fn extend_batch(
        &self,
        batch: &mut [(&mut Lock, Duration, Instant)],
    ) -> Vec<BatchOutcome> {
        // A lone lock, or a batch holding a lock over several resources
        // (whose every key must be extended, by its own script): each lock
        // by `extend`, at once.
        if batch.len() == 1 || batch.iter().any(|(lock, ..)| lock.many.is_some()) {
            let each = batch.iter_mut().map(|(lock, ttl, deadline)| async move {
                let (result, decided) = self.extend_before(lock, *ttl, Some(*deadline)).await;
                BatchOutcome { decided, result }
            });
            return futures_util::future::join_all(each).await;
        }
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        // Checked per lock; a lock refused here is not sent.
        let checks: Vec<Result<Instant, Error>> = batch
            .iter_mut()
            .map(|(lock, ttl, _)| {
                let start = self.check_extend(lock, *ttl)?;
                lock.valid_until = lock.valid_until.min(self.extend_cap(*ttl, start));
                Ok(start)
            })
            .collect();
        let sent: Vec<usize> = (0..batch.len()).filter(|&i| checks[i].is_ok()).collect();
        let mut tallies: Vec<Tally> = checks
            .iter()
            .map(|_| Tally {
                ok: 0,
                not_ok: 0,
                not_held: 0,
                decided: None,
            })
            .collect();
        let mut settled: Vec<Option<Settled<Vec<bool>>>> = (0..n).map(|_| None).collect();
        if !sent.is_empty() {
            // The coalescer's batch script, one renewal code per key: the
            // renewal is one user of the node's one batch mechanism, with
            // its batch formed up front (`node/coalesce.rs`).
            let ttls: Vec<String> = sent
                .iter()
                .map(|&i| renewal_code(batch[i].1.as_millis()))
                .collect();
            let keys: Vec<&[u8]> = sent.iter().map(|&i| batch[i].0.key.as_bytes()).collect();
            let args: Vec<&[u8]> = sent
                .iter()
                .zip(&ttls)
                .flat_map(|(&i, ttl)| [batch[i].0.token.as_bytes(), ttl.as_bytes()])
                .collect();
            let call = Arc::new(Call::keys_per_slot(
                &BATCH_SCRIPT,
                &keys,
                &args,
                Shape::ExtendBatch,
            ));
            let span = tracing::debug_span!("redlock.extend_batch", locks = sent.len());
            let mut pending = self.fan_out(&call, parse_flags, 0..n);
            let mut undecided = sent.len();
            settled = self
                .settle(&mut pending, |s| {
                    let now = Instant::now();
                    let flags = s.result.as_ref().ok().filter(|f| f.len() == sent.len());
                    for (j, &i) in sent.iter().enumerate() {
                        let t = &mut tallies[i];
                        match flags.map(|f| f[j]) {
                            Some(true) => t.ok += 1,
                            Some(false) => {
                                t.not_ok += 1;
                                t.not_held += 1;
                            }
                            None => t.not_ok += 1,
                        }
                        if t.decided.is_none() && (t.ok >= q || n - t.not_ok < q) {
                            t.decided = Some(now);
                            undecided -= 1;
                        }
                    }
                    undecided == 0
                })
                .await;
            // As in `Redlock::extend`: the nodes that have not answered still
            // get their `PEXPIRE`s, so no key is left to expire early.
            if !pending.is_empty()
                && let Ok(rt) = tokio::runtime::Handle::try_current()
            {
                rt.spawn(async move { while pending.next().await.is_some() {} });
            }
            span.in_scope(|| tracing::debug!(locks = sent.len(), "batch extend"));
        }
        let end = Instant::now();
        batch
            .iter_mut()
            .zip(checks)
            .zip(tallies)
            .enumerate()
            .map(|(i, (((lock, ttl, deadline), check), t))| {
                let decided = t.decided.unwrap_or(end);
                if check.is_ok() && decided >= *deadline {
                    let result = Err(Error::Expired {
                        resource: Arc::clone(&lock.resource),
                    });
                    self.extended(lock, &result);
                    return BatchOutcome { decided, result };
                }
                let result = check.and_then(|start| {
                    let now = t.decided.unwrap_or(end);
                    let validity = validity(
                        *ttl,
                        now.saturating_duration_since(start),
                        &self.inner.settings,
                    );
                    let held = t.ok >= q && validity.is_some() && now < lock.valid_until;
                    // The per-node report only when it is part of an error.
                    let report = if held {
                        Report { nodes: Vec::new() }
                    } else {
                        let j = sent.iter().position(|&s| s == i);
                        self.report(&settled, |flags: &Vec<bool>| {
                            match j.and_then(|j| flags.get(j)) {
                                Some(true) => NodeStatus::Ok,
                                _ => NodeStatus::NotHeld,
                            }
                        })
                    };
                    let j = sent.iter().position(|&s| s == i);
                    let nodes = settled
                        .iter()
                        .map(|s| {
                            answered(s.as_ref(), |flags: &Vec<bool>| {
                                j.and_then(|j| flags.get(j)).copied().unwrap_or(false)
                            })
                        })
                        .collect();
                    let extended = Extended {
                        now,
                        ok: t.ok,
                        not_held: t.not_held,
                        validity,
                        report,
                        nodes,
                    };
                    self.apply_extend(lock, *ttl, start, extended, *deadline)
                });
                self.extended(lock, &result);
                BatchOutcome { decided, result }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_in_order_and_refuse_other_shapes() {
        let reply = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(1)]);
        assert_eq!(parse_flags(reply).ok(), Some(vec![true, false, true]));
        assert!(parse_flags(Value::Int(1)).is_err());
        assert!(parse_flags(Value::Array(vec![Value::Int(2)])).is_err());
    }
}
