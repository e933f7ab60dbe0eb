//! An operator's look at a semaphore ([`Redlock::inspect_permits`]): each
//! permit slot read as a mutex's key is (who holds it on each node, its PTTL),
//! and how many slots are held, free or unclear. Reads only.

use futures_util::future::join_all;

use super::{check_permits, permit_key};
use crate::error::Error;
use crate::inspect::{Inspection, NodeView, Verdict};
use crate::protocol::redlock::Core;

/// What [`Redlock::inspect_permits`](crate::Redlock::inspect_permits) found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PermitsInspection {
    /// The resource.
    pub resource: String,
    /// Its lock key (the slots' keys are in [`PermitsInspection::slots`]).
    pub key: String,
    /// How many permits were asked about.
    pub permits: u32,
    /// The quorum the handle uses.
    pub quorum: usize,
    /// Each slot's inspection, slot 0 first: its key, each node's view and
    /// its verdict, as [`Redlock::inspect`](crate::Redlock::inspect) gives for a mutex.
    pub slots: Vec<Inspection>,
    /// How many slots are held, free or unclear.
    pub verdict: PermitsVerdict,
    /// The count each node keeps for the semaphore while a permit of it is
    /// held (`None`: none), which every client of it must use
    /// ([`Error::PermitsMismatch`]).
    pub counts: Vec<NodeView<Option<String>>>,
}

/// How many of a semaphore's permits are in use, by the slots' verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitsVerdict {
    /// Slots one holder holds on a quorum ([`Verdict::Held`]).
    pub held: u32,
    /// Slots no holder can hold ([`Verdict::Free`]).
    pub free: u32,
    /// Slots whose verdict is [`Verdict::Inconsistent`] or
    /// [`Verdict::Unknown`] (the slot's own verdict says why): each may be
    /// held or free.
    pub unclear: u32,
}

impl Core {
    /// [`Redlock::inspect_permits`](crate::Redlock::inspect_permits).
    pub(crate) async fn inspect_permits(
        &self,
        resource: &str,
        permits: u32,
    ) -> Result<PermitsInspection, Error> {
        self.check_resource(resource)?;
        check_permits(permits)?;
        let key = self.key_for(resource);
        let slots =
            join_all((0..permits).map(|slot| self.inspect_key(resource, permit_key(&key, slot))))
                .await;
        let mut get = redis::cmd("GET");
        get.arg(crate::slots::derived(&key, crate::keys::PERMITS_SUFFIX));
        let counts = self.read_nodes(&get, read_count).await;
        let mut verdict = PermitsVerdict {
            held: 0,
            free: 0,
            unclear: 0,
        };
        for slot in &slots {
            match slot.verdict {
                Verdict::Held { .. } => verdict.held += 1,
                Verdict::Free => verdict.free += 1,
                _ => verdict.unclear += 1,
            }
        }
        Ok(PermitsInspection {
            resource: resource.to_owned(),
            key,
            permits,
            quorum: self.inner.quorum,
            slots,
            verdict,
            counts,
        })
    }
}

/// A node's `GET` of the count: the count, or `None` for no key.
fn read_count(v: redis::Value) -> Option<Option<String>> {
    match v {
        redis::Value::Nil => Some(None),
        redis::Value::BulkString(b) => Some(Some(String::from_utf8_lossy(&b).into_owned())),
        _ => None,
    }
}
