//! [`LockedBody`]: a response body that keeps the request's lock until it ends,
//! and is cut off if the lock is lost first.

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use redlock_core::request::{LossWatch, LostPolicy, ReleaseFuture, RequestLock};

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
            // The last chunk of a sized body, given out once the release has
            // completed: actix flushes what it has whenever the body is
            // pending, so the client would otherwise have the whole response
            // while the lock is still held.
            last: Option<Bytes>,
            // The bytes a sized body has still to produce.
            left: Option<u64>,
            // The response upgrades its connection: at the end of the body the
            // lock goes to the handles lent to the session
            // (`RequestLock::keep_while_lent`).
            upgrade: bool,
            // Set while `lock` is held under `LostPolicy::Abort`.
            watch: Option<LossWatch>,
        },
        // An in-memory body whose lock was released before the head went out.
        Whole {
            bytes: Option<Bytes>,
        },
        // The lock was lost while the body streamed: the handler's body is
        // dropped, so nothing more is produced without the lock, and the error
        // (given out once) makes actix close the connection instead of ending
        // the response cleanly.
        Cut {
            error: Option<redlock_core::Error>,
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
    ///   `None` or an error, or when it is dropped (the client went away); the
    ///   last chunk of a body of known length (`BodySize::Sized`, as
    ///   `no_chunking(n).streaming(..)` and `NamedFile` answer) is that body's
    ///   end for the client, so it is given out only once the release has
    ///   completed (actix sends what it has whenever the body is pending);
    /// - the body of a response that upgrades its connection (a WebSocket's
    ///   frames) hands the lock, at its end, to the handles lent to the
    ///   handler, and it is released when the last of them is dropped.
    ///
    /// If the lock is lost while a streamed body holds it, under the default
    /// [`LostPolicy::Abort`](crate::LostPolicy::Abort), the body is cut off: the
    /// handler's body is dropped (not polled again), the loss is logged, and
    /// `poll_next` yields the error [`redlock_core::Error::Lost`], on which
    /// actix closes the connection, so the client sees a truncated response
    /// rather than a clean end. The loss is watched at every `poll_next`, and a
    /// body waiting on its producer is woken by it; it is checked again after
    /// each poll of the handler's body, so a chunk made in the poll in which the
    /// lock was lost (a producer that blocked the worker past the deadline) is
    /// dropped, not sent, and the body is cut off there. Under
    /// [`LostPolicy::Signal`](crate::LostPolicy::Signal) the body keeps
    /// streaming: the handler chose to watch `LockHandle::lost` itself. The
    /// error type boxes the handler body's own errors and this one.
    ///
    /// Otherwise it is the handler's body unchanged.
    pub struct LockedBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> LockedBody<B> {
    pub(crate) fn new(body: B, lock: Option<RequestLock>, on_lost: LostPolicy) -> Self
    where
        B: MessageBody,
    {
        Self::streamed(body, lock, on_lost, false)
    }

    /// The body of a response that upgrades its connection when `upgrade`.
    pub(crate) fn streamed(
        body: B,
        lock: Option<RequestLock>,
        on_lost: LostPolicy,
        upgrade: bool,
    ) -> Self
    where
        B: MessageBody,
    {
        let watch = LossWatch::for_body(lock.as_ref(), on_lost);
        let left = match body.size() {
            BodySize::Sized(n) => Some(n),
            BodySize::None | BodySize::Stream => None,
        };
        Self {
            kind: Kind::Stream {
                body,
                lock,
                releasing: None,
                last: None,
                left,
                upgrade,
                watch,
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
    type Error = Box<dyn StdError>;

    fn size(&self) -> BodySize {
        match &self.kind {
            Kind::Stream { body, .. } => body.size(),
            Kind::Whole { bytes } => BodySize::Sized(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            // The size was announced; cutting the body short breaks it anyway.
            Kind::Cut { .. } => BodySize::Stream,
        }
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let mut kind = self.project().kind;
        let cut = match kind.as_mut().project() {
            KindProj::Stream {
                lock: Some(_),
                watch: Some(watch),
                ..
            } => match watch.poll_lost(cx) {
                Poll::Ready(error) => Some(error),
                Poll::Pending => None,
            },
            _ => None,
        };
        if let Some(error) = cut {
            // Drops the handler's body, and the lock (released in the background).
            kind.set(Kind::Cut { error: Some(error) });
        }
        let lost = match kind.as_mut().project() {
            KindProj::Stream {
                mut body,
                lock,
                releasing,
                last,
                left,
                upgrade,
                watch,
            } => loop {
                if let Some(release) = releasing.as_mut() {
                    ready!(release.as_mut().poll(cx));
                    *releasing = None;
                    // The keys are gone: now the client may see the end (or
                    // the last chunk of a sized body, which is the end for it).
                    return Poll::Ready(last.take().map(Ok));
                }
                let chunk = ready!(body.as_mut().poll_next(cx));
                // Whatever the handler's body made in a poll that ended past
                // the holder's deadline (a chunk or the end), it made without
                // the lock: it must not reach the client as if made under it.
                // A failed body ends the response anyway.
                if lock.is_some()
                    && !matches!(chunk, Some(Err(_)))
                    && let Some(error) = watch.as_ref().and_then(LossWatch::lost_now)
                {
                    break error;
                }
                if let (Some(Ok(bytes)), Some(n)) = (&chunk, left.as_mut()) {
                    *n = n.saturating_sub(bytes.len() as u64);
                }
                let ended = match &chunk {
                    None => true,
                    Some(Ok(_)) => *left == Some(0),
                    Some(Err(_)) => false,
                };
                match (chunk, lock.take()) {
                    (chunk, Some(held)) if ended => {
                        *last = chunk.and_then(Result::ok);
                        let left_to_release = if *upgrade {
                            held.keep_while_lent()
                        } else {
                            Some(held)
                        };
                        match left_to_release {
                            Some(held) => *releasing = Some(held.release()),
                            // Handed to the session; nothing to wait for.
                            None => return Poll::Ready(last.take().map(Ok)),
                        }
                    }
                    // A failed body: the response is over; release in the background.
                    (Some(Err(e)), held) => {
                        drop(held);
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    (chunk, held) => {
                        *lock = held;
                        return Poll::Ready(chunk.map(|c| c.map_err(Into::into)));
                    }
                }
            },
            KindProj::Whole { bytes } => return Poll::Ready(bytes.take().map(Ok)),
            KindProj::Cut { error } => return Poll::Ready(error.take().map(|e| Err(e.into()))),
        };
        // Drops the handler's body with the chunk it made after the loss, and
        // the lock (released in the background).
        kind.set(Kind::Cut { error: None });
        Poll::Ready(Some(Err(lost.into())))
    }

    fn try_into_bytes(self) -> Result<Bytes, Self> {
        match self.kind {
            Kind::Whole { bytes } => Ok(bytes.unwrap_or_default()),
            kind => Err(Self { kind }),
        }
    }
}
