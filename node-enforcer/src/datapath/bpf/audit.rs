//! The audit table (`pal_audit`): which policy tables judge an interface's
//! new flows for its staged (audit) policies. The programs only report what
//! those tables decide; an entry here can never change a verdict.

use std::collections::BTreeMap;

use aya::maps::{HashMap, MapData, MapError};
use aya::Ebpf;
use palisade_ebpf::{AuditPolicy, MAP_AUDIT};

use super::err;
use crate::datapath::{AuditEntry, DatapathError, Result};

fn map(ebpf: &mut Ebpf) -> Result<HashMap<&mut MapData, u32, AuditPolicy>> {
    let map = ebpf
        .map_mut(MAP_AUDIT)
        .ok_or_else(|| DatapathError::new(format!("map {MAP_AUDIT} missing from object")))?;
    HashMap::try_from(map).map_err(|e| err(MAP_AUDIT, e))
}

pub(super) fn set(ebpf: &mut Ebpf, ifindex: u32, entry: &AuditEntry) -> Result<()> {
    let value = AuditPolicy {
        ingress_policy: entry.ingress,
        egress_policy: entry.egress,
    };
    map(ebpf)?
        .insert(ifindex, value, 0)
        .map_err(|e| err(format!("writing {MAP_AUDIT} for ifindex {ifindex}"), e))
}

pub(super) fn remove(ebpf: &mut Ebpf, ifindex: u32) -> Result<()> {
    match map(ebpf)?.remove(&ifindex) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(err(
            format!("removing {MAP_AUDIT} for ifindex {ifindex}"),
            e,
        )),
    }
}

pub(super) fn entries(ebpf: &mut Ebpf) -> Result<BTreeMap<u32, AuditEntry>> {
    let map = map(ebpf)?;
    let mut out = BTreeMap::new();
    for item in map.iter() {
        let (ifindex, v) = item.map_err(|e| err(format!("reading {MAP_AUDIT}"), e))?;
        out.insert(
            ifindex,
            AuditEntry {
                ingress: v.ingress_policy,
                egress: v.egress_policy,
            },
        );
    }
    Ok(out)
}
