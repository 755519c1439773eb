//! The controller's current role, shared by the elector (which sets it) and
//! the gRPC handlers (which serve only while leading). The role carries the
//! instant its leadership ends, and every check compares against the clock,
//! so a leader whose elector is stuck or paused stops serving on time
//! without depending on the elector to say so.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serving plans of `term`; `until` None: forever (no leader election).
    Leading { term: u64, until: Option<Instant> },
    /// Not serving; `holder`: who holds the lease, if known.
    Standby { holder: Option<String> },
}

/// Why this controller does not serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotLeader {
    #[error("this controller is not the leader; the leader is {0}")]
    Other(String),
    #[error("this controller is not the leader, and no leader is known yet")]
    Unknown,
}

/// What a leader serves under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Serving {
    pub term: u64,
    /// When to look again (the leadership may end then); None: never ends.
    pub until: Option<Instant>,
}

#[derive(Clone)]
pub struct Leadership {
    role: Arc<watch::Sender<Role>>,
}

impl Leadership {
    /// Without leader election: always leading, term 0.
    pub fn always() -> Self {
        Leadership {
            role: Arc::new(
                watch::channel(Role::Leading {
                    term: 0,
                    until: None,
                })
                .0,
            ),
        }
    }

    /// Under leader election, before the first read of the lease.
    pub fn standby() -> Self {
        Leadership {
            role: Arc::new(watch::channel(Role::Standby { holder: None }).0),
        }
    }

    pub fn set(&self, role: Role) {
        self.role.send_if_modified(|r| {
            let changed = *r != role;
            *r = role;
            changed
        });
    }

    /// The term to serve under, if this controller may serve now.
    pub fn serving(&self) -> Result<Serving, NotLeader> {
        match &*self.role.borrow() {
            Role::Leading { term, until } => match until {
                Some(t) if Instant::now() >= *t => Err(NotLeader::Unknown),
                _ => Ok(Serving {
                    term: *term,
                    until: *until,
                }),
            },
            Role::Standby { holder: Some(h) } => Err(NotLeader::Other(h.clone())),
            Role::Standby { holder: None } => Err(NotLeader::Unknown),
        }
    }

    /// Resolves when leadership of `term` may have ended: the role changed,
    /// or its deadline came. Callers check [`Leadership::serving`] again.
    pub async fn may_have_ended(&self, serving: Serving) {
        let mut rx = self.role.subscribe();
        let deadline = async {
            match serving.until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = rx.changed() => {}
            _ = deadline => {}
        }
    }

    /// Follows the role; for health reporting.
    pub fn watch(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }
}

/// Waits for the next change of the role or the end of the current
/// leadership, whichever is first, and returns whether it serves then.
pub async fn next_serving(
    leadership: &Leadership,
    rx: &mut watch::Receiver<Role>,
) -> Result<Serving, NotLeader> {
    let until = match &*rx.borrow_and_update() {
        Role::Leading { until, .. } => *until,
        Role::Standby { .. } => None,
    };
    let deadline = async {
        match until {
            // A little past the deadline, so the clock check sees it passed.
            Some(t) => tokio::time::sleep_until(t + Duration::from_millis(1)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = rx.changed() => {}
        _ = deadline => {}
    }
    leadership.serving()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn leadership_ends_at_its_deadline_by_the_clock_alone() {
        let l = Leadership::standby();
        assert_eq!(l.serving(), Err(NotLeader::Unknown));
        let until = Instant::now() + Duration::from_millis(300);
        l.set(Role::Leading {
            term: 3,
            until: Some(until),
        });
        let s = l.serving().unwrap();
        assert_eq!(s.term, 3);
        // Nothing tells it the role changed: the deadline alone ends it.
        tokio::time::timeout(Duration::from_secs(5), l.may_have_ended(s))
            .await
            .expect("ends at the deadline");
        assert!(Instant::now() >= until);
        assert_eq!(l.serving(), Err(NotLeader::Unknown));
    }

    #[tokio::test]
    async fn a_standby_names_the_leader() {
        let l = Leadership::standby();
        let s = Leadership::always().serving().unwrap();
        assert_eq!((s.term, s.until), (0, None));
        l.set(Role::Standby {
            holder: Some("controller-1".into()),
        });
        assert_eq!(
            l.serving().unwrap_err().to_string(),
            "this controller is not the leader; the leader is controller-1"
        );
    }
}
