//! EndpointSlice (discovery.k8s.io/v1) as the API server validates it
//! (kubernetes pkg/apis/discovery/validation): the address type, each
//! endpoint's addresses by that type, and the ports.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::field::{Errors, Path, Problem};
use super::meta;
use super::networkpolicy::PROTOCOLS;

pub const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 100;
const MAX_TOPOLOGY_LABELS: usize = 16;

pub fn endpoint_slice(slice: &EndpointSlice, errs: &mut Errors) {
    meta::object_meta(&slice.metadata, true, meta::dns1123_subdomain, errs);
    let ty = slice.address_type.as_str();
    if ty.is_empty() {
        errs.required(&Path::new("addressType"), "");
    } else if !ADDRESS_TYPES.contains(&ty) {
        errs.not_supported(&Path::new("addressType"), ty, ADDRESS_TYPES);
    }
    let path = Path::new("endpoints");
    if slice.endpoints.len() > MAX_ENDPOINTS {
        errs.push(
            &path,
            Problem::TooMany {
                got: slice.endpoints.len(),
                max: MAX_ENDPOINTS,
            },
        );
    } else {
        for (i, e) in slice.endpoints.iter().enumerate() {
            let at = path.index(i).child("addresses");
            if e.addresses.is_empty() {
                errs.required(&at, "must contain at least 1 address");
            } else if e.addresses.len() > MAX_ADDRESSES {
                errs.push(
                    &at,
                    Problem::TooMany {
                        got: e.addresses.len(),
                        max: MAX_ADDRESSES,
                    },
                );
            }
            for (j, a) in e.addresses.iter().enumerate() {
                address(ty, a, &at.index(j), errs);
            }
            if let Some(topology) = &e.deprecated_topology {
                let at = path.index(i).child("deprecatedTopology");
                if topology.len() > MAX_TOPOLOGY_LABELS {
                    errs.push(
                        &at,
                        Problem::TooMany {
                            got: topology.len(),
                            max: MAX_TOPOLOGY_LABELS,
                        },
                    );
                }
                meta::labels(topology, &at, errs);
            }
            if let Some(h) = e.hostname.as_deref() {
                errs.invalid_each(&path.index(i).child("hostname"), h, meta::dns1123_label(h));
            }
        }
    }
    let path = Path::new("ports");
    let ports = slice.ports.as_deref().unwrap_or_default();
    if ports.len() > MAX_PORTS {
        errs.push(
            &path,
            Problem::TooMany {
                got: ports.len(),
                max: MAX_PORTS,
            },
        );
        return;
    }
    let mut names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = path.index(i);
        // Defaulting gives a missing name "" and a missing protocol TCP.
        let name = p.name.as_deref().unwrap_or("");
        if !name.is_empty() {
            errs.invalid_each(&at.child("name"), name, meta::dns1123_label(name));
        }
        if !names.insert(name.to_string()) {
            errs.duplicate(&at.child("name"), name);
        }
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        if !PROTOCOLS.contains(&proto) {
            errs.not_supported(&at.child("protocol"), proto, PROTOCOLS);
        }
        if let Some(app) = p.app_protocol.as_deref() {
            errs.invalid_each(&at.child("appProtocol"), app, meta::qualified_name(app));
        }
    }
}

fn address(ty: &str, a: &str, path: &Path, errs: &mut Errors) {
    let family = match ty {
        "IPv4" => 4,
        "IPv6" => 6,
        "FQDN" => {
            fqdn(a, path, errs);
            return;
        }
        // An unknown type is reported once, above.
        _ => return,
    };
    let Some(ip) = crate::cidr::parse_ip_sloppy(a) else {
        errs.invalid_each(path, a, meta::ip_legacy(a));
        return;
    };
    match (family, ip) {
        (4, IpAddr::V4(_)) | (6, IpAddr::V6(_)) => {}
        (4, _) => errs.invalid(path, a, "must be a valid IPv4 address"),
        _ => errs.invalid(path, a, "must be a valid IPv6 address"),
    }
    non_special(ip, a, path, errs);
}

/// Endpoints may not point at addresses that would reach the node itself.
fn non_special(ip: IpAddr, a: &str, path: &Path, errs: &mut Errors) {
    let (unspecified, loopback, link_local, link_local_multicast) = match ip {
        IpAddr::V4(v4) => (
            v4.is_unspecified(),
            v4.is_loopback(),
            v4.is_link_local(),
            v4.octets()[..3] == [224, 0, 0],
        ),
        IpAddr::V6(v6) => (
            v6.is_unspecified(),
            v6.is_loopback(),
            (v6.segments()[0] & 0xffc0) == 0xfe80,
            (v6.segments()[0] & 0xff0f) == 0xff02,
        ),
    };
    if unspecified {
        errs.invalid(path, a, "may not be unspecified (0.0.0.0)");
    }
    if loopback {
        errs.invalid(
            path,
            a,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)",
        );
    }
    if link_local {
        errs.invalid(
            path,
            a,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        );
    }
    if link_local_multicast {
        errs.invalid(
            path,
            a,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
        );
    }
}

fn fqdn(a: &str, path: &Path, errs: &mut Errors) {
    let name = a.strip_suffix('.').unwrap_or(a);
    if name.is_empty() {
        errs.required(path, "");
        return;
    }
    let msgs = meta::dns1123_subdomain(name);
    if !msgs.is_empty() {
        errs.invalid(path, name, msgs.join(","));
    } else if !name.contains('.') {
        errs.invalid(
            path,
            name,
            "should be a domain with at least two segments separated by dots",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn check(body: Value) -> Vec<String> {
        let mut v = json!({"metadata": {"name": "s-1", "namespace": "x", "labels": {"kubernetes.io/service-name": "s"}}});
        v.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        let slice: EndpointSlice = serde_json::from_value(v).unwrap();
        let mut errs = Errors::default();
        endpoint_slice(&slice, &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn accepted() {
        for body in [
            json!({"addressType": "IPv4", "endpoints": []}),
            json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": false}, "hostname": "a"}],
                   "ports": [{"port": 443}, {"name": "dns", "port": 53, "protocol": "UDP", "appProtocol": "dns"}]}),
            json!({"addressType": "IPv6", "endpoints": [{"addresses": ["fd00::1"]}]}),
            json!({"addressType": "FQDN", "endpoints": [{"addresses": ["db.example.com"]}]}),
        ] {
            assert_eq!(check(body.clone()), Vec::<String>::new(), "{body}");
        }
    }

    #[test]
    fn refused() {
        let cases = [
            (json!({"addressType": "", "endpoints": []}), "addressType: Required value"),
            (json!({"addressType": "IP", "endpoints": []}), "addressType: Unsupported value: \"IP\""),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": []}]}), "endpoints[0].addresses: Required value: must contain at least 1 address"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["fd00::1"]}]}), "endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address"),
            (json!({"addressType": "IPv6", "endpoints": [{"addresses": ["10.0.0.1"]}]}), "endpoints[0].addresses[0]: Invalid value: \"10.0.0.1\": must be a valid IPv6 address"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["x"]}]}), "endpoints[0].addresses[0]: Invalid value: \"x\": must be a valid IP address"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["127.0.0.1"]}]}), "endpoints[0].addresses[0]: Invalid value: \"127.0.0.1\": may not be in the loopback range"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["169.254.1.1"]}]}), "endpoints[0].addresses[0]: Invalid value: \"169.254.1.1\": may not be in the link-local range"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["0.0.0.0"]}]}), "endpoints[0].addresses[0]: Invalid value: \"0.0.0.0\": may not be unspecified"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["224.0.0.5"]}]}), "endpoints[0].addresses[0]: Invalid value: \"224.0.0.5\": may not be in the link-local multicast"),
            (json!({"addressType": "FQDN", "endpoints": [{"addresses": ["db"]}]}), "endpoints[0].addresses[0]: Invalid value: \"db\": should be a domain"),
            (json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"], "hostname": "A"}]}), "endpoints[0].hostname: Invalid value: \"A\""),
            (json!({"addressType": "IPv4", "endpoints": [], "ports": [{"port": 1}, {"port": 2}]}), "ports[1].name: Duplicate value: \"\""),
            (json!({"addressType": "IPv4", "endpoints": [], "ports": [{"name": "A", "port": 1}]}), "ports[0].name: Invalid value: \"A\""),
            (json!({"addressType": "IPv4", "endpoints": [], "ports": [{"port": 1, "protocol": "ICMP"}]}), "ports[0].protocol: Unsupported value: \"ICMP\""),
            (json!({"addressType": "IPv4", "endpoints": [], "ports": [{"port": 1, "appProtocol": "a b"}]}), "ports[0].appProtocol: Invalid value: \"a b\""),
        ];
        for (body, want) in cases {
            let got = check(body.clone());
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{body}: {got:#?}\n  want {want}"
            );
        }
        let many: Vec<Value> = (0..101)
            .map(|i| json!({"name": format!("p{i}"), "port": i}))
            .collect();
        let got = check(json!({"addressType": "IPv4", "endpoints": [], "ports": many}));
        assert_eq!(got, ["ports: Too many: 101: must have at most 100 items"]);
    }
}
