//! gRPC services (tonic 0.14) behind `redlock-tower`'s layers, on real
//! `redis-server` processes, with a real tonic client and server on loopback
//! (issue 42): the gRPC status of each rejection, server streams that hold
//! their lock and end cleanly or with `UNAVAILABLE` when it is lost, and the
//! idempotency layer's refusal of gRPC.

mod common;
mod idempotency;
mod rejections;
mod streams;

/// The code tonic-prost-build generated from `examples/proto/jobs.proto`
/// (tests/build.rs).
#[allow(unreachable_pub, missing_debug_implementations, clippy::all)]
mod pb {
    tonic::include_proto!("jobs.v1");
}
