//! The NetworkPolicy behaviours of the quickstart, each on its own lab, with
//! real TCP and UDP traffic between pod namespaces.

mod common;
use common::require_root;

use common::*;

#[test]
#[ignore = "needs root"]
fn no_policy_allows_all_tcp_and_udp() {
    require_root();
    let lab = lab_with_pods();
    assert_verdicts(
        &lab,
        "without any policy every probe passes",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/a", "x/b", 81, Tcp, Allow),
            ("x/a", "x/b", 53, Udp, Allow),
            ("x/b", "x/a", 80, Tcp, Allow),
            ("x/b", "x/c", 53, Udp, Allow),
            ("x/c", "x/a", 81, Tcp, Allow),
        ],
    );
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn default_deny_ingress_isolates_only_the_selected_pod() {
    require_root();
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "default deny ingress on x/b",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/a", "x/b", 53, Udp, Deny),
            ("x/c", "x/b", 81, Tcp, Deny),
            // Egress of b is not isolated, and replies to it come back.
            ("x/b", "x/a", 80, Tcp, Allow),
            ("x/b", "x/a", 53, Udp, Allow),
            ("x/a", "x/c", 80, Tcp, Allow),
        ],
    );
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn allow_from_a_on_tcp_80_only() {
    require_root();
    let mut lab = lab_with_pods();
    lab.apply(&policies(ALLOW_A_80)).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "x/b accepts only x/a on TCP 80",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/a", "x/b", 81, Tcp, Deny),
            ("x/a", "x/b", 53, Udp, Deny),
            ("x/c", "x/b", 80, Tcp, Deny),
            ("x/c", "x/a", 80, Tcp, Allow),
        ],
    );
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn delete_restores_traffic_and_reapply_denies_it_again() {
    require_root();
    let mut lab = lab_with_pods();
    let both: Vec<_> = policies(DENY_B)
        .into_iter()
        .chain(policies(ALLOW_A_80))
        .collect();
    let keys: Vec<_> = both.iter().map(|o| o.key().clone()).collect();
    let denied: &[Case] = &[
        ("x/a", "x/b", 80, Tcp, Allow),
        ("x/a", "x/b", 81, Tcp, Deny),
        ("x/c", "x/b", 80, Tcp, Deny),
    ];

    lab.apply(&both).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(&lab, "policies applied", denied);

    lab.delete(&keys).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "policies deleted",
        &[
            ("x/a", "x/b", 81, Tcp, Allow),
            ("x/c", "x/b", 80, Tcp, Allow),
            ("x/c", "x/b", 53, Udp, Allow),
        ],
    );

    lab.apply(&both).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(&lab, "policies applied again", denied);
    finish(lab);
}

/// Upstream NetworkPolicy never blocks traffic between a pod and its own
/// node: kubelet probes must reach an isolated pod.
#[test]
#[ignore = "needs root"]
fn the_node_reaches_an_isolated_pod() {
    require_root();
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    let node = palisade_e2e::netns::NetNs::from_existing(lab.node_netns().expect("a node netns"));
    let b = lab
        .pod_ip(&palisade_e2e::PodName::parse("x/b").unwrap())
        .expect("x/b has an address");
    let timeout = std::time::Duration::from_millis(1000);
    let outcome = palisade_e2e::probe::run(&node, std::net::SocketAddr::new(b, 80), Tcp, timeout);
    assert_eq!(
        outcome,
        palisade_e2e::Outcome::Echo,
        "{}",
        lab.log_tails(20)
    );
    let state = lab.enforcer_state().unwrap();
    assert!(
        !state.node_addresses.is_empty(),
        "the dump shows the node's addresses"
    );
    // The exception is for the node only: pods are still denied.
    assert_verdicts(
        &lab,
        "pods are still denied",
        &[("x/a", "x/b", 80, Tcp, Deny), ("x/c", "x/b", 80, Tcp, Deny)],
    );
    finish(lab);
}

/// A manifest that does not parse is reported by name, and what was
/// enforced before stays enforced.
#[test]
#[ignore = "needs root"]
fn a_broken_manifest_is_reported_and_enforcement_stays() {
    require_root();
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    let broken = lab.manifest_dir().join("zz-broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad, namespace: x}\nspec: {podSelector: 7}\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let errors = loop {
        let errors = lab.controller_state().unwrap().errors;
        if !errors.is_empty() {
            break errors;
        }
        assert!(std::time::Instant::now() < deadline, "no error reported");
        std::thread::sleep(std::time::Duration::from_millis(50)); // poll: inside a loop bounded by a deadline
    };
    assert!(
        errors
            .iter()
            .any(|e| e.contains("zz-broken.yaml") && e.contains("podSelector")),
        "{errors:?}"
    );
    assert_verdicts(
        &lab,
        "the policy in force before the broken file",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/b", "x/a", 80, Tcp, Allow),
        ],
    );
    std::fs::remove_file(&broken).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !lab.controller_state().unwrap().errors.is_empty() {
        assert!(std::time::Instant::now() < deadline, "error not cleared");
        std::thread::sleep(std::time::Duration::from_millis(50)); // poll: inside a loop bounded by a deadline
    }
    finish(lab);
}
