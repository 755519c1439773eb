//! Builds what the lab's containerd runtime needs: the CRI client (the
//! subset in `proto/runtime/v1/cri.proto`, compiled with protox) and the
//! pause program of the lab's sandbox image (`pause/pause.c`, linked
//! statically by clang so the image needs nothing else).

use std::path::PathBuf;
use std::process::Command;

const CRI_PROTO: &str = "proto/runtime/v1/cri.proto";
const PAUSE_C: &str = "pause/pause.c";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={CRI_PROTO}");
    println!("cargo:rerun-if-changed={PAUSE_C}");
    println!("cargo:rerun-if-env-changed=CC_PAUSE");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    let fds = protox::compile([CRI_PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;

    let cc = std::env::var("CC_PAUSE").unwrap_or_else(|_| "clang".to_owned());
    let pause = out.join("pause");
    let result = Command::new(&cc)
        .args(["-static", "-O2", "-s", "-Wall", "-Werror", PAUSE_C, "-o"])
        .arg(&pause)
        .output()
        .map_err(|e| format!("running {cc} for {PAUSE_C}: {e} (install clang, or set CC_PAUSE)"))?;
    if !result.status.success() {
        return Err(format!(
            "{cc} could not build {PAUSE_C} ({}); a static link needs libc6-dev:\n{}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        )
        .into());
    }
    Ok(())
}
