//! The elector's I/O: reads the Lease, writes what [`Elector`] decides with
//! a replace conditional on the resourceVersion read, and publishes the
//! resulting role. Safety does not depend on this loop being timely: the
//! published role carries its own deadline (see `role`).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use super::decide::{Action, Elector, Read, Record, Standing, Written};
use super::role::{Leadership, Role};

/// Runs the election until the task is dropped.
pub async fn run(api: Api<Lease>, name: String, mut elector: Elector, leadership: Leadership) {
    let origin = Instant::now();
    let now = || origin.elapsed();
    let retry = elector.timings().retry_period;
    let mut last: Option<Standing> = None;
    loop {
        let started = Instant::now();
        // A call may not outlive a retry period: a hung API server must not
        // keep the loop from publishing the role's end.
        let read = tokio::time::timeout(retry, api.get_opt(&name)).await;
        let current = match read {
            Ok(Ok(found)) => Some(found),
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, "reading the lease: {e}");
                None
            }
            Err(_) => {
                tracing::warn!(lease = %name, "reading the lease timed out");
                None
            }
        };
        if let Some(found) = current {
            let read = match &found {
                None => Read::Missing,
                Some(l) => Read::Found(record_of(l)),
            };
            let action = elector.observe(read, now());
            let outcome = match &action {
                Action::Create { transitions } => {
                    let lease = lease_for(
                        &name,
                        None,
                        elector.identity(),
                        *transitions,
                        &elector,
                        true,
                    );
                    write(api.create(&PostParams::default(), &lease), retry).await
                }
                Action::Acquire { transitions } | Action::Renew { transitions } => {
                    let acquiring = matches!(action, Action::Acquire { .. });
                    let lease = lease_for(
                        &name,
                        found.as_ref(),
                        elector.identity(),
                        *transitions,
                        &elector,
                        acquiring,
                    );
                    write(api.replace(&name, &PostParams::default(), &lease), retry).await
                }
                Action::Wait { .. } => None,
                Action::Stuck(why) => {
                    tracing::error!(lease = %name, "{why}");
                    None
                }
            };
            if let Some(outcome) = outcome {
                if outcome == Written::Conflict {
                    tracing::info!(lease = %name, "the lease changed under our write (409); re-reading");
                }
                elector.written(outcome, now());
            }
        }
        let standing = elector.standing(now());
        leadership.set(role_of(&standing, origin));
        if last.as_ref() != Some(&standing) {
            match &standing {
                Standing::Leading { term, .. } => {
                    let changed_term =
                        !matches!(last, Some(Standing::Leading { term: t, .. }) if t == *term);
                    if changed_term {
                        tracing::info!(lease = %name, term, identity = elector.identity(), "leading: serving plans");
                    }
                }
                Standing::Standby { holder } => {
                    if matches!(last, Some(Standing::Leading { .. })) {
                        tracing::warn!(lease = %name, "lost the lease: stopped serving plans");
                    }
                    tracing::info!(lease = %name, holder = holder.as_deref().unwrap_or("unknown"), "standing by");
                }
            }
            last = Some(standing);
        }
        // poll: the retry period is the election's own rhythm.
        tokio::time::sleep_until(started + retry).await;
    }
}

fn role_of(standing: &Standing, origin: Instant) -> Role {
    match standing {
        Standing::Leading { term, until } => Role::Leading {
            term: *term,
            until: Some(origin + *until),
        },
        Standing::Standby { holder } => Role::Standby {
            holder: holder.clone(),
        },
    }
}

async fn write(
    call: impl std::future::Future<Output = kube::Result<Lease>>,
    limit: std::time::Duration,
) -> Option<Written> {
    Some(match tokio::time::timeout(limit, call).await {
        Ok(Ok(l)) => Written::Ok {
            version: l.metadata.resource_version.unwrap_or_default(),
        },
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Written::Conflict,
        Ok(Err(e)) => {
            tracing::warn!("writing the lease: {e}");
            Written::Failed
        }
        Err(_) => {
            tracing::warn!("writing the lease timed out");
            Written::Failed
        }
    })
}

fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity.unwrap_or_default(),
        lease_duration_seconds: spec.lease_duration_seconds,
        transitions: spec.lease_transitions.unwrap_or(0),
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
    }
}

/// The Lease to write: the one read (its resourceVersion makes the replace
/// conditional) with us as holder.
fn lease_for(
    name: &str,
    read: Option<&Lease>,
    identity: &str,
    transitions: i32,
    elector: &Elector,
    acquiring: bool,
) -> Lease {
    let now = MicroTime(Timestamp::now());
    let mut lease = read.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: None,
    });
    let mut spec = lease.spec.take().unwrap_or_else(LeaseSpec::default);
    spec.holder_identity = Some(identity.to_string());
    spec.lease_duration_seconds = Some(
        elector
            .timings()
            .lease_duration
            .as_secs()
            .min(i32::MAX as u64) as i32,
    );
    spec.lease_transitions = Some(transitions);
    spec.renew_time = Some(now.clone());
    if acquiring || spec.acquire_time.is_none() {
        spec.acquire_time = Some(now);
    }
    lease.spec = Some(spec);
    lease
}

/// Gives the lease up when this process holds it, so that a standby takes
/// over at its next read instead of after the lease expires (a rolling
/// update then costs a retry period, not a lease duration). Call only once
/// this process has stopped serving. The replace is conditional on the
/// version read: a lease someone else took meanwhile is left alone.
pub async fn release(api: &Api<Lease>, name: &str, identity: &str) -> Result<bool, ReleaseError> {
    let Some(mut lease) = api.get_opt(name).await.map_err(ReleaseError::Read)? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(false);
    }
    spec.holder_identity = None;
    api.replace(name, &PostParams::default(), &lease)
        .await
        .map_err(ReleaseError::Replace)?;
    Ok(true)
}

/// Why [`release`] could not give the lease up.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("reading the lease: {0}")]
    Read(#[source] kube::Error),
    #[error("releasing the lease: {0}")]
    Replace(#[source] kube::Error),
}
