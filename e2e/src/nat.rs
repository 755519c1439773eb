//! The node's Service translation as kube-proxy's nftables mode writes it:
//! one table of the lab's own, a verdict map from ClusterIP . protocol .
//! port to a chain per service port that picks a backend with `numgen
//! random mod N` and DNATs to it. A service port without endpoints is
//! rejected (as kube-proxy does), and a pod reaching itself through its own
//! Service is masqueraded, or it would drop its own reply as martian.
//!
//! The script replaces the whole table in one `nft -f` transaction, so a
//! packet sees either the old Services or the new ones, never a mix.
//! Established flows keep the backend the kernel's conntrack bound them to.

use std::fmt::Write;

use crate::scenario::Protocol;
use crate::service::Translation;

/// The lab's table in the node's namespace.
pub const TABLE: &str = "palisade-lab-svc";
/// Family of [`TABLE`].
pub const FAMILY: &str = "ip";

/// The mark that asks postrouting to masquerade (kube-proxy's bit).
const MASQ_MARK: u32 = 0x4000;

fn l4(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// Chain names say which service port they serve, like kube-proxy's
/// (`svc/<namespace>/<name>/<protocol>/<port>`); Kubernetes names only use
/// characters nft accepts in an identifier.
fn chain(t: &Translation) -> String {
    format!(
        "svc/{}/{}/{}/{}",
        t.service.namespace,
        t.service.name,
        l4(t.protocol),
        t.port
    )
}

/// The whole `nft -f` script that makes the table hold exactly these
/// translations.
pub fn script(translations: &[Translation]) -> String {
    let mut s = String::new();
    // Declaring the table first makes the delete valid when it is absent.
    let _ = writeln!(s, "table {FAMILY} {TABLE}");
    let _ = writeln!(s, "delete table {FAMILY} {TABLE}");
    let _ = writeln!(s, "table {FAMILY} {TABLE} {{");
    let key = |t: &Translation| format!("{} . {} . {}", t.cluster_ip, l4(t.protocol), t.port);
    let (served, rejected): (Vec<&Translation>, Vec<&Translation>) =
        translations.iter().partition(|t| !t.backends.is_empty());
    map(
        &mut s,
        "service-ips",
        served
            .iter()
            .map(|t| format!("{} : goto {}", key(t), chain(t))),
    );
    map(
        &mut s,
        "no-endpoint-services",
        rejected
            .iter()
            .map(|t| format!("{} : goto reject-chain", key(t))),
    );
    let lookup = "ip daddr . meta l4proto . th dport";
    // Pods' traffic is routed through the node (prerouting); the node's own
    // (output) is translated too, as on a real node.
    for (name, hook, prio) in [
        ("nat-prerouting", "prerouting", -100),
        ("nat-output", "output", -100),
    ] {
        base_chain(
            &mut s,
            name,
            "nat",
            hook,
            prio,
            &format!("{lookup} vmap @service-ips"),
        );
    }
    base_chain(
        &mut s,
        "nat-postrouting",
        "nat",
        "postrouting",
        100,
        &format!("meta mark & {MASQ_MARK:#x} == {MASQ_MARK:#x} masquerade"),
    );
    // Before DNAT and before routing: the lab's node has no default route,
    // so a packet to a ClusterIP without endpoints would otherwise get
    // "network unreachable" from routing instead of kube-proxy's reject.
    for (name, hook) in [
        ("filter-prerouting", "prerouting"),
        ("filter-output", "output"),
    ] {
        base_chain(
            &mut s,
            name,
            "filter",
            hook,
            -110,
            &format!("ct state new {lookup} vmap @no-endpoint-services"),
        );
    }
    let _ = writeln!(s, "\tchain reject-chain {{\n\t\treject\n\t}}");
    for t in served {
        let name = chain(t);
        let picks: Vec<String> = (0..t.backends.len())
            .map(|i| format!("{i} : goto {name}/ep{i}"))
            .collect();
        let _ = writeln!(
            s,
            "\tchain {name} {{\n\t\tnumgen random mod {} vmap {{ {} }}\n\t}}",
            t.backends.len(),
            picks.join(", ")
        );
        for (i, b) in t.backends.iter().enumerate() {
            let _ = writeln!(
                s,
                "\tchain {name}/ep{i} {{\n\t\tip saddr {ip} meta mark set meta mark | {MASQ_MARK:#x}\n\t\tmeta l4proto {p} dnat to {b}\n\t}}",
                ip = b.ip(),
                p = l4(t.protocol),
            );
        }
    }
    let _ = writeln!(s, "}}");
    s
}

fn map(s: &mut String, name: &str, elements: impl Iterator<Item = String>) {
    let elements: Vec<String> = elements.collect();
    let _ = writeln!(
        s,
        "\tmap {name} {{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict"
    );
    if !elements.is_empty() {
        let _ = writeln!(s, "\t\telements = {{ {} }}", elements.join(", "));
    }
    let _ = writeln!(s, "\t}}");
}

fn base_chain(s: &mut String, name: &str, kind: &str, hook: &str, prio: i32, rule: &str) {
    let _ = writeln!(
        s,
        "\tchain {name} {{\n\t\ttype {kind} hook {hook} priority {prio}; policy accept;\n\t\t{rule}\n\t}}"
    );
}

/// The script that removes the table (and fails if it is not there).
pub fn delete_script() -> String {
    format!("delete table {FAMILY} {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::ServiceRef;
    use std::net::SocketAddrV4;

    fn t(port: u16, backends: &[([u8; 4], u16)]) -> Translation {
        Translation {
            service: ServiceRef {
                namespace: "x".into(),
                name: "web".into(),
            },
            cluster_ip: [10, 96, 0, 10].into(),
            port,
            protocol: Protocol::Tcp,
            backends: backends
                .iter()
                .map(|(ip, p)| SocketAddrV4::new((*ip).into(), *p))
                .collect(),
        }
    }

    #[test]
    fn each_service_port_picks_one_of_its_backends() {
        let s = script(&[
            t(80, &[([10, 244, 0, 3], 8080), ([10, 244, 0, 4], 8080)]),
            t(81, &[]),
        ]);
        assert!(s.starts_with("table ip palisade-lab-svc\ndelete table ip palisade-lab-svc\n"));
        assert!(
            s.contains("10.96.0.10 . tcp . 80 : goto svc/x/web/tcp/80"),
            "{s}"
        );
        assert!(s.contains("numgen random mod 2 vmap { 0 : goto svc/x/web/tcp/80/ep0, 1 : goto svc/x/web/tcp/80/ep1 }"), "{s}");
        assert!(
            s.contains("meta l4proto tcp dnat to 10.244.0.4:8080"),
            "{s}"
        );
        assert!(s.contains("ip saddr 10.244.0.3 meta mark set"), "{s}");
        assert!(
            s.contains("10.96.0.10 . tcp . 81 : goto reject-chain"),
            "{s}"
        );
        assert!(!s.contains("svc/x/web/tcp/81 {"), "{s}");
    }

    #[test]
    fn no_services_still_makes_a_valid_empty_table() {
        let s = script(&[]);
        assert!(!s.contains("elements"), "{s}");
        assert!(s.contains("vmap @service-ips"));
    }
}
