//! The settings a layer hands to its services and their response futures.

use redlock_core::Redlock;
use redlock_core::request::LockPolicy;

use crate::grpc::GrpcSettings;
use crate::rejection::RejectionHandler;

/// What a [`RedlockService`](crate::RedlockService) needs besides its key extractor: shared by every
/// clone of the service, and by the response futures.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) redlock: Option<Redlock>,
    pub(crate) policy: LockPolicy,
    pub(crate) on_rejection: Option<RejectionHandler>,
    pub(crate) grpc: GrpcSettings,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("redlock", &self.redlock)
            .field("policy", &self.policy)
            .field("on_rejection", &self.on_rejection.is_some())
            .field("grpc", &self.grpc)
            .finish()
    }
}
