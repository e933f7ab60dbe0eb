//! Generates the gRPC tests' code (tests/grpc) from the example's
//! `jobs.proto`, with protox (a protobuf compiler in Rust) instead of a
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../examples/proto/jobs.proto");
    let descriptors = protox::compile(["jobs.proto"], ["../examples/proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
