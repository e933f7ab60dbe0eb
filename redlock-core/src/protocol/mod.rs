//! *Layer 3, the Redlock steps (see `lib.rs`).* The algorithm of the
//! distlock page, one file per step, in the page's order: the token, quorum,
//! validity and retry arithmetic ([`steps`]); the concurrent call to every
//! node ([`fan_out`]); acquire, with the release of a failed attempt and the
//! fence round ([`acquire`]); the held lock ([`lock`]); extend, one lock at a
//! time ([`extend`]) or in batches for renewal ([`extend_batch`]); release
//! ([`release`]); and the answers that come after a step was decided
//! ([`stragglers`]). The steps take the handle's nodes, quorum and settings
//! from [`crate::protocol::redlock`]; everything above (holding, waiting, leader,
//! permits, the HTTP parts) calls them.

pub(crate) mod acquire;
pub(crate) mod extend;
pub(crate) mod extend_batch;
pub(crate) mod fan_out;
pub(crate) mod lock;
pub(crate) mod redlock;
pub(crate) mod release;
pub(crate) mod steps;
pub(crate) mod stragglers;
