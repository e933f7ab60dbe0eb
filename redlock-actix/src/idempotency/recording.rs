//! The body of a response over the record's cap, streamed under its
//! idempotency lock and recorded "completed, not replayable" at its end.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use futures_util::future::LocalBoxFuture;
use redlock_core::idempotency::{IdempotencyRejection, Running};
use redlock_core::request::LossWatch;

type FinishFuture = LocalBoxFuture<'static, Result<(), IdempotencyRejection>>;

/// A response body over the record's cap, streamed under its idempotency
/// lock: the lock is held, and watched, until the body ends; then the request
/// is recorded "completed, not replayable" before the end goes out. A body
/// that fails, is cut off by the lock's loss, or is dropped before its end
/// (the client gone) records nothing, and the next copy of the request runs
/// the work again.
pub(super) struct RecordingBody<B> {
    /// The part read while buffering, sent first.
    prefix: Option<Bytes>,
    rest: Option<Pin<Box<B>>>,
    /// `None` once the body has ended, failed or been cut off.
    running: Option<(Running, u16)>,
    /// Set under `LostPolicy::Abort`.
    watch: Option<LossWatch>,
    /// The record's write at the end of the body.
    finishing: Option<FinishFuture>,
    done: bool,
}

impl<B> RecordingBody<B> {
    pub(super) fn new(prefix: Bytes, rest: Pin<Box<B>>, running: Running, status: u16) -> Self {
        let watch = LossWatch::for_body(Some(running.lock()), running.lock_policy().lost_policy());
        Self {
            prefix: Some(prefix),
            rest: Some(rest),
            running: Some((running, status)),
            watch,
            finishing: None,
            done: false,
        }
    }

    /// Ends the body with `error`: nothing is recorded, and the lock is
    /// released in the background.
    fn fail(&mut self, error: BodyError) -> Poll<Option<Result<Bytes, BodyError>>> {
        self.running = None;
        self.watch = None;
        self.rest = None;
        self.done = true;
        Poll::Ready(Some(Err(error)))
    }
}

type BodyError = Box<dyn std::error::Error>;

impl<B: MessageBody> MessageBody for RecordingBody<B> {
    type Error = BodyError;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(finishing) = &mut this.finishing {
                let finished = std::task::ready!(finishing.as_mut().poll(cx));
                this.finishing = None;
                this.done = true;
                return match finished {
                    Ok(()) => Poll::Ready(None),
                    // Not recorded: the response must not look complete.
                    Err(r) => Poll::Ready(Some(Err(format!(
                        "idempotency record not written: {}",
                        r.title()
                    )
                    .into()))),
                };
            }
            if let Some(watch) = &mut this.watch
                && let Poll::Ready(error) = watch.poll_lost(cx)
            {
                return this.fail(error.into());
            }
            if let Some(prefix) = this.prefix.take() {
                return Poll::Ready(Some(Ok(prefix)));
            }
            let Some(rest) = &mut this.rest else {
                this.done = true;
                return Poll::Ready(None);
            };
            let polled = std::task::ready!(rest.as_mut().poll_next(cx));
            // A chunk or the end made in the poll in which the lock was lost
            // was made without it.
            if let Some(error) = this.watch.as_ref().and_then(LossWatch::lost_now) {
                return this.fail(error.into());
            }
            match polled {
                Some(Ok(chunk)) => return Poll::Ready(Some(Ok(chunk))),
                Some(Err(error)) => return this.fail(error.into()),
                None => {
                    this.watch = None;
                    this.rest = None;
                    match this.running.take() {
                        Some((running, status)) => {
                            this.finishing =
                                Some(Box::pin(running.finish(status, std::iter::empty(), None)));
                        }
                        None => this.done = true,
                    }
                }
            }
        }
    }
}
