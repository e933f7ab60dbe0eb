//! actix-web middleware and extractor that run requests under a
//! [Redlock](redlock_core) quorum lock, so that across all replicas of a service
//! only one request per key runs at a time.
//!
//! ```no_run
//! use std::time::Duration;
//! use actix_web::{App, HttpServer, web};
//! use redlock_actix::{LockHandle, Redlock, RedlockMiddleware};
//!
//! async fn run_job(path: web::Path<(String, u64)>, lock: web::ReqData<LockHandle>) -> String {
//!     let (tenant, job) = path.into_inner();
//!     format!("job {job} of {tenant} ran under {}", lock.key())
//! }
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let redlock = Redlock::from_urls(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
//!     HttpServer::new(move || {
//!         App::new().app_data(redlock.clone()).service(
//!             web::scope("/tenants/{tenant}")
//!                 // one request per tenant at a time; wait up to 2 s for a busy tenant
//!                 .wrap(RedlockMiddleware::by_path_param("tenant").wait(Duration::from_secs(2)))
//!                 .route("/jobs/{job}/run", web::post().to(run_job)),
//!         )
//!     })
//!     .bind(("127.0.0.1", 8080))?
//!     .run()
//!     .await?;
//!     Ok(())
//! }
//! ```
//!
//! Two ways to lock:
//!
//! - [`RedlockMiddleware`], for `App::wrap`, `Scope::wrap` or `Resource::wrap`:
//!   the key comes from the request ([`by_path`](RedlockMiddleware::by_path),
//!   [`by_header`](RedlockMiddleware::by_header),
//!   [`by_match_pattern`](RedlockMiddleware::by_match_pattern),
//!   [`by_path_param`](RedlockMiddleware::by_path_param),
//!   [`by_fn`](RedlockMiddleware::by_fn)), and the lock is held until the
//!   response body has been sent;
//! - [`HeldLock`], a handler argument configured by [`HeldLockConfig`] in
//!   `app_data`, or taken inside the handler with [`HeldLock::acquire`] for a key
//!   computed from the handler's other arguments; it is released when the
//!   handler returns.
//!
//! What the middleware guarantees, per key:
//!
//! - the handler runs only while this replica holds a quorum lock;
//! - the lock is renewed while the handler runs, and released when the response
//!   body ends or is dropped (client gone), or at the response head with
//!   [`ReleasePolicy::ResponseHead`]; the client sees the end only after the
//!   release (an in-memory body is released before the head is sent; the last
//!   chunk of a streamed body of known length waits for the release);
//! - an upgraded connection (a WebSocket session, whose frames are the
//!   response body) keeps the lock until its frames have ended **and** the
//!   last clone of the handle lent to the handler is dropped, the rule of
//!   redlock-tower (see [WebSockets](#websockets));
//! - a busy key answers `409 Conflict` with `Retry-After` (from the holder's
//!   remaining TTL) and an `application/problem+json` body, or waits with
//!   [`RedlockMiddleware::wait`];
//! - no quorum of nodes answers `503` (fail closed) unless
//!   [`RedlockMiddleware::fail_open`];
//! - if the lock is lost while the handler runs, the handler's future is dropped
//!   and the client gets `503`, unless [`LostPolicy::Signal`] is chosen;
//! - the handler can read the [`LockHandle`] with `web::ReqData<LockHandle>`
//!   (`Option<web::ReqData<LockHandle>>` where requests may run unlocked).
//!
//! The Redis key is the handle's key prefix, the policy's namespace
//! (`redlock:`), then the extracted key (see [`LockPolicy`]). The policy
//! setters of [`RedlockMiddleware`] are those of [`LockPolicy`], written once
//! in `redlock-core` for both adapters.
//!
//! The `Redlock` handle is bound on the middleware
//! ([`with_redlock`](RedlockMiddleware::with_redlock)) or registered with
//! `App::app_data(redlock)` or `App::app_data(web::Data::new(redlock))`.
//!
//! # Single-threaded workers
//!
//! Each actix worker is a single-threaded Tokio runtime. A `Redlock` shared by
//! the workers keeps, for each worker, its own node connections, its own
//! renewal task and its own background calls: a worker renews, and releases,
//! the locks its own requests hold, and a worker whose thread is stuck never
//! delays another worker's acquire, renewal or release. A CPU-bound or
//! blocking handler does stall its own worker's thread, and with it the
//! renewals of that worker's locks: a handler that blocks for longer than the
//! validity left loses its lock while it blocks, and another replica may take
//! it. Move such work off the worker with `web::block`, so the lock keeps being
//! renewed while it runs:
//!
//! ```no_run
//! use actix_web::{error, web};
//!
//! fn crunch() -> u64 { (0..1_000_000_000u64).sum() }
//!
//! async fn report() -> actix_web::Result<String> {
//!     let total = web::block(crunch).await.map_err(error::ErrorInternalServerError)?;
//!     Ok(total.to_string())
//! }
//! ```
//!
//! If a handler does block too long, the loss is still detected: as soon as the
//! worker runs again, the renewal task finds the validity over and marks the lock
//! lost, and the middleware drops the handler at its next await point and
//! answers 503 (unless [`LostPolicy::Signal`]). The renewal task runs on the
//! runtime of the worker that took the lock (actix-web 4 runs on Tokio through
//! actix-rt). The first locked request of each worker opens that worker's
//! connections to the nodes.
//!
//! # WebSockets
//!
//! With `actix-ws` (or `actix-web-actors`) the session's frames are the
//! response body of the `101` answer: the lock is held while they stream,
//! renewed, and under [`LostPolicy::Abort`] the frames are cut off (the
//! connection closed) when it is lost. It is released once the frames have
//! ended and the last handle lent to the handler is dropped (the
//! `web::ReqData<LockHandle>` clones, and the request's own, which goes with
//! the request). Move the handle into the session task
//! (`let lock = lock.into_inner();` before `rt::spawn(async move { … })`):
//! the lock then lasts until the task drops it, so what the session does after
//! closing its frames still runs under it, and `lock.is_lost()` and
//! `lock.lost()` tell the truth in it. A session that kept no handle releases
//! when its frames end. The release at the last handle's drop runs in the
//! background: a client that reconnects at once may wait for it (or get the
//! busy answer without [`RedlockMiddleware::wait`]).
//!
//! # Clients that go away
//!
//! A client that disconnects while the body streams drops the body, and the lock
//! with it. One that disconnects while the handler runs is, by actix's default
//! (`HttpServer::h1_allow_half_closed(true)`), noticed only when the response is
//! written: the handler runs to its end and the lock is released then. With
//! `h1_allow_half_closed(false)` actix drops the handler, and the lock, as soon
//! as it reads the client's end of stream. A handler that panics is dropped
//! with its connection, and its lock released.
//!
//! Everything that is not actix-specific (the policy and its setters, the wait,
//! the hold with auto-extension, the abort on loss, the release, the tracing
//! span and the problem document) lives in
//! [`redlock_core::request`] and is shared with `redlock-tower`.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod body;
mod extract;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
mod key;
mod middleware;
mod rejection;

pub use body::LockedBody;
pub use extract::{HeldLock, HeldLockConfig};
pub use middleware::{RedlockMiddleware, RedlockService};
pub use redlock_core::request::{
    BusyPolicy, LockPolicy, LostPolicy, MissingKeyPolicy, Rejection, ReleasePolicy,
};
pub use redlock_core::{FencingToken, LockHandle, LockOptions, Redlock, RetryPolicy};
pub use rejection::LockRejection;
