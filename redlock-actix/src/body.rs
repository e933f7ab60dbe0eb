//! [`LockedBody`]: a response body that keeps the request's lock until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use redlock_core::request::{ReleaseFuture, RequestLock};

pin_project! {
    /// The handler's body, wrapped by [`RedlockMiddleware`](crate::RedlockMiddleware).
    ///
    /// With [`ReleasePolicy::BodyEnd`](crate::ReleasePolicy::BodyEnd) (the
    /// default) it owns the request's lock and releases it when the body ends:
    /// `poll_next` returned `None` or an error, or the body was dropped (the
    /// client went away, or actix did not need to poll an empty body). Otherwise
    /// it is the handler's body unchanged.
    pub struct LockedBody<B> {
        #[pin]
        body: B,
        lock: Option<RequestLock>,
        // The release in progress once the body ended; the end is reported
        // after it.
        releasing: Option<ReleaseFuture>,
    }
}

impl<B> LockedBody<B> {
    pub(crate) fn new(body: B, lock: Option<RequestLock>) -> Self {
        Self {
            body,
            lock,
            releasing: None,
        }
    }

    /// Whether the body still holds a lock.
    pub fn holds_lock(&self) -> bool {
        self.lock.is_some()
    }
}

impl<B> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockedBody")
            .field("holds_lock", &self.holds_lock())
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody> MessageBody for LockedBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(release) = this.releasing.as_mut() {
                ready!(release.as_mut().poll(cx));
                *this.releasing = None;
                // The keys are gone: now the client may see the end.
                return Poll::Ready(None);
            }
            let chunk = ready!(this.body.as_mut().poll_next(cx));
            match (chunk, this.lock.take()) {
                (None, Some(held)) => *this.releasing = Some(held.release()),
                // A failed body: the response is over; release in the background.
                (Some(Err(e)), held) => {
                    drop(held);
                    return Poll::Ready(Some(Err(e)));
                }
                (chunk, held) => {
                    *this.lock = held;
                    return Poll::Ready(chunk);
                }
            }
        }
    }
}
