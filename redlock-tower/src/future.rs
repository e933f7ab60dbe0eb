//! [`ResponseFuture`]: acquire, then run the handler under the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use redlock_core::request::{self, Guarded, Rejection, ReleaseFuture, ReleasePolicy, RequestLock};
use tower_service::Service;

use crate::body::LockedBody;
use crate::config::Config;

type Acquire = Pin<Box<dyn Future<Output = Result<Option<RequestLock>, Rejection>> + Send>>;

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
        ResBody: Body,
    {
        Acquiring {
            acquire: Acquire,
            service: Option<S>,
            request: Option<Request<ReqBody>>,
        },
        Running {
            #[pin]
            future: Guarded<S::Future>,
            lock: Option<RequestLock>,
        },
        // The handler has answered. The head is held back until the release
        // has completed (`ReleasePolicy::ResponseHead`), or until the body has
        // been polled once, and released if that ended it (`BodyEnd`).
        Settling {
            release: Option<ReleaseFuture>,
            response: Option<Response<LockedBody<ResBody>>>,
        },
        Rejected {
            rejection: Option<Rejection>,
        },
    }
}

pin_project! {
    /// The response future of [`RedlockService`](crate::RedlockService).
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
        ResBody: Body,
    {
        #[pin]
        state: State<S, ReqBody, ResBody>,
        config: Arc<Config>,
        // The request is a `CONNECT`: a 2xx answer opens a tunnel.
        connect: bool,
        // The request gets gRPC answers (see `crate::grpc`).
        grpc: bool,
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
    ResBody: Body,
{
    pub(crate) fn acquiring(
        acquire: Acquire,
        service: S,
        request: Request<ReqBody>,
        config: Arc<Config>,
    ) -> Self {
        Self {
            connect: request.method() == http::Method::CONNECT,
            grpc: config.grpc.answers_grpc(request.headers()),
            state: State::Acquiring {
                acquire,
                service: Some(service),
                request: Some(request),
            },
            config,
        }
    }

    pub(crate) fn unlocked(future: S::Future, config: Arc<Config>) -> Self {
        Self {
            state: State::Running {
                future: request::guard(future, None, &config.policy),
                lock: None,
            },
            config,
            connect: false,
            grpc: false,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Output = Result<Response<LockedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    service,
                    request,
                } => {
                    let acquired = ready!(acquire.as_mut().poll(cx));
                    let (Some(mut service), Some(mut request)) = (service.take(), request.take())
                    else {
                        // Only reachable if polled after a panic inside `call`.
                        return Poll::Ready(Ok(reject(
                            Rejection::MissingHandle,
                            this.config,
                            *this.grpc,
                        )));
                    };
                    match acquired {
                        Ok(lock) => {
                            if let Some(lock) = &lock {
                                let handle = lock.handle();
                                if let Some(token) = handle.fencing_token() {
                                    request.extensions_mut().insert(token);
                                }
                                request.extensions_mut().insert(handle);
                            }
                            let future = request::guard(
                                service.call(request),
                                lock.as_ref(),
                                &this.config.policy,
                            );
                            this.state.set(State::Running { future, lock });
                        }
                        Err(rejection) => this.state.set(State::Rejected {
                            rejection: Some(rejection),
                        }),
                    }
                }
                StateProj::Running { future, lock } => match ready!(future.poll(cx)) {
                    Ok(Ok(mut response)) => {
                        if let (Some(name), Some(token)) = (
                            this.config.policy.fencing_header_name(),
                            lock.as_ref().and_then(|l| l.handle().fencing_token()),
                        ) && let Ok(name) = http::HeaderName::from_bytes(name.as_bytes())
                        {
                            response
                                .headers_mut()
                                .insert(name, http::HeaderValue::from(token.get()));
                        }
                        let held = lock.take();
                        let upgrade =
                            request::is_upgrade(response.status().as_u16(), *this.connect);
                        let (release, held) = match (this.config.policy.release_policy(), held) {
                            (ReleasePolicy::ResponseHead, Some(held)) => {
                                (Some(held.release()), None)
                            }
                            // The session runs after the (empty) body: the
                            // handles lent to it hold the lock.
                            (ReleasePolicy::BodyEnd, Some(held)) if upgrade => {
                                (None, held.keep_while_lent().map(unguarded_session))
                            }
                            (_, held) => (None, held),
                        };
                        this.state.set(State::Settling {
                            release,
                            response: Some(response.map(|body| {
                                LockedBody::inner(body, held, this.config.policy.lost_policy())
                                    .grpc(*this.grpc)
                            })),
                        });
                    }
                    Ok(Err(error)) => {
                        drop(lock.take());
                        return Poll::Ready(Err(error));
                    }
                    Err(rejection) => {
                        // Lost: drop the handler's future first, then answer.
                        this.state.set(State::Rejected { rejection: None });
                        return Poll::Ready(Ok(reject(rejection, this.config, *this.grpc)));
                    }
                },
                StateProj::Settling { release, response } => {
                    if let Some(pending) = release {
                        ready!(pending.as_mut().poll(cx));
                        *release = None;
                    }
                    let Some(mut ready) = response.take() else {
                        return Poll::Ready(Ok(reject(
                            Rejection::MissingHandle,
                            this.config,
                            *this.grpc,
                        )));
                    };
                    return match ready.body_mut().poll_settle(cx) {
                        Poll::Pending => {
                            *response = Some(ready);
                            Poll::Pending
                        }
                        // Lost before the head: the handler's response is
                        // dropped, as a handler that finished late is.
                        Poll::Ready(Some(rejection)) => {
                            drop(ready);
                            Poll::Ready(Ok(reject(rejection, this.config, *this.grpc)))
                        }
                        Poll::Ready(None) => Poll::Ready(Ok(ready)),
                    };
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection.take().unwrap_or(Rejection::MissingHandle);
                    return Poll::Ready(Ok(reject(rejection, this.config, *this.grpc)));
                }
            }
        }
    }
}

static UNGUARDED_LOGGED: AtomicBool = AtomicBool::new(false);

/// An upgrade whose handler kept no handle: nothing tells when its session
/// ends, so the lock is released with the (empty) body, as before the session
/// starts. Logged as a warning once per process: the cause is the app's code.
fn unguarded_session(lock: RequestLock) -> RequestLock {
    if UNGUARDED_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::debug!("an upgraded request's handler kept no `Held`; released");
    } else {
        tracing::warn!(
            key = lock.handle().key(),
            "a handler answered an upgrade (101) but kept no `Held`: the lock is released now and \
             the session runs unlocked; move the `Held` into the session (`on_upgrade`) to hold \
             the lock until the session ends. Logged once."
        );
    }
    lock
}

/// The response for a rejection: a gRPC status for a gRPC request, else the
/// app's handler if it set one, else the problem document.
fn reject<B: Body>(rejection: Rejection, config: &Config, grpc: bool) -> Response<LockedBody<B>> {
    let response = if grpc {
        crate::grpc::status::response(&rejection, config.grpc.busy)
    } else {
        crate::rejection::response(&rejection, config.on_rejection.as_ref())
    };
    response.map(LockedBody::rejection)
}
