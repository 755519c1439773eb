//! A held answer re-injected through the packet socket reaches its pod
//! past the host veth's egress hook (Palisade's own program, whose policy
//! here drops every packet to the pod), which drops what the ordinary
//! path sends: the hook holds an answer once, never twice. Needs root.

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use node_enforcer::names::reinject::Reinjector;
use palisade_test_support::require_root;

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect(args[0]);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

struct Netns(Vec<String>);
impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn mac(ns: &str, ifname: &str) -> [u8; 6] {
    let text = run(&[
        "ip",
        "netns",
        "exec",
        ns,
        "cat",
        &format!("/sys/class/net/{ifname}/address"),
    ]);
    let bytes: Vec<u8> = text
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    bytes.try_into().unwrap()
}

/// An Ethernet frame of an IPv4 UDP datagram (UDP checksum 0: none).
fn frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: [u8; 4],
    dst: [u8; 4],
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let sum = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend(ip);
    f.extend_from_slice(&53u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

struct PinRoot(std::path::PathBuf);
impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
#[ignore = "needs root"]
fn a_reinjected_frame_skips_the_egress_hook_that_drops_the_ordinary_path() {
    require_root();
    let id = std::process::id() % 100_000;
    let (node, pod, host) = (format!("rjn{id}"), format!("rjp{id}"), format!("rj{id}h"));
    let _ns = Netns(vec![node.clone(), pod.clone()]);
    run(&["ip", "netns", "add", &node]);
    run(&["ip", "netns", "add", &pod]);
    let in_node = |a: &[&str]| {
        let mut args = vec!["ip", "netns", "exec", node.as_str()];
        args.extend_from_slice(a);
        run(&args)
    };
    in_node(&[
        "ip", "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &pod,
    ]);
    in_node(&["ip", "addr", "add", "10.77.0.1/24", "dev", &host]);
    in_node(&["ip", "link", "set", &host, "up"]);
    run(&[
        "ip",
        "netns",
        "exec",
        &pod,
        "ip",
        "addr",
        "add",
        "10.77.0.2/24",
        "dev",
        "eth0",
    ]);
    run(&[
        "ip", "netns", "exec", &pod, "ip", "link", "set", "eth0", "up",
    ]);
    let (pod_mac, host_mac) = (mac(&pod, "eth0"), mac(&node, &host));

    // The pod's socket, opened in its namespace on a thread of its own.
    let pod_ns = std::fs::File::open(format!("/run/netns/{pod}")).unwrap();
    let socket = std::thread::spawn(move || {
        nix::sched::setns(&pod_ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        UdpSocket::bind("10.77.0.2:5353").unwrap()
    })
    .join()
    .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    let node_ns = std::fs::File::open(format!("/run/netns/{node}")).unwrap();
    let host_if = host.clone();
    let root = PinRoot(format!("/sys/fs/bpf/palisade-test-reinject-{id}").into());
    let pin = root.0.clone();
    std::thread::spawn(move || {
        nix::sched::setns(&node_ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let ifindex = nix::net::if_::if_nametoindex(host_if.as_str()).unwrap();
        // The pod's ingress: a table with no entry, so every packet to it drops.
        let mut dp = BpfDatapath::load(&pin).unwrap();
        dp.attach(&host_if, ifindex).unwrap();
        let mut mapped = [0u8; 16];
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&[10, 77, 0, 2]);
        dp.set_endpoint(
            ifindex,
            &EndpointEntry {
                ingress: 5,
                egress: 0,
                pod_addrs: vec![mapped],
            },
        )
        .unwrap();
        let f = |payload: &[u8]| {
            frame(
                pod_mac,
                host_mac,
                [10, 77, 0, 1],
                [10, 77, 0, 2],
                5353,
                payload,
            )
        };

        // The ordinary path (a packet socket without the option) is judged
        // by the hook, and dropped.
        // SAFETY: plain socket(2), closed below.
        let plain = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(plain >= 0);
        let held = f(b"held");
        // SAFETY: sockaddr_ll is plain data.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = 0x0800u16.to_be();
        to.sll_ifindex = ifindex as i32;
        // SAFETY: buffer and address valid for their lengths.
        let sent = unsafe {
            libc::sendto(
                plain,
                held.as_ptr().cast(),
                held.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        // The drop is the send's error (the qdisc layer's NET_XMIT_DROP).
        let error = std::io::Error::last_os_error();
        assert!(
            sent < 0 && error.raw_os_error() == Some(libc::ENOBUFS),
            "the hook did not drop the ordinary frame: sent {sent}, {error}"
        );
        // SAFETY: closes the socket opened above.
        unsafe { libc::close(plain) };

        // Re-injected after it, it passes: the first datagram the pod
        // gets is this one.
        let r = Reinjector::new().unwrap();
        r.send(ifindex, &f(b"reinjected")).unwrap();
        assert!(r.send(ifindex, &[0u8; 10]).is_err(), "no Ethernet header");
    })
    .join()
    .unwrap();

    let mut buf = [0u8; 64];
    let (n, from) = socket
        .recv_from(&mut buf)
        .expect("the re-injected frame reaches the pod");
    assert_eq!(
        &buf[..n],
        b"reinjected",
        "the hook dropped the ordinary frame, not this one"
    );
    assert_eq!(from, "10.77.0.1:53".parse().unwrap());
    drop(root);
}
