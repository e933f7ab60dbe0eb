//! [`LockedBody`]: a response body that keeps the request's lock until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use redlock_core::request::{ReleaseFuture, RequestLock};

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // The handler's body, streamed.
        Stream {
            #[pin]
            body: B,
            lock: Option<RequestLock>,
            // The release in progress once the body ended; the end is reported
            // after it.
            releasing: Option<ReleaseFuture>,
        },
        // An in-memory body whose lock was released before the head went out.
        Whole {
            bytes: Option<Bytes>,
        },
    }
}

pin_project! {
    /// The handler's body, wrapped by [`RedlockMiddleware`](crate::RedlockMiddleware).
    ///
    /// With [`ReleasePolicy::BodyEnd`](crate::ReleasePolicy::BodyEnd) (the
    /// default) the lock lasts until the body ends, and the end reaches the
    /// client only after the release, so a client holding the whole response can
    /// take the lock at once:
    /// - an in-memory body (one that `MessageBody::try_into_bytes` gives up, like
    ///   a `String` or `Bytes` answer) is released before the head is sent, and
    ///   then goes out whole;
    /// - a streamed body owns the lock and releases it when `poll_next` returns
    ///   `None` or an error, or when it is dropped (the client went away).
    ///
    /// Otherwise it is the handler's body unchanged.
    pub struct LockedBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> LockedBody<B> {
    pub(crate) fn new(body: B, lock: Option<RequestLock>) -> Self {
        Self {
            kind: Kind::Stream {
                body,
                lock,
                releasing: None,
            },
        }
    }

    pub(crate) fn whole(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Whole {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    /// Whether the body still holds a lock.
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Stream { lock: Some(_), .. })
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
        match &self.kind {
            Kind::Stream { body, .. } => body.size(),
            Kind::Whole { bytes } => BodySize::Sized(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Stream {
                mut body,
                lock,
                releasing,
            } => loop {
                if let Some(release) = releasing.as_mut() {
                    ready!(release.as_mut().poll(cx));
                    *releasing = None;
                    // The keys are gone: now the client may see the end.
                    return Poll::Ready(None);
                }
                let chunk = ready!(body.as_mut().poll_next(cx));
                match (chunk, lock.take()) {
                    (None, Some(held)) => *releasing = Some(held.release()),
                    // A failed body: the response is over; release in the background.
                    (Some(Err(e)), held) => {
                        drop(held);
                        return Poll::Ready(Some(Err(e)));
                    }
                    (chunk, held) => {
                        *lock = held;
                        return Poll::Ready(chunk);
                    }
                }
            },
            KindProj::Whole { bytes } => Poll::Ready(bytes.take().map(Ok)),
        }
    }

    fn try_into_bytes(self) -> Result<Bytes, Self> {
        match self.kind {
            Kind::Whole { bytes } => Ok(bytes.unwrap_or_default()),
            kind => Err(Self { kind }),
        }
    }
}
