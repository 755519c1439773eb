//! What an elector does next, given the Lease as just read and the time:
//! pure, so every clock edge is testable without an API server.
//!
//! Expiry is judged on this process's monotonic clock from the moment it
//! first saw the current version of the Lease, never from the renewTime in
//! it: another controller's wall clock may be skewed, and a lease that looks
//! stale by its timestamp may be alive (the rule client-go follows too).
//!
//! A leader serves only while `renewed_at + renew_deadline` lies ahead, where
//! `renewed_at` is when its last successful write *started*. The renew
//! deadline is shorter than the lease duration, and a standby waits the full
//! lease duration from its own first sight of the last write, which came
//! after that write started: so the old leader has stopped serving before
//! any other can acquire.

use std::time::Duration;

/// Timings of the election (client-go's defaults: 15 s / 10 s / 2 s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a lease lives after its last renewal, as seen by others.
    pub lease_duration: Duration,
    /// How long a leader keeps serving after the start of its last
    /// successful renewal.
    pub renew_deadline: Duration,
    /// How often the lease is read and, by the leader, renewed.
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Timings refused by [`Timings::check`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error("lease duration {0:?} is shorter than a second (the Lease holds whole seconds)")]
    UnderASecond(Duration),
    #[error("lease duration {0:?} is not whole seconds (the Lease holds whole seconds)")]
    NotWholeSeconds(Duration),
    #[error("renew deadline {renew_deadline:?} must be shorter than the lease duration {lease_duration:?}, or a deposed leader could still serve when another acquires")]
    RenewDeadline {
        renew_deadline: Duration,
        lease_duration: Duration,
    },
    #[error("retry period {retry_period:?} must be positive and shorter than the renew deadline {renew_deadline:?}, or the leader could not renew in time")]
    RetryPeriod {
        retry_period: Duration,
        renew_deadline: Duration,
    },
}

impl Timings {
    /// Refuses timings under which two leaders could serve at once, or a
    /// leader could not renew before its own deadline.
    pub fn check(&self) -> Result<(), TimingsError> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(TimingsError::UnderASecond(self.lease_duration));
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return Err(TimingsError::NotWholeSeconds(self.lease_duration));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(TimingsError::RenewDeadline {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(TimingsError::RetryPeriod {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(())
    }
}

/// The election-relevant part of a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Empty: nobody holds it (released).
    pub holder: String,
    /// As written by the holder; None or not positive: unknown, so ours is
    /// assumed.
    pub lease_duration_seconds: Option<i32>,
    pub transitions: i32,
    /// The object's resourceVersion: any write changes it, so a change means
    /// the holder is alive.
    pub version: String,
}

/// A read of the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    Missing,
    Found(Record),
}

/// What to write, or why not to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// No Lease exists: create it holding it ourselves.
    Create { transitions: i32 },
    /// Take over a free, expired or our own stale Lease (a new term), with
    /// a replace conditional on the version read.
    Acquire { transitions: i32 },
    /// Renew the Lease we hold (same term), conditional on the version read.
    Renew { transitions: i32 },
    /// Someone else holds a live lease.
    Wait {
        holder: String,
        expires_in: Duration,
    },
    /// The lease cannot be taken over (its transition counter is at its
    /// limit): an operator must delete it.
    Stuck(String),
}

/// How a write ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// Stored; the new resourceVersion.
    Ok { version: String },
    /// 409: someone wrote the lease after we read it.
    Conflict,
    /// Anything else (timeout, 5xx): we do not know whether it was stored.
    Failed,
}

/// Where this elector stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Serving as the leader of `term` until `until` (monotonic time).
    Leading { term: u64, until: Duration },
    /// Not serving; `holder` is who holds the lease as last read.
    Standby { holder: Option<String> },
}

#[derive(Clone, Debug)]
struct Observed {
    record: Record,
    /// Our clock when we first saw this version.
    since: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lead {
    term: u64,
    renewed_at: Duration,
}

/// The election state of one controller. Times are monotonic offsets from
/// any fixed origin; they never go backwards in practice, and if they did
/// nothing would expire early.
#[derive(Clone, Debug)]
pub struct Elector {
    identity: String,
    timings: Timings,
    observed: Option<Observed>,
    lead: Option<Lead>,
    /// The write in flight: what it writes and when it started.
    pending: Option<(Action, Duration)>,
}

/// The term a lease's transition count stands for: never 0, which enforcers
/// take to mean "no leader election".
pub fn term_of(transitions: i32) -> u64 {
    u64::try_from(transitions).unwrap_or(0) + 1
}

impl Elector {
    pub fn new(identity: String, timings: Timings) -> Self {
        Elector {
            identity,
            timings,
            observed: None,
            lead: None,
            pending: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// Takes a fresh read of the Lease at `now` and says what to do. A
    /// write decided here is to be reported with [`Elector::written`].
    pub fn observe(&mut self, read: Read, now: Duration) -> Action {
        let record = match read {
            Read::Missing => {
                self.observed = None;
                // Whatever we held is gone: our term ended with the object.
                self.lead = None;
                return self.start(Action::Create { transitions: 0 }, now);
            }
            Read::Found(r) => r,
        };
        let since = match &self.observed {
            Some(o) if o.record == record => o.since,
            _ => now,
        };
        self.observed = Some(Observed {
            record: record.clone(),
            since,
        });
        let ours = record.holder == self.identity;
        if ours {
            if let Some(lead) = self.lead {
                if term_of(record.transitions) == lead.term && self.serving(now) {
                    return self.start(
                        Action::Renew {
                            transitions: record.transitions,
                        },
                        now,
                    );
                }
            }
            // Held in our name but not by this process's current term (a
            // restart with the same identity, or a term that ran past its
            // deadline): a new term, so nothing sent under the old one can
            // be taken for current.
            self.lead = None;
            return self.acquire(&record, now);
        }
        // Someone else holds it, or nobody.
        self.lead = None;
        if record.holder.is_empty() {
            return self.acquire(&record, now);
        }
        let duration = match record.lease_duration_seconds {
            Some(s) if s > 0 => Duration::from_secs(s as u64),
            _ => self.timings.lease_duration,
        };
        let expires = since.saturating_add(duration);
        if now >= expires {
            return self.acquire(&record, now);
        }
        Action::Wait {
            holder: record.holder,
            expires_in: expires - now,
        }
    }

    fn acquire(&mut self, record: &Record, now: Duration) -> Action {
        match record.transitions.checked_add(1) {
            Some(transitions) if transitions > 0 => self.start(Action::Acquire { transitions }, now),
            _ => Action::Stuck(format!(
                "the lease's leaseTransitions is {}; it cannot be taken over with a higher term. Delete the Lease (every enforcer then needs its state reset: see the term in its checkpoint)",
                record.transitions
            )),
        }
    }

    fn start(&mut self, action: Action, now: Duration) -> Action {
        self.pending = Some((action.clone(), now));
        action
    }

    /// Reports how the write decided by the last [`Elector::observe`] ended.
    pub fn written(&mut self, outcome: Written, now: Duration) {
        let Some((action, started)) = self.pending.take() else {
            return;
        };
        let transitions = match action {
            Action::Create { transitions }
            | Action::Acquire { transitions }
            | Action::Renew { transitions } => transitions,
            Action::Wait { .. } | Action::Stuck(_) => return,
        };
        match outcome {
            Written::Ok { version } => {
                let term = term_of(transitions);
                // The deadline counts from the write's start: a slow write
                // must not extend it, as the lease's life as others see it
                // may have started then.
                self.lead = Some(Lead {
                    term,
                    renewed_at: started,
                });
                self.observed = Some(Observed {
                    record: Record {
                        holder: self.identity.clone(),
                        lease_duration_seconds: Some(
                            self.timings.lease_duration.as_secs().min(i32::MAX as u64) as i32,
                        ),
                        transitions,
                        version,
                    },
                    since: now,
                });
            }
            // Someone else wrote it: whoever that is may be acquiring, so
            // stop at once rather than at the deadline.
            Written::Conflict => self.lead = None,
            // Unknown: keep serving until the deadline of the last success.
            Written::Failed => {}
        }
    }

    fn serving(&self, now: Duration) -> bool {
        self.lead
            .is_some_and(|l| now < l.renewed_at.saturating_add(self.timings.renew_deadline))
    }

    /// Where this elector stands at `now`: leading only before the renew
    /// deadline of its last successful write.
    pub fn standing(&self, now: Duration) -> Standing {
        match self.lead {
            Some(l) if self.serving(now) => Standing::Leading {
                term: l.term,
                until: l.renewed_at + self.timings.renew_deadline,
            },
            _ => Standing::Standby {
                holder: self
                    .observed
                    .as_ref()
                    .map(|o| o.record.holder.clone())
                    .filter(|h| !h.is_empty() && *h != self.identity),
            },
        }
    }
}

#[cfg(test)]
mod tests {
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
}
