//! Compiles the .proto files with protox (pure Rust, no protoc needed) and
//! generates tonic/prost code plus the descriptor set served by reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "palisade/v1/common.proto",
        "palisade/v1/state.proto",
        "palisade/v1/plan.proto",
        "palisade/v1/cni.proto",
        "palisade/v1/debug.proto",
        "rpc/npbackend.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("palisade_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
