//! The CNI plugin finds the pod's host interface from the kernel: the peer
//! of the container interface, even when a bridge sits in front of it (the
//! `bridge` plugin's prevResult lists the bridge too). Needs root.

use palisade_test_support::require_root;
use std::process::Command;

use node_enforcer::cni_plugin::host_veth::{HostVeth, Kernel};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Cleanup(Vec<Vec<String>>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.0 {
            let _ = Command::new("ip").args(c).output();
        }
    }
}

#[test]
#[ignore = "needs root"]
fn the_pods_host_interface_is_the_containers_peer_not_the_bridge() {
    require_root();
    let id = std::process::id() % 100_000;
    let (ns, host, br) = (format!("phv{id}"), format!("phv{id}h"), format!("phv{id}b"));
    // In the test's own netns so the host side does not touch the machine's.
    let node = format!("phv{id}n");
    let _c = Cleanup(vec![
        vec!["netns".into(), "del".into(), ns.clone()],
        vec!["netns".into(), "del".into(), node.clone()],
    ]);
    ip(&["netns", "add", &node]);
    ip(&["netns", "add", &ns]);
    // The lookup runs in the caller's namespace: enter the node's on this thread.
    let node_ns = std::fs::File::open(format!("/run/netns/{node}")).unwrap();
    let found = std::thread::spawn({
        let (ns, host, br) = (ns.clone(), host.clone(), br.clone());
        move || {
            nix::sched::setns(&node_ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let exec = |a: &[&str]| {
                let out = Command::new("ip").args(a).output().unwrap();
                assert!(
                    out.status.success(),
                    "{a:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            exec(&["link", "add", &br, "type", "bridge"]);
            exec(&[
                "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            exec(&["link", "set", &host, "master", &br]);
            Kernel.host_interface(&format!("/run/netns/{ns}"), "eth0")
        }
    })
    .join()
    .unwrap();
    assert_eq!(found.unwrap(), host);
    let err = Kernel
        .host_interface(&format!("/run/netns/{ns}"), "nope0")
        .unwrap_err();
    assert!(err.contains("nope0"), "{err}");
    let err = Kernel
        .host_interface("/run/netns/does-not-exist", "eth0")
        .unwrap_err();
    assert!(err.contains("does-not-exist"), "{err}");
}
