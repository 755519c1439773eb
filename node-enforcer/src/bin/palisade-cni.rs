//! The CNI plugin binary; all behaviour lives in `node_enforcer::cni_plugin`.

use std::collections::HashMap;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;

use node_enforcer::cni_plugin::{self, code, CniError};

fn main() -> ExitCode {
    let env: HashMap<String, String> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();

    // The runtime must always get a CNI error it can parse; a bug that
    // panics is still reported on stdout rather than as a bare crash.
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        cni_plugin::run(&env, std::io::stdin().lock())
    }))
    .unwrap_or_else(|_| {
        Err(CniError::new(code::INTERNAL, "palisade-cni panicked")
            .with_details("see the runtime's stderr log for the panic message"))
    });

    let mut stdout = std::io::stdout().lock();
    match outcome {
        Ok(output) => {
            if stdout.write_all(output.stdout.as_bytes()).is_err() || stdout.flush().is_err() {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            // Also to stderr, which runtimes keep in their logs.
            eprintln!("palisade-cni: {err}");
            let _ = writeln!(stdout, "{}", err.to_json());
            let _ = stdout.flush();
            ExitCode::FAILURE
        }
    }
}
