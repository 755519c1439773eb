//! A scenario's objects judged, before any lab is built, by the same code
//! the controller's manifest source judges them with (the API server's
//! validation, `policy_controller::source::validate`). A typo in a scenario
//! is then an error naming the object and the field at `palisade-lab
//! validate`, instead of a wait for a revision the controller refused; and a
//! step that expects a refusal (`sourceError`) is checked to get it.

use serde_json::Value;

use crate::netpol::{resolve_cidrs_with, STAND_IN_POD_IP};
use crate::scenario::Object;

/// The controller's verdict on one object: `Err` with its error (the
/// object and the fields) when it would refuse it.
pub fn verdict(o: &Object) -> Result<(), String> {
    let mut body: Value = o.body().clone();
    // Pod addresses are known only in a running lab; addresses in the pod
    // range stand in for them here, one per pod (a list of two pods'
    // addresses is no duplicate).
    let stand_ins = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let stand_in = |pod: &crate::scenario::PodName| {
        let mut m = stand_ins.borrow_mut();
        let next = m.len() as u32;
        let ip = *m.entry(pod.to_string()).or_insert_with(|| {
            let base = match STAND_IN_POD_IP {
                std::net::IpAddr::V4(v4) => u32::from(v4),
                std::net::IpAddr::V6(_) => unreachable!("the stand-in is IPv4"),
            };
            std::net::IpAddr::V4(std::net::Ipv4Addr::from(base + next))
        });
        Some(ip)
    };
    resolve_cidrs_with(&mut body, &stand_in).map_err(|e| format!("{e:#}"))?;
    policy_controller::source::parse_objects(&body.to_string())
        .map(|_| ())
        .map_err(|e| {
            let e = e.to_string();
            e.strip_prefix("document 1: ")
                .map(str::to_string)
                .unwrap_or(e)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_controllers_verdict_names_object_and_field() {
        let ok = Object::from_value(json!({"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": {"pod": "x/b", "prefix": 4},
                     "except": [{"pod": "x/b", "prefix": 32}]}}]}]}}))
        .unwrap();
        assert_eq!(verdict(&ok), Ok(()));
        let typo = Object::from_value(
            json!({"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"fromm": []}]}}),
        )
        .unwrap();
        assert_eq!(
            verdict(&typo),
            Err("NetworkPolicy x/p: spec.ingress[0].fromm: unknown field".into())
        );
    }
}
