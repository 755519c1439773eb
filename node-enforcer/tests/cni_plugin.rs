//! Runs the built palisade-cni binary the way a CNI runtime does: environment
//! in, config on stdin, result or error JSON on stdout, exit code.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn plugin(command: &str, stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-cni"))
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "3f2a9c1e")
        .env("CNI_NETNS", "/var/run/netns/cni-1234")
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart",
        )
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn palisade-cni");
    // VERSION does not read stdin, so the pipe may already be closed.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().expect("wait for palisade-cni")
}

fn error_json(out: &Output) -> serde_json::Value {
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not a CNI error JSON ({e}): {:?}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn malformed_stdin_is_a_cni_error_not_a_crash() {
    let out = plugin("ADD", "{\"cniVersion\": \"1.0.0\", oops");
    let json = error_json(&out);
    assert_eq!(json["code"], 6);
    assert_eq!(json["cniVersion"], "1.0.0");
    assert!(json["msg"].as_str().unwrap().contains("decode"));
}

#[test]
fn missing_prev_result_is_a_cni_error() {
    let out = plugin(
        "ADD",
        r#"{"cniVersion":"1.0.0","name":"n","type":"palisade-cni"}"#,
    );
    let json = error_json(&out);
    assert_eq!(json["code"], 7);
    assert!(json["msg"]
        .as_str()
        .unwrap()
        .contains("prevResult is required for ADD"));
}

#[test]
fn unreachable_enforcer_is_a_cni_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let stdin = format!(
        r#"{{"cniVersion":"1.0.0","name":"n","type":"palisade-cni","enforcerSocket":"{}",
            "prevResult":{{"interfaces":[{{"name":"veth1"}},{{"name":"eth0","sandbox":"/var/run/netns/cni-1234"}}],
                           "ips":[{{"address":"10.244.1.5/24","interface":1}}]}}}}"#,
        socket.display()
    );
    let json = error_json(&plugin("CHECK", &stdin));
    assert_eq!(json["code"], 11);
    assert!(json["msg"]
        .as_str()
        .unwrap()
        .contains(&socket.display().to_string()));
    // ADD first finds the pod's host veth in the kernel: a sandbox that does
    // not exist is named, and nothing is asked of the enforcer.
    let json = error_json(&plugin("ADD", &stdin));
    assert_eq!(json["code"], 999);
    assert!(
        json["msg"]
            .as_str()
            .unwrap()
            .contains("cannot find the host side"),
        "{json}"
    );
}

#[test]
fn version_reports_supported_cni_versions() {
    let out = plugin("VERSION", "");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}"#
    );
}

/// A sandbox must always come down: DEL under a config ADD refuses still
/// exits 0 with nothing on stdout, and says why in the runtime's log.
#[test]
fn del_under_a_refused_config_succeeds_and_logs_why() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    for stdin in [
        format!(
            r#"{{"cniVersion":"0.2.0","name":"n","type":"palisade-cni","enforcerSocket":"{}"}}"#,
            socket.display()
        ),
        format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"palisade-cni","enforcerSocket":"{}","timeoutSeconds":601}}"#,
            socket.display()
        ),
    ] {
        let out = plugin("DEL", &stdin);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdin}: {stderr}");
        assert!(out.stdout.is_empty(), "{stdin}: {:?}", out.stdout);
        assert!(stderr.contains("refused"), "{stdin}: {stderr}");
    }
}
