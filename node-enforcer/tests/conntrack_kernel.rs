//! The kernel's conntrack, read over nfnetlink, explains a flow through a
//! Service VIP on both of its pods (seed 001): the original tuple holds the
//! VIP, the reply tuple the backend. Real nftables DNAT, real UDP. Root.

use std::net::UdpSocket;
use std::process::Command;

use node_enforcer::conntrack::{kernel, stale, Explained, Tuple};

fn run(args: &[&str], stdin: Option<&str>) {
    use std::io::Write;
    let mut c = Command::new(args[0]);
    c.args(&args[1..]);
    if stdin.is_some() {
        c.stdin(std::process::Stdio::piped());
    }
    let mut child = c.spawn().expect(args[0]);
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    assert!(child.wait().unwrap().success(), "{args:?}");
}

fn v4(a: [u8; 4]) -> [u8; 16] {
    let mut o = [0u8; 16];
    o[10] = 0xff;
    o[11] = 0xff;
    o[12..].copy_from_slice(&a);
    o
}

#[test]
fn a_flow_through_a_vip_is_explained_on_both_sides() {
    let ns = format!("pct{}", std::process::id() % 100_000);
    run(&["ip", "netns", "add", &ns], None);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    let path = format!("/run/netns/{ns}");
    let result = std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        run(&["ip", "link", "set", "lo", "up"], None);
        // Like a node: the service range routes somewhere, DNAT does the rest.
        run(&["ip", "route", "add", "10.96.0.0/12", "dev", "lo"], None);
        // kube-proxy's nftables mode, in miniature: DNAT a ClusterIP.
        run(
            &["nft", "-f", "-"],
            Some(
                "table ip lab {\n chain out { type nat hook output priority -100; ip daddr 10.96.0.10 udp dport 80 dnat to 127.0.0.1:8080; }\n}\n",
            ),
        );
        let server = UdpSocket::bind("127.0.0.1:8080").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.send_to(b"hi", "10.96.0.10:80").unwrap();
        let mut buf = [0u8; 8];
        let (_, from) = server.recv_from(&mut buf).unwrap();
        server.send_to(b"ok", from).unwrap();
        client.recv_from(&mut buf).unwrap();
        let cport = client.local_addr().unwrap().port();

        let mut explained = Explained::default();
        let mut seen = Vec::new();
        let n = kernel::dump(|o, r| {
            explained.add(o, r);
            seen.push((*o, *r));
        })
        .unwrap();
        (n, explained, seen, cport)
    })
    .join()
    .unwrap();
    let (n, explained, seen, cport) = result;
    assert!(n >= 1, "no kernel entries: {seen:?}");
    let client_side = Tuple {
        src: v4([127, 0, 0, 1]),
        dst: v4([10, 96, 0, 10]),
        sport: cport,
        dport: 80,
        proto: 17,
    };
    let backend_side = Tuple {
        dst: v4([127, 0, 0, 1]),
        dport: 8080,
        ..client_side
    };
    assert!(seen.iter().any(|(o, _)| *o == client_side), "{seen:?}");
    assert!(!stale(&client_side, 0, u64::MAX, &explained));
    assert!(!stale(&backend_side, 0, u64::MAX, &explained));
    let other = Tuple {
        sport: cport.wrapping_add(1),
        ..backend_side
    };
    assert!(stale(&other, 0, u64::MAX, &explained));
}
