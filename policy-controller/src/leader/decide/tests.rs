use super::*;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn timings() -> Timings {
    Timings {
        lease_duration: 15 * S,
        renew_deadline: 10 * S,
        retry_period: 2 * S,
    }
}

fn me() -> Elector {
    Elector::new("me".into(), timings())
}

fn held(holder: &str, transitions: i32, version: &str) -> Read {
    Read::Found(Record {
        holder: holder.into(),
        lease_duration_seconds: Some(15),
        transitions,
        version: version.into(),
    })
}

fn ok(v: &str) -> Written {
    Written::Ok { version: v.into() }
}

/// An elector that has just acquired a lease at `at` with `transitions`.
fn leader_at(at: Duration, transitions: i32) -> Elector {
    let mut e = me();
    assert_eq!(
        e.observe(held("", transitions - 1, "1"), at),
        Action::Acquire { transitions }
    );
    e.written(ok("2"), at);
    e
}

#[test]
fn default_timings_are_client_gos_and_valid() {
    let t = Timings::default();
    assert_eq!(
        (t.lease_duration, t.renew_deadline, t.retry_period),
        (15 * S, 10 * S, 2 * S)
    );
    t.check().unwrap();
}

#[test]
fn timings_that_could_overlap_two_leaders_are_refused() {
    let mut t = timings();
    t.renew_deadline = 15 * S;
    assert!(t
        .check()
        .unwrap_err()
        .to_string()
        .contains("renew deadline"));
    let mut t = timings();
    t.retry_period = 10 * S;
    assert!(t.check().unwrap_err().to_string().contains("retry period"));
    let mut t = timings();
    t.retry_period = Duration::ZERO;
    assert!(t.check().is_err());
    let mut t = timings();
    t.lease_duration = 1500 * MS;
    assert!(t.check().unwrap_err().to_string().contains("whole seconds"));
    let mut t = timings();
    t.lease_duration = 500 * MS;
    t.renew_deadline = 200 * MS;
    t.retry_period = 100 * MS;
    assert!(t
        .check()
        .unwrap_err()
        .to_string()
        .contains("shorter than a second"));
}

#[test]
fn a_missing_lease_is_created_and_its_first_term_is_one() {
    let mut e = me();
    assert_eq!(
        e.standing(Duration::ZERO),
        Standing::Standby { holder: None }
    );
    assert_eq!(
        e.observe(Read::Missing, S),
        Action::Create { transitions: 0 }
    );
    // Not leading until the write is known to have landed.
    assert!(matches!(e.standing(S), Standing::Standby { .. }));
    e.written(ok("5"), 2 * S);
    assert_eq!(
        e.standing(2 * S),
        Standing::Leading {
            term: 1,
            until: 11 * S
        },
        "the deadline counts from the write's start, not its end"
    );
}

#[test]
fn a_create_that_lost_the_race_leaves_us_standing_by() {
    let mut e = me();
    e.observe(Read::Missing, S);
    e.written(Written::Conflict, S);
    assert!(matches!(e.standing(S), Standing::Standby { .. }));
    // The next read shows the winner, whose lease is live.
    assert_eq!(
        e.observe(held("other", 0, "7"), 2 * S),
        Action::Wait {
            holder: "other".into(),
            expires_in: 15 * S
        }
    );
    assert_eq!(
        e.standing(2 * S),
        Standing::Standby {
            holder: Some("other".into())
        }
    );
}

#[test]
fn a_released_lease_is_acquired_at_once_with_a_new_term() {
    let mut e = me();
    assert_eq!(
        e.observe(held("", 4, "9"), S),
        Action::Acquire { transitions: 5 }
    );
    e.written(ok("10"), S);
    assert_eq!(
        e.standing(S),
        Standing::Leading {
            term: 6,
            until: 11 * S
        }
    );
}

#[test]
fn anothers_lease_expires_a_full_duration_after_we_first_saw_its_last_write() {
    let mut e = me();
    let t0 = 100 * S;
    assert_eq!(
        e.observe(held("other", 2, "3"), t0),
        Action::Wait {
            holder: "other".into(),
            expires_in: 15 * S
        }
    );
    // The same version read again: the clock keeps running from t0.
    assert_eq!(
        e.observe(held("other", 2, "3"), t0 + 15 * S - MS),
        Action::Wait {
            holder: "other".into(),
            expires_in: MS
        }
    );
    assert_eq!(
        e.observe(held("other", 2, "3"), t0 + 15 * S),
        Action::Acquire { transitions: 3 },
        "expired exactly at the lease duration"
    );
}

#[test]
fn a_renewal_by_the_holder_restarts_the_expiry_clock() {
    let mut e = me();
    e.observe(held("other", 2, "3"), S);
    assert_eq!(
        e.observe(held("other", 2, "4"), 14 * S),
        Action::Wait {
            holder: "other".into(),
            expires_in: 15 * S
        }
    );
    assert!(matches!(
        e.observe(held("other", 2, "4"), 28 * S),
        Action::Wait { .. }
    ));
    assert_eq!(
        e.observe(held("other", 2, "4"), 29 * S),
        Action::Acquire { transitions: 3 }
    );
}

#[test]
fn the_holders_clock_never_shortens_the_wait() {
    // A lease whose renewTime looks ancient (the holder's clock is behind)
    // is judged by when we saw it, so a fresh standby waits a full duration
    // before taking over; and one with a short duration written in it uses
    // that duration, one with none uses ours.
    let mut e = me();
    let short = Read::Found(Record {
        holder: "other".into(),
        lease_duration_seconds: Some(3),
        transitions: 0,
        version: "1".into(),
    });
    assert_eq!(
        e.observe(short.clone(), 50 * S),
        Action::Wait {
            holder: "other".into(),
            expires_in: 3 * S
        }
    );
    for bad in [None, Some(0), Some(-5)] {
        let mut e = me();
        let r = Read::Found(Record {
            holder: "other".into(),
            lease_duration_seconds: bad,
            transitions: 0,
            version: "1".into(),
        });
        assert_eq!(
            e.observe(r, S),
            Action::Wait {
                holder: "other".into(),
                expires_in: 15 * S
            },
            "{bad:?}"
        );
    }
}

#[test]
fn a_clock_going_backwards_expires_nothing() {
    let mut e = me();
    e.observe(held("other", 0, "1"), 100 * S);
    assert_eq!(
        e.observe(held("other", 0, "1"), 10 * S),
        Action::Wait {
            holder: "other".into(),
            expires_in: 105 * S
        }
    );
    let l = leader_at(100 * S, 1);
    assert!(matches!(l.standing(10 * S), Standing::Leading { .. }));
}

#[test]
fn the_leader_renews_in_the_same_term_and_its_deadline_moves() {
    let mut e = leader_at(S, 3);
    assert_eq!(
        e.observe(held("me", 3, "2"), 3 * S),
        Action::Renew { transitions: 3 }
    );
    e.written(ok("3"), 4 * S);
    assert_eq!(
        e.standing(4 * S),
        Standing::Leading {
            term: 4,
            until: 13 * S
        }
    );
}

#[test]
fn a_leader_stops_serving_at_its_renew_deadline_without_any_read() {
    let e = leader_at(S, 1);
    assert!(matches!(
        e.standing(11 * S - MS),
        Standing::Leading { term: 2, .. }
    ));
    assert_eq!(e.standing(11 * S), Standing::Standby { holder: None });
}

#[test]
fn failed_renewals_keep_the_old_deadline() {
    let mut e = leader_at(S, 1);
    e.observe(held("me", 1, "2"), 3 * S);
    e.written(Written::Failed, 4 * S);
    assert!(matches!(
        e.standing(10 * S),
        Standing::Leading { until, .. } if until == 11 * S
    ));
    assert!(matches!(e.standing(11 * S), Standing::Standby { .. }));
}

#[test]
fn a_conflict_on_renewal_stops_serving_at_once() {
    let mut e = leader_at(S, 1);
    assert_eq!(
        e.observe(held("me", 1, "2"), 3 * S),
        Action::Renew { transitions: 1 }
    );
    e.written(Written::Conflict, 3 * S);
    assert!(matches!(e.standing(3 * S), Standing::Standby { .. }));
    // The next read shows who took it.
    assert!(matches!(
        e.observe(held("other", 2, "9"), 4 * S),
        Action::Wait { .. }
    ));
    assert_eq!(
        e.standing(4 * S),
        Standing::Standby {
            holder: Some("other".into())
        }
    );
}

#[test]
fn a_leader_that_reads_another_holder_stops_at_once() {
    let mut e = leader_at(S, 1);
    assert!(matches!(
        e.observe(held("other", 2, "5"), 2 * S),
        Action::Wait { .. }
    ));
    assert!(matches!(e.standing(2 * S), Standing::Standby { .. }));
}

#[test]
fn a_leader_past_its_deadline_takes_a_new_term_even_if_the_lease_still_names_it() {
    // A paused leader resumes: the lease still says it holds it (nobody
    // took over), but it stopped serving at its deadline; what it serves
    // now must not be taken for the old term.
    let mut e = leader_at(S, 1);
    assert_eq!(
        e.observe(held("me", 1, "2"), 20 * S),
        Action::Acquire { transitions: 2 }
    );
    assert!(matches!(e.standing(20 * S), Standing::Standby { .. }));
    e.written(ok("3"), 20 * S);
    assert!(matches!(
        e.standing(20 * S),
        Standing::Leading { term: 3, .. }
    ));
}

#[test]
fn a_lease_in_our_name_from_a_previous_process_is_a_new_term() {
    let mut e = me();
    assert_eq!(
        e.observe(held("me", 7, "2"), S),
        Action::Acquire { transitions: 8 }
    );
}

#[test]
fn a_deleted_lease_ends_the_term() {
    let mut e = leader_at(S, 4);
    assert_eq!(
        e.observe(Read::Missing, 2 * S),
        Action::Create { transitions: 0 }
    );
    assert!(matches!(e.standing(2 * S), Standing::Standby { .. }));
}

#[test]
fn a_saturated_transition_counter_is_stuck_not_reused() {
    let mut e = me();
    assert!(matches!(
        e.observe(held("", i32::MAX, "1"), S),
        Action::Stuck(_)
    ));
    let mut e = me();
    assert!(matches!(e.observe(held("", -3, "1"), S), Action::Stuck(_)));
    e.written(ok("2"), S);
    assert!(
        matches!(e.standing(S), Standing::Standby { .. }),
        "nothing was written"
    );
}

#[test]
fn a_write_report_without_a_write_changes_nothing() {
    let mut e = me();
    e.observe(held("other", 0, "1"), S);
    e.written(ok("2"), S);
    assert!(matches!(e.standing(S), Standing::Standby { .. }));
}

#[test]
fn terms_are_never_zero() {
    assert_eq!(term_of(0), 1);
    assert_eq!(term_of(41), 42);
    assert_eq!(term_of(-1), 1);
}
