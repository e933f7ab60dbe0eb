//! A tower [`Layer`](tower_layer::Layer) that runs each request under a
//! [Redlock](redlock_core) quorum lock, so that across all replicas of a service
//! only one request per key runs at a time.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::{Held, RedlockLayer};
//!
//! async fn rebuild(Held(lock): Held) -> String {
//!     format!("rebuilt under {}", lock.key())
//! }
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::from_urls(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
//! let app = Router::new()
//!     .route("/reports/{id}/rebuild", post(rebuild))
//!     .layer(RedlockLayer::by_path().with_redlock(redlock));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! The shortest form, `.layer(RedlockLayer::by_path()).layer(Extension(redlock))`,
//! finds the handle in the request extensions instead.
//!
//! What the layer guarantees, per key:
//!
//! - the handler runs only while this replica holds a quorum lock;
//! - the lock is renewed while the handler runs, and released when the response
//!   body has been fully sent, or dropped (client gone), or at the response head
//!   with [`ReleasePolicy::ResponseHead`]; an upgraded connection (a WebSocket
//!   session) keeps it until the handler's last `Held` is dropped (see
//!   [`Held`](crate::Held#websockets-and-other-upgrades));
//! - a busy key answers `409 Conflict` with `Retry-After` (from the holder's
//!   remaining TTL) and an `application/problem+json` body, or waits with
//!   [`RedlockLayer::wait`];
//! - no quorum of nodes answers `503` (fail closed) unless
//!   [`RedlockLayer::fail_open`];
//! - if the lock is lost while the handler runs, the handler's future is dropped
//!   and the client gets `503`, unless [`LostPolicy::Signal`] is chosen;
//! - the handler reads the [`LockHandle`] with the `Held` extractor
//!   (`Option<Held>` where requests may run unlocked), or
//!   `Extension<LockHandle>`.
//!
//! The Redis key is the handle's key prefix, the policy's namespace
//! (`redlock:`), then the extracted key (see [`LockPolicy`]).
//!
//! A tonic server is a tower service: behind the layer, gRPC requests get
//! gRPC answers (a `grpc-status`, not a JSON document), a stream whose lock
//! is lost ends with `UNAVAILABLE`, and keys come from the method or the
//! metadata. See [`grpc`].
//!
//! Everything that is not tower-specific lives in [`redlock_core::request`] and is
//! shared with `redlock-actix`: the policy and its setters, the wait, the hold,
//! the abort on loss and the problem document.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod body;
mod config;
#[cfg(feature = "axum")]
mod extract;
mod future;
pub mod grpc;
mod held;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
mod key;
mod layer;
mod rejection;
mod service;

pub use body::LockedBody;
#[cfg(feature = "axum")]
pub use extract::NotLocked;
pub use future::ResponseFuture;
pub use grpc::{ByGrpcMethod, ByMetadata, GrpcBusyCode, GrpcMode};
pub use held::Held;
pub use key::{ByHeader, ByPath, KeyExtractor};
#[cfg(feature = "axum")]
pub use key::{ByMatchedPath, ByPathParam, ByPathParams};
pub use layer::RedlockLayer;
pub use redlock_core::request::{
    BusyPolicy, LockPolicy, LostPolicy, MissingKeyPolicy, Rejection, ReleasePolicy,
};
pub use redlock_core::{FencingToken, LockHandle, LockOptions, Redlock, RetryPolicy};
pub use service::RedlockService;
