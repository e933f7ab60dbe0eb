//! [`Held`] as an axum extractor, and its rejection [`NotLocked`].
//!
//! `LockHandle` is a `redlock-core` type and `FromRequestParts` an axum trait,
//! so neither crate's impl could live here; the newtype keeps axum out of the
//! core crate.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use redlock_core::LockHandle;

use crate::held::Held;

impl<S: Send + Sync> FromRequestParts<S> for Held {
    type Rejection = NotLocked;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, NotLocked> {
        parts
            .extensions
            .get::<LockHandle>()
            .cloned()
            .map(Held)
            .ok_or(NotLocked)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Held {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Infallible> {
        Ok(parts.extensions.get::<LockHandle>().cloned().map(Held))
    }
}

/// The rejection of [`Held`] for a request that holds no lock: 500, and an
/// error logged once per process (the cause is the app's code, not the
/// request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotLocked;

static NOT_LOCKED_LOGGED: AtomicBool = AtomicBool::new(false);

impl IntoResponse for NotLocked {
    fn into_response(self) -> Response {
        if NOT_LOCKED_LOGGED.swap(true, Ordering::Relaxed) {
            tracing::debug!("a handler asked for the lock of an unlocked request");
        } else {
            tracing::error!(
                "a handler takes `Held`, but its request holds no lock: the route is not behind a \
                 RedlockLayer, or the request ran unlocked (no key, or fail-open); take \
                 `Option<Held>` there. Logged once."
            );
        }
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "this request holds no lock",
        )
            .into_response()
    }
}
