//! The response body: the inner body holding the lock until its end, or the small
//! body of a rejection.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use redlock_core::request::{ReleaseFuture, RequestLock};

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            lock: Option<RequestLock>,
            // The release in progress at the end of the body, and the last frame
            // held back until it completes.
            releasing: Option<ReleaseFuture>,
            last: Option<Frame<Bytes>>,
        },
        Rejection {
            bytes: Option<Bytes>,
        },
    }
}

pin_project! {
    /// The body of a response that went through [`RedlockLayer`](crate::RedlockLayer).
    ///
    /// For a locked request it is the handler's body, and it holds the lock until
    /// the end of the stream: `poll_frame` returned `None`, or `is_end_stream()`
    /// turned true after a frame (with an exact `Content-Length`, nothing polls
    /// again), or an error, or the body was dropped (client gone). For a rejected
    /// request it is the small problem document.
    pub struct RedlockBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> RedlockBody<B> {
    pub(crate) fn inner(body: B, lock: Option<RequestLock>) -> Self {
        Self {
            kind: Kind::Inner {
                body,
                lock,
                releasing: None,
                last: None,
            },
        }
    }

    pub(crate) fn rejection(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Rejection {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    /// Whether this body still holds a lock.
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { lock: Some(_), .. })
    }
}

impl<B> std::fmt::Debug for RedlockBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBody")
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}

impl<B> Body for RedlockBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner {
                mut body,
                lock,
                releasing,
                last,
            } => loop {
                if let Some(release) = releasing {
                    ready!(release.as_mut().poll(cx));
                    *releasing = None;
                    // The keys are gone: now the client may see the end.
                    return Poll::Ready(last.take().map(Ok));
                }
                let polled = ready!(body.as_mut().poll_frame(cx));
                let Some(held) = lock.take() else {
                    return Poll::Ready(polled);
                };
                match polled {
                    // The end: release, then report the end.
                    None => *releasing = Some(held.release()),
                    // The last frame (exact length): hold it back until released.
                    Some(Ok(frame)) if body.is_end_stream() => {
                        *last = Some(frame);
                        *releasing = Some(held.release());
                    }
                    Some(Ok(frame)) => {
                        *lock = Some(held);
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // A failed body: the response is over; release in the background.
                    Some(Err(e)) => {
                        drop(held);
                        return Poll::Ready(Some(Err(e)));
                    }
                }
            },
            KindProj::Rejection { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While a lock is held, the end is reported only after the release.
            Kind::Inner {
                body,
                lock,
                releasing,
                last,
            } => lock.is_none() && releasing.is_none() && last.is_none() && body.is_end_stream(),
            Kind::Rejection { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
