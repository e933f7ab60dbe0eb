//! The distlock page's extension: compare-and-pexpire on every node at once,
//! counted only with a quorum inside the current validity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tracing::Instrument;

use crate::error::{Error, NodeError, NodeStatus};
use crate::lock::Lock;
use crate::node::{Call, EXTEND, parse_flag};
use crate::redlock::Redlock;
use crate::steps::{instant_after, validity};

impl Redlock {
    /// Spec step "extend": compare-and-pexpire to `ttl` on every node at once. It
    /// counts only if a quorum agrees before the current validity ends; the new
    /// validity is then `ttl - elapsed - drift` from the call's start.
    ///
    /// # Errors
    /// [`Error::Expired`] if the validity already ran out, [`Error::NotHeld`] when
    /// the key is gone from too many nodes, [`Error::NoQuorum`] when nodes failed,
    /// [`Error::ExtensionLimit`], or a TTL error (a zero TTL is refused before
    /// sending: `PEXPIRE 0` would delete the key).
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        self.check_ttl(ttl)?;
        if let Some(limit) = self.inner.settings.max_extensions
            && lock.extensions >= limit
        {
            return Err(Error::ExtensionLimit {
                resource: Arc::clone(&lock.resource),
                limit,
            });
        }
        let start = Instant::now();
        if start >= lock.valid_until {
            return Err(Error::Expired {
                resource: Arc::clone(&lock.resource),
            });
        }
        // A TTL shorter than what is left shortens the keys on every node that
        // applies it, whatever the outcome here (a late answer, a minority): the
        // validity is lowered to what the new TTL allows before anything is sent,
        // and stays lowered if the extend fails.
        let capped = validity(ttl, Duration::ZERO, &self.inner.settings)
            .map_or(start, |v| instant_after(start, v));
        lock.valid_until = lock.valid_until.min(capped);
        let span = tracing::debug_span!(
            "redlock.extend",
            resource = %lock.resource,
            extension = lock.extensions.saturating_add(1),
            ttl_ms = ttl.as_millis() as u64,
        );
        let _enter = span.enter();
        let call = Arc::new(Call::script(
            &EXTEND,
            Arc::clone(&lock.key),
            vec![lock.token.to_string(), ttl.as_millis().to_string()],
        ));
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        let (mut ok, mut not_ok, mut not_held) = (0, 0, 0);
        drop(_enter);
        let mut pending = self.fan_out(&call, parse_flag, 0..n);
        let settled = self
            .settle(&mut pending, |s| {
                match s.result {
                    Ok(true) => ok += 1,
                    Ok(false) | Err(NodeError::WrongType { .. }) => {
                        not_ok += 1;
                        not_held += 1;
                    }
                    Err(_) => not_ok += 1,
                }
                ok >= q || n - not_ok < q
            })
            .instrument(span.clone())
            .await;
        let now = Instant::now();
        let elapsed = now - start;
        // The nodes that have not answered still get their `PEXPIRE`: dropping
        // their calls now could cancel them before they are written (the redis
        // connection skips a request nobody waits for), leaving those keys to
        // expire early and the lock on a bare quorum.
        if !pending.is_empty()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { while pending.next().await.is_some() {} });
        }
        let report = self.report(&settled, |&b| {
            if b {
                NodeStatus::Ok
            } else {
                NodeStatus::NotHeld
            }
        });
        let validity = validity(ttl, elapsed, &self.inner.settings);
        span.in_scope(|| tracing::debug!(ok, elapsed_us = elapsed.as_micros() as u64, validity_ms = validity.map(|v| v.as_millis() as u64), report = %report, "extend"));
        match validity {
            Some(v) if ok >= q && now < lock.valid_until => {
                lock.started = start;
                lock.valid_until = instant_after(now, v);
                lock.ttl = ttl;
                lock.extensions = lock.extensions.saturating_add(1);
                Ok(())
            }
            _ if ok >= q => Err(Error::Expired {
                resource: Arc::clone(&lock.resource),
            }),
            _ if n - not_held < q => Err(Error::NotHeld {
                resource: Arc::clone(&lock.resource),
                report,
            }),
            _ => Err(Error::NoQuorum {
                resource: Arc::clone(&lock.resource),
                ok,
                quorum: q,
                report,
            }),
        }
    }
}
