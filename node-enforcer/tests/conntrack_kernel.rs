//! The kernel's conntrack, read over nfnetlink, explains a flow through a
//! Service VIP on both of its pods (seed 001): the original tuple holds the
//! VIP, the reply tuple the backend. Real nftables DNAT, real UDP. Root.

use palisade_test_support::require_root;
use std::net::UdpSocket;
use std::process::Command;

use node_enforcer::conntrack::{kernel, monotonic_ns, stale, sweep, Explained, Tuple};
use node_enforcer::datapath::bpf::BpfDatapath;
use palisade_ebpf::{CtKey, CtValue, HOOK_FROM_POD, HOOK_TO_POD};

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

/// A namespace where 10.96.0.10:80/udp is DNATed to 127.0.0.1:8080 and one
/// flow went through it; runs `f(client_port)` inside it.
fn through_a_vip<T: Send + 'static>(tag: &str, f: impl FnOnce(u16) -> T + Send + 'static) -> T {
    let ns = format!("pct{tag}{}", std::process::id() % 100_000);
    run(&["ip", "netns", "add", &ns], None);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let netns = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
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
        f(client.local_addr().unwrap().port())
    })
    .join()
    .unwrap()
}

/// Sends an ICMP echo to 127.0.0.1 from a raw socket and waits for the
/// reply, so the namespace's conntrack holds an ICMP entry.
fn ping_loopback() {
    // SAFETY: a raw socket owned at once; buffers are owned and their
    // lengths passed exactly.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP);
        assert!(
            fd >= 0,
            "raw ICMP socket: {}",
            std::io::Error::last_os_error()
        );
        let fd = <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // type 8 (echo), code 0, checksum, id 0x1234, seq 1
        let mut echo = [8u8, 0, 0, 0, 0x12, 0x34, 0, 1];
        let sum: u32 = echo
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let folded = !(((sum & 0xffff) + (sum >> 16)) as u16);
        echo[2..4].copy_from_slice(&folded.to_be_bytes());
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let sent = libc::sendto(
            raw,
            echo.as_ptr().cast(),
            echo.len(),
            0,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(sent, 8, "{}", std::io::Error::last_os_error());
        // The raw socket sees our request and then the reply (type 0).
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        let mut buf = [0u8; 128];
        loop {
            let n = libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0);
            assert!(n > 0, "no echo reply: {}", std::io::Error::last_os_error());
            let ihl = usize::from(buf[0] & 0xf) * 4;
            if buf[ihl] == 0 {
                return;
            }
        }
    }
}

#[test]
#[ignore = "needs root"]
fn a_flow_through_a_vip_is_explained_on_both_sides() {
    require_root();
    let result = through_a_vip("a", |cport| {
        let mut explained = Explained::default();
        let mut seen = Vec::new();
        let n = kernel::dump(|o, r| {
            explained.add(o, r);
            seen.push((*o, *r));
        })
        .unwrap();
        (n, explained, seen, cport)
    });
    let (n, explained, seen, cport) = result;
    assert!(n >= 1, "no kernel entries: {seen:?}");
    let [client_side, backend_side, other] = vip_flows(cport);
    assert!(seen.iter().any(|(o, _)| *o == client_side), "{seen:?}");
    assert!(!stale(&client_side, 0, u64::MAX, &explained));
    assert!(!stale(&backend_side, 0, u64::MAX, &explained));
    assert!(stale(&other, 0, u64::MAX, &explained));
}

/// The flow `through_a_vip` made, as the client's hook saw it (to the VIP)
/// and as the backend's did (after DNAT), and a flow the kernel lacks.
fn vip_flows(cport: u16) -> [Tuple; 3] {
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
    let other = Tuple {
        sport: cport.wrapping_add(1),
        ..backend_side
    };
    [client_side, backend_side, other]
}

/// A dump of one protocol gets that protocol's entries only (the kernel
/// filters), and the whole dump gets them all.
#[test]
#[ignore = "needs root"]
fn a_dump_of_one_protocol_holds_only_it() {
    require_root();
    let (icmp, udp, all) = through_a_vip("p", |_| {
        ping_loopback();
        let protos = |v6, p| {
            let mut got = Vec::new();
            kernel::dump_protocol(v6, p, |o, _| got.push(o.proto)).unwrap();
            got
        };
        let mut all = Vec::new();
        kernel::dump(|o, _| all.push(o.proto)).unwrap();
        (protos(false, 1), protos(false, 17), all)
    });
    assert_eq!(icmp, [1], "{all:?}");
    assert_eq!(udp, [17], "{all:?}");
    let mut all = all;
    all.sort();
    assert_eq!(all, [1, 17]);
}

/// The same question through the kernel lookup (the bpf_skb_ct_lookup
/// kfunc) instead of the dump: both sides of the flow are found, a flow the
/// kernel lacks is absent, and what the kfunc cannot take is not asked.
#[test]
#[ignore = "needs root"]
fn the_kernel_lookup_finds_a_flow_through_a_vip_on_both_sides() {
    require_root();
    use node_enforcer::conntrack::lookup::{Answer, KernelLookup};
    let mut lookup = KernelLookup::load().unwrap();
    let (answers, cport, mut lookup) = through_a_vip("l", move |cport| {
        let [client_side, backend_side, other] = vip_flows(cport);
        let icmp = Tuple {
            proto: 1,
            ..backend_side
        };
        let six = Tuple {
            src: "fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets(),
            dst: "fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets(),
            ..client_side
        };
        // Many questions at once: more than one test run's batch.
        let mut tuples = vec![
            client_side,
            backend_side.reversed(),
            backend_side,
            other,
            icmp,
            six,
        ];
        for i in 0..200u16 {
            tuples.push(Tuple {
                sport: cport.wrapping_add(100 + i),
                ..other
            });
        }
        tuples.push(client_side.reversed());
        let mut out = Vec::new();
        lookup.ask(&tuples, &mut out).unwrap();
        (out, cport, lookup)
    });
    use Answer::*;
    assert_eq!(
        &answers[..6],
        &[Found, Found, Found, Absent, NotAsked, Absent],
        "client port {cport}"
    );
    assert!(answers[6..206].iter().all(|a| *a == Absent));
    assert_eq!(answers[206], Found);
    // Outside that namespace the kernel has no such flow.
    let mut out = Vec::new();
    lookup.ask(&vip_flows(cport)[..1], &mut out).unwrap();
    assert_eq!(out, [Absent]);
}

/// Seed 001 against the real maps: the client's and the backend's eBPF
/// entries of a live flow through a VIP survive a sweep; an entry nothing
/// explains goes; one used since the sweep began stays.
///
/// Both ways of asking the kernel: lookups (with a dump for the ICMP entry
/// the lookup cannot take) and the dump alone.
#[test]
#[ignore = "needs root"]
fn a_sweep_keeps_live_flows_through_a_vip_and_removes_the_rest() {
    require_root();
    let report = sweep_case("b", sweep::Asking::best);
    assert_eq!(
        report.asked_by,
        "kernel lookup, and a netlink dump of IPv4 protocol 1 for 2 entries the lookup does not take"
    );
    assert!(report.dumped);
    let report = sweep_case("c", || sweep::Asking::with(sweep::AskWith::Dump));
    assert_eq!(report.asked_by, "netlink dump (--conntrack-ask=dump)");
    assert!(report.dumped);
}

/// A ping idle for less than the kernel's ICMP timeout is kept unjudged
/// by a lookup pass (no dump of the kernel's table for it); the dump, which
/// judges it, removes it, since the kernel has no such flow.
#[test]
#[ignore = "needs root"]
fn a_ping_idle_a_moment_is_kept_without_a_dump() {
    require_root();
    for (tag, asking, kept) in [
        ("r", sweep::Asking::best as fn() -> sweep::Asking, true),
        ("s", || sweep::Asking::with(sweep::AskWith::Dump), false),
    ] {
        let (report, left, ping) = through_a_vip(tag, move |_| {
            let pins = std::path::Path::new("/sys/fs/bpf")
                .join(format!("palisade-ct-{tag}-{}", std::process::id()));
            let _dp = BpfDatapath::load(&pins).unwrap();
            let mut map = sweep::open(&pins, asking()).unwrap();
            let ping = CtKey::new(
                palisade_ebpf::Tuple {
                    src: "127.0.0.1".parse().unwrap(),
                    sport: 0,
                    dst: "127.0.0.9".parse().unwrap(),
                    dport: 0,
                    proto: 1,
                },
                8,
                HOOK_TO_POD,
            );
            let a_second_ago = CtValue {
                last_seen_ns: monotonic_ns() - 1_000_000_000,
                epoch: 1,
                pad: 0,
            };
            map.insert(ping, a_second_ago).unwrap();
            let report = sweep::sweep(&mut map).unwrap();
            let left = map.keys().unwrap();
            let _ = std::fs::remove_dir_all(&pins);
            (report, left, ping)
        });
        assert_eq!(left.contains(&ping), kept, "{report:?}");
        assert_eq!(report.dumped, !kept, "{report:?}");
        if kept {
            assert_eq!(
                report.asked_by,
                "kernel lookup; 1 entries the lookup does not take kept unjudged (idle less than 30 s)"
            );
        }
    }
}

fn sweep_case(tag: &'static str, asking: fn() -> sweep::Asking) -> sweep::Report {
    let (report, left) = through_a_vip(tag, move |cport| {
        let pins = std::path::Path::new("/sys/fs/bpf")
            .join(format!("palisade-ct-{tag}-{}", std::process::id()));
        let _dp = BpfDatapath::load(&pins).unwrap();
        let mut map = sweep::open(&pins, asking()).unwrap();
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let vip: std::net::IpAddr = "10.96.0.10".parse().unwrap();
        let flow = |dst, dport, sport| palisade_ebpf::Tuple {
            src: lo,
            sport,
            dst,
            dport,
            proto: 17,
        };
        let old = CtValue {
            last_seen_ns: 1,
            epoch: 1,
            pad: 0,
        };
        let live_client = CtKey::new(flow(vip, 80, cport), 7, HOOK_FROM_POD);
        let live_backend = CtKey::new(flow(lo, 8080, cport), 8, HOOK_TO_POD);
        let dead = CtKey::new(flow(lo, 8080, cport.wrapping_add(1)), 8, HOOK_TO_POD);
        let fresh = CtKey::new(flow(lo, 8080, cport.wrapping_add(2)), 8, HOOK_TO_POD);
        // An IPv6 flow the kernel does not have (IPv6 entries have a map
        // of their own).
        let dead6 = CtKey::new(
            palisade_ebpf::Tuple {
                src: "fd00::1".parse().unwrap(),
                sport: cport,
                dst: "fd00::2".parse().unwrap(),
                dport: 8080,
                proto: 17,
            },
            8,
            HOOK_TO_POD,
        );
        // Pings, which the lookup cannot take: one the kernel tracks (an
        // echo to ourselves just now), one it does not.
        ping_loopback();
        let icmp_to = |dst| {
            CtKey::new(
                palisade_ebpf::Tuple {
                    proto: 1,
                    ..flow(dst, 0, 0)
                },
                8,
                HOOK_TO_POD,
            )
        };
        let live_icmp = icmp_to(lo);
        let dead_icmp = icmp_to("127.0.0.2".parse().unwrap());
        for k in [live_client, live_backend, dead, dead6, live_icmp, dead_icmp] {
            map.insert(k, old).unwrap();
        }
        // Used after the sweep starts: a reused 5-tuple.
        let later = CtValue {
            last_seen_ns: monotonic_ns() + 60_000_000_000,
            epoch: 1,
            pad: 0,
        };
        map.insert(fresh, later).unwrap();
        let report = sweep::sweep(&mut map).unwrap();
        let left: Vec<CtKey> = map.keys().unwrap();
        let _ = std::fs::remove_dir_all(&pins);
        (
            report,
            (left, [live_client, live_backend, dead, fresh, live_icmp]),
        )
    });
    let (left, [live_client, live_backend, dead, fresh, live_icmp]) = left;
    assert_eq!(
        (report.entries, report.removed, report.kept),
        (7, 3, 4),
        "{report:?}"
    );
    assert_eq!(report.skipped, "", "{report:?}");
    assert_eq!(left.len(), 4);
    assert!(
        left.contains(&live_icmp),
        "the tracked ping's entry was removed"
    );
    // The dump's list: every entry, ordered by interface then hook.
    let listed: Vec<(u32, &str, bool)> = report
        .listed
        .iter()
        .map(|e| (e.ifindex, e.hook, e.removed))
        .collect();
    assert_eq!(listed.len(), 7);
    assert_eq!(listed[0], (7, "from_pod", false));
    assert!(listed[1..].iter().all(|&(i, h, _)| i == 8 && h == "to_pod"));
    assert_eq!(listed.iter().filter(|e| e.2).count(), 3);
    assert!(left.contains(&live_client) && left.contains(&live_backend) && left.contains(&fresh));
    assert!(!left.contains(&dead));
    report
}
