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
mod tests;
