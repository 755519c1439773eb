//! Restarting the processes is boring: policy stays enforced and an
//! established connection keeps flowing.

mod common;
use common::require_root;

use std::time::Duration;

use common::*;
use palisade_e2e::probe::echo;
use palisade_e2e::scenario::Target;
use palisade_e2e::{Outcome, PodName};

const TIMEOUT: Duration = Duration::from_millis(1000);

#[test]
#[ignore = "needs root"]
fn enforcer_restart_keeps_policy_and_established_flows() {
    require_root();
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.apply(&policies(ALLOW_A_80)).unwrap();
    lab.wait_realized().unwrap();
    let a = PodName::parse("x/a").unwrap();
    let b = Target::parse("x/b").unwrap();
    let mut conn = lab.connect(&a, &b, 80, TIMEOUT).unwrap();
    assert_eq!(echo(&mut conn, TIMEOUT), Outcome::Echo);

    let old = lab.enforcer_pid().unwrap();
    lab.restart_enforcer().unwrap();
    assert_ne!(lab.enforcer_pid().unwrap(), old);
    lab.wait_realized().unwrap();

    assert_eq!(
        echo(&mut conn, TIMEOUT),
        Outcome::Echo,
        "{}",
        lab.log_tails(30)
    );
    assert_verdicts(
        &lab,
        "after the enforcer restart",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/a", "x/b", 81, Tcp, Deny),
            ("x/c", "x/b", 80, Tcp, Deny),
            ("x/b", "x/c", 80, Tcp, Allow),
        ],
    );
    drop(conn);
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn controller_restart_keeps_policy() {
    require_root();
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    lab.restart_controller().unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "after the controller restart",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/b", "x/a", 80, Tcp, Allow),
        ],
    );
    // The new controller follows later changes too.
    lab.apply(&policies(ALLOW_A_80)).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "a change after the controller restart",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/c", "x/b", 80, Tcp, Deny),
        ],
    );
    finish(lab);
}
