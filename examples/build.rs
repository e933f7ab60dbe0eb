//! Generates the `tonic_jobs` example's gRPC code from `proto/jobs.proto`,
//! with protox (a protobuf compiler in Rust) instead of a system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/jobs.proto");
    let descriptors = protox::compile(["jobs.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
