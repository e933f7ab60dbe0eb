//! The builder methods both adapters' idempotency types share, written once
//! (as `request/setters.rs` writes the lock policy's).

/// Defines, in the `impl` block of an adapter's idempotency type, `new`,
/// `with_engine`, `policy`, `store` and `key_header`.
///
/// The type must have the fields `engine: Idempotency`, `key: KeySource` and
/// `scope: Option<_>`, where `KeySource` has the variants `IdempotencyKey`
/// and `Header(HeaderName)`; `header` is the framework's `HeaderName` type
/// (actix-web 4 is on `http` 0.2), and `what` names the type in the docs.
#[doc(hidden)]
#[macro_export]
macro_rules! idempotency_setters {
    (header = $header:ty, what = $what:literal) => {
        /// Keys from `Idempotency-Key`, records on `redlock`'s nodes, default
        /// policy.
        pub fn new(redlock: $crate::Redlock) -> Self {
            Self::with_engine($crate::idempotency::Idempotency::new(redlock))
        }

        #[doc = concat!("A ", $what, " over a configured engine (store and policy).")]
        pub fn with_engine(engine: $crate::idempotency::Idempotency) -> Self {
            Self {
                engine,
                key: KeySource::IdempotencyKey,
                scope: None,
            }
        }

        /// The policy (see [`IdempotencyPolicy`](crate::idempotency::IdempotencyPolicy)).
        pub fn policy(mut self, policy: $crate::idempotency::IdempotencyPolicy) -> Self {
            self.engine = self.engine.policy(policy);
            self
        }

        /// Records in `store` instead of the lock's nodes.
        pub fn store(mut self, store: impl $crate::idempotency::IdempotencyStore) -> Self {
            self.engine = self.engine.store(store);
            self
        }

        /// Keys from this header's value as is, for webhooks:
        /// `X-GitHub-Delivery`, `X-Shopify-Event-Id`, `webhook-id`.
        pub fn key_header(mut self, name: $header) -> Self {
            self.key = KeySource::Header(name);
            self
        }
    };
}
