//! [`LockedBody`]: a response body that keeps the request's lock until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use redlock_core::request::RequestLock;

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
    }
}

impl<B> LockedBody<B> {
    pub(crate) fn new(body: B, lock: Option<RequestLock>) -> Self {
        Self { body, lock }
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
        let this = self.project();
        let chunk = ready!(this.body.poll_next(cx));
        if !matches!(chunk, Some(Ok(_))) {
            // The last chunk was sent (or the body failed): let the lock go now
            // rather than when actix drops the response.
            this.lock.take();
        }
        Poll::Ready(chunk)
    }
}
