//! The CNI plugin binary; all behaviour lives in `node_enforcer::cni_plugin`.

use std::collections::HashMap;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;

use node_enforcer::cni_plugin::{self, code, CniError};

fn main() -> ExitCode {
    // A CNI runtime passes everything through the environment and stdin,
    // never arguments; arguments mean an operator (or the DaemonSet's init
    // container) is installing or removing the plugin on this node.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(command) = args.first() {
        if command == "health" {
            return health(&args[1..]);
        }
        return admin(command, &args[1..]);
    }
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
            // The runtime logs stderr; stdout is the result and nothing else.
            for line in &output.stderr {
                eprintln!("palisade-cni: {line}");
            }
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

/// `palisade-cni install|uninstall [FLAGS]`: see `cni_plugin::install`;
/// `palisade-cni install-seccomp`: see `cni_plugin::seccomp_install`.
fn admin(command: &str, flags: &[String]) -> ExitCode {
    use node_enforcer::cni_plugin::{install, seccomp_install};
    let result = if command == "install-seccomp" {
        seccomp_install::parse_args(flags).and_then(|opts| seccomp_install::install(&opts))
    } else {
        install::parse_args(flags).and_then(|opts| match command {
            "install" => {
                let own = std::env::current_exe()
                    .map_err(|e| install::InstallError::Io(format!("finding this binary: {e}")))?;
                if opts.watch {
                    return watch(&opts, &own);
                }
                install::install(&opts, &own)
            }
            "uninstall" if opts.watch => Err(install::InstallError::Usage(
                "--watch is for install only".into(),
            )),
            "uninstall" => install::uninstall(&opts),
            other => Err(install::InstallError::Usage(format!(
                "unknown command {other:?}: palisade-cni takes no arguments when a CNI runtime \
             runs it, and `install` or `uninstall` [--conf-dir DIR] [--conf-file NAME] \
             [--bin-dir DIR] [--enforcer-socket PATH] [--timeout-seconds N] (install: [--watch]), \
             `install-seccomp` --from FILE --dir DIR --name PATH, or `health` otherwise"
            ))),
        })
    };
    match result {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("palisade-cni {command}: {e}");
            ExitCode::from(2)
        }
    }
}

/// `palisade-cni install --watch`: see `cni_plugin::watch`. Its log goes
/// to stderr; SIGTERM (the kubelet stopping the container) or SIGINT end it
/// with exit 0. The signals are blocked and read from a signalfd: as a
/// container's pid 1 with no handler, SIGTERM would otherwise be dropped.
fn watch(
    opts: &node_enforcer::cni_plugin::install::Options,
    own: &std::path::Path,
) -> Result<Vec<String>, node_enforcer::cni_plugin::install::InstallError> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    use node_enforcer::cni_plugin::install::InstallError;
    use node_enforcer::cni_plugin::watch;
    use std::os::fd::AsFd;

    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    // Before any thread exists (there are none), so none takes them.
    signals
        .thread_block()
        .map_err(|e| InstallError::Io(format!("blocking SIGTERM and SIGINT: {e}")))?;
    let stop = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| InstallError::Io(format!("signalfd for SIGTERM and SIGINT: {e}")))?;
    watch::watch(opts, own, stop.as_fd(), watch::POLL_EVERY, &mut |pass| {
        for line in &pass.log {
            eprintln!("palisade-cni install --watch: {line}");
        }
    })?;
    let signal = match stop.read_signal() {
        Ok(Some(info)) => Signal::try_from(info.ssi_signo as i32)
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|_| format!("signal {}", info.ssi_signo)),
        _ => "a signal".to_string(),
    };
    Ok(vec![format!("{signal}: stopped watching")])
}

/// `palisade-cni health [--enforcer-socket PATH] [--service NAME]
/// [--require-file PATH]`: exit 0 when the enforcer reports SERVING (and the
/// file exists), 1 otherwise, with the reason on stderr. The file is the
/// enforcer's `--programs-loaded-file`: in a surge the socket is answered
/// by the old enforcer, and only the file says this pod's can run here.
fn health(flags: &[String]) -> ExitCode {
    let mut socket = cni_plugin::DEFAULT_ENFORCER_SOCKET.to_string();
    let mut service = String::new();
    let mut required = String::new();
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let target = match flag.as_str() {
            "--enforcer-socket" => &mut socket,
            "--service" => &mut service,
            "--require-file" => &mut required,
            other => {
                eprintln!("palisade-cni health: unknown flag {other} (known: --enforcer-socket PATH, --service NAME, --require-file PATH)");
                return ExitCode::from(2);
            }
        };
        match it.next() {
            Some(v) => *target = v.clone(),
            None => {
                eprintln!("palisade-cni health: {flag} needs a value");
                return ExitCode::from(2);
            }
        }
    }
    if !required.is_empty() && !std::path::Path::new(&required).exists() {
        eprintln!("palisade-cni health: {required} does not exist: this pod's enforcer has not loaded its programs (yet)");
        return ExitCode::FAILURE;
    }
    let client = cni_plugin::EnforcerClient::new(&socket, std::time::Duration::from_secs(5));
    match client.serving(&service) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("palisade-cni health: the enforcer at {socket} is not serving {service:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("palisade-cni health: {e}");
            ExitCode::FAILURE
        }
    }
}
