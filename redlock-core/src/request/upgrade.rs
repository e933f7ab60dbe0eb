//! Upgraded connections (WebSocket and other `101 Switching Protocols`
//! answers, and tunnels opened by `CONNECT`): the session runs after the
//! response, so the end of the response body cannot be what releases the lock.
//!
//! The rule both adapters follow: the lock of an upgraded request is kept
//! until the response body has ended (empty under axum, the outgoing frames
//! under actix) **and** the last clone of the [`LockHandle`](crate::LockHandle)
//! lent to the handler has been dropped, so a session that owns the handle (it
//! moved it into its task) holds the lock exactly as long as it runs. It ends
//! earlier only by loss or [`LockOptions::max_hold`](crate::LockOptions::max_hold),
//! which the handle reports. The handles are counted, not the session: a
//! handle the handler keeps elsewhere keeps the lock too.

use std::sync::Arc;

use super::RequestLock;

/// Whether a response with `status` upgrades its connection, so that what
/// runs under the lock goes on after the response: `101 Switching Protocols`,
/// or a `2xx` answer to a `CONNECT` request (`connect`), as in HTTP/2
/// WebSockets (RFC 8441) and tunnels.
pub fn is_upgrade(status: u16, connect: bool) -> bool {
    status == 101 || (connect && (200..300).contains(&status))
}

impl RequestLock {
    /// For a response that upgrades its connection (see [`is_upgrade`]): keeps
    /// the lock while any handle lent out with [`handle`](Self::handle) is
    /// alive, and releases it (in the background) when the last one is dropped,
    /// or at once if that already happened meanwhile.
    ///
    /// Returns the lock, unchanged, when no lent handle is alive: nothing can
    /// tell when the session ends, and the caller releases as it would have.
    #[must_use = "a lock given back is released when dropped, in the background"]
    pub fn keep_while_lent(mut self) -> Option<Self> {
        let Some(keep) = self.handle.keep.take() else {
            return Some(self);
        };
        // Only `self` makes new handles, so with no other reference now none
        // can appear.
        if Arc::strong_count(&keep) == 1 {
            self.handle.keep = Some(keep);
            return Some(self);
        }
        // The lock goes in before this reference is dropped: if the last lent
        // handle went meanwhile, dropping `keep` here drops the lock. (`self`
        // no longer refers to `keep`, so the two do not keep each other.)
        keep.hold(Box::new(self));
        None
    }
}
