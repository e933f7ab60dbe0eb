//! [`Held`]: the lock a request runs under, read from the request extensions
//! (the axum extractor is in `extract`; tonic handlers call `Held::from_tonic`).

use std::ops::Deref;

use redlock_core::LockHandle;

/// The lock [`RedlockLayer`](crate::RedlockLayer) holds for this request (the
/// [`LockHandle`] it put in the request extensions): its key, token,
/// `remaining()`, `is_lost()`, `lost().await`.
///
/// A request that runs unlocked (no key under the pass-through policy, or no
/// quorum under fail-open) has no lock: take `Option<Held>` in handlers that
/// serve such requests. `Held` alone then answers 500 ([`NotLocked`](crate::NotLocked)).
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use redlock_core::Redlock;
/// use redlock_tower::{Held, RedlockLayer};
///
/// async fn run(Held(lock): Held) -> String {
///     format!("ran under {}, {:?} left", lock.key(), lock.remaining())
/// }
///
/// async fn maybe(lock: Option<Held>) -> String {
///     match lock {
///         Some(lock) => format!("locked: {}", lock.key()),
///         None => "ran unlocked (fail-open)".into(),
///     }
/// }
///
/// # fn app(redlock: Redlock) -> Router {
/// Router::new()
///     .route("/jobs/{id}/run", post(run))
///     .route("/jobs/{id}/peek", post(maybe))
///     .layer(RedlockLayer::by_path().fail_open().with_redlock(redlock))
/// # }
/// ```
///
/// `Extension<LockHandle>` reads the same handle. In a tonic handler (feature
/// `tonic`): `let Held(lock) = Held::from_tonic(&request)?;`.
///
/// # WebSockets and other upgrades
///
/// axum answers an upgrade (`101 Switching Protocols`) with an empty body and
/// runs the session afterwards, in a task of its own. For such a response the
/// layer does not release at the end of the body: it keeps the lock until the
/// last clone of the handle lent to the handler (`Held`, `Extension<LockHandle>`)
/// is dropped. Move the `Held` into the session, and the lock lasts as long as
/// the session, renewed, with [`is_lost`](LockHandle::is_lost) and
/// [`lost`](LockHandle::lost) telling the truth inside it:
///
/// ```no_run
/// use axum::extract::ws::{WebSocket, WebSocketUpgrade};
/// use axum::response::Response;
/// use redlock_tower::{Held, LockHandle};
///
/// async fn edit(upgrade: WebSocketUpgrade, Held(lock): Held) -> Response {
///     upgrade.on_upgrade(move |socket| session(socket, lock))
/// }
///
/// async fn session(mut socket: WebSocket, lock: LockHandle) {
///     loop {
///         tokio::select! {
///             _ = lock.lost() => break, // another replica may hold the doc now
///             message = socket.recv() => match message {
///                 Some(Ok(_edit)) => { /* apply it */ }
///                 _ => break,
///             },
///         }
///     }
///     // `lock`, the last handle, is dropped here: the lock is released.
/// }
/// ```
///
/// - The layer cannot stop a session (it runs outside the request), whatever
///   the [`LostPolicy`](crate::LostPolicy): the session watches `lost()`, as
///   above. The lock ends by the last handle's drop, by loss, or at
///   [`max_hold`](crate::RedlockLayer::max_hold).
/// - A handler that kept no handle leaves nothing to follow: the lock is
///   released with the empty body, before the session starts, and a warning is
///   logged (once per process).
/// - [`ReleasePolicy::ResponseHead`](crate::ReleasePolicy::ResponseHead) still
///   releases at the head.
/// - A `2xx` answer to `CONNECT` (HTTP/2 WebSockets, tunnels) is an upgrade too.
/// - The release at the last handle's drop runs in the background: a client
///   that reconnects at once may wait for it (or get the busy answer without
///   [`wait`](crate::RedlockLayer::wait)).
#[derive(Debug, Clone)]
pub struct Held(pub LockHandle);

impl Held {
    /// The handle.
    pub fn into_inner(self) -> LockHandle {
        self.0
    }
}

impl Deref for Held {
    type Target = LockHandle;

    fn deref(&self) -> &LockHandle {
        &self.0
    }
}

#[cfg(feature = "tonic")]
impl Held {
    /// The lock of a tonic request (the handle the layer put in the request
    /// extensions, which tonic keeps in
    /// [`Request::extensions`](tonic::Request::extensions)), or `INTERNAL`
    /// if the request holds none: the service is not behind a
    /// [`RedlockLayer`](crate::RedlockLayer), or the request ran unlocked (no
    /// key, or fail-open; use [`Held::of_tonic`] there). Logged at error level
    /// once per process, as the axum extractor's answer is.
    ///
    /// ```
    /// use redlock_tower::Held;
    /// use tonic::{Request, Status};
    ///
    /// async fn run(request: Request<String>) -> Result<String, Status> {
    ///     let Held(lock) = Held::from_tonic(&request)?;
    ///     Ok(format!("{} ran under {}", request.get_ref(), lock.key()))
    /// }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    pub fn from_tonic<T>(request: &tonic::Request<T>) -> Result<Held, tonic::Status> {
        Self::of_tonic(request).ok_or_else(|| {
            crate::grpc::log_not_locked();
            tonic::Status::internal("this request holds no lock")
        })
    }

    /// The lock of a tonic request, if it holds one (see [`Held::from_tonic`]).
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    pub fn of_tonic<T>(request: &tonic::Request<T>) -> Option<Held> {
        request.extensions().get::<LockHandle>().cloned().map(Held)
    }
}
