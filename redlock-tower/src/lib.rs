//! A tower [`Layer`](tower_layer::Layer) that runs each request under a
//! [Redlock](redlock_core) quorum lock, so that across all replicas of a service
//! only one request per key runs at a time.
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Extension, Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::RedlockLayer;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::from_urls(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
//! let app = Router::new()
//!     .route("/reports/{id}/rebuild", post(|| async { "rebuilt" }))
//!     .layer(RedlockLayer::by_path())
//!     .layer(Extension(redlock));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! What the layer guarantees, per key:
//!
//! - the handler runs only while this replica holds a quorum lock;
//! - the lock is renewed while the handler runs, and released when the response
//!   body has been fully sent, or dropped (client gone), or at the response head
//!   with [`ReleasePolicy::ResponseHead`](redlock_core::request::ReleasePolicy);
//! - a busy key answers `409 Conflict` with `Retry-After` (from the holder's
//!   remaining TTL) and an `application/problem+json` body, or waits with
//!   [`RedlockLayer::wait`];
//! - no quorum of nodes answers `503` (fail closed) unless
//!   [`RedlockLayer::fail_open`];
//! - if the lock is lost while the handler runs, the handler's future is dropped
//!   and the client gets `503`, unless
//!   [`LostPolicy::Signal`](redlock_core::request::LostPolicy) is chosen;
//! - the handler can read a [`LockHandle`] from the request
//!   extensions (`Extension<LockHandle>` in axum).
//!
//! Everything that is not tower-specific lives in [`redlock_core::request`] and is
//! shared with `redlock-actix`.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod body;
mod future;
mod key;
mod layer;
mod service;

pub use body::RedlockBody;
pub use future::ResponseFuture;
pub use key::{ByHeader, ByPath, KeyExtractor};
#[cfg(feature = "axum")]
pub use key::{ByMatchedPath, ByPathParam};
pub use layer::{RedlockLayer, RejectionHandler};
pub use redlock_core::request::{
    BusyPolicy, LockPolicy, LostPolicy, MissingKeyPolicy, Rejection, ReleasePolicy,
};
pub use redlock_core::{LockHandle, Redlock};
pub use service::RedlockService;
