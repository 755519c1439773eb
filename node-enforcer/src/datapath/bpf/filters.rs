//! The fast attachment: the programs as cls_bpf filters of the interface's
//! clsact qdisc, the way a pod-up attaches when it can (`AttachMode::Fast`).
//!
//! Why: creating a TCX link holds RTNL while it waits out an RCU grace
//! period (`tcx_entry_sync()`), two per pod, so a burst of pod-ups queues
//! on the node's grace periods (`benches/attach.rs`: 24 ms a pod here). A
//! filter is added without one. The interface is promoted to TCX links
//! (the head of its chains, pinned) when the node is quiet; until then a
//! TCX program an earlier plugin of the chain attached runs before ours.
//!
//! All three requests (the qdisc if missing, one filter per direction) go
//! in one datagram on one socket, and are undone together on failure. The
//! filters carry the program's name, which is how a later process finds
//! them (`find`), and are direct-action: the programs' verdicts (next,
//! drop) mean the same as under TCX.

use std::os::fd::RawFd;

use aya::programs::TcAttachType;

use crate::datapath::rtnetlink::{
    attr_string, attributes, u32_at, NetlinkError, Request, Socket, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};

const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
const RTM_DELTFILTER: u16 = 45;
const RTM_GETTFILTER: u16 = 46;
const TCMSG_LEN: usize = 20;
const TC_H_CLSACT: u32 = 0xFFFF_FFF1;
/// The clsact qdisc's own handle (major ffff).
const CLSACT_HANDLE: u32 = 0xFFFF_0000;
const TC_H_MIN_INGRESS: u32 = 0xFFF2;
const TC_H_MIN_EGRESS: u32 = 0xFFF3;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_FD: u16 = 6;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
const ETH_P_ALL: u16 = 0x0003;
const EEXIST: i32 = libc::EEXIST;

/// Our filters' place: priority 1 runs before every other filter of the
/// hook (a filter of another protocol at priority 1 makes the add fail,
/// and the pod-up attaches by TCX instead).
pub const PRIORITY: u16 = 1;
pub const HANDLE: u32 = 1;

/// Our programs by name on their hooks, as our filters carry them.
pub const OURS: [(TcAttachType, &str); 2] = [
    (TcAttachType::Ingress, palisade_ebpf::PROG_FROM_POD),
    (TcAttachType::Egress, palisade_ebpf::PROG_TO_POD),
];

/// Of interfaces `ifindexes`, those that live and have one of our filters,
/// by name.
pub fn with_ours(
    ifindexes: impl IntoIterator<Item = u32>,
) -> Result<std::collections::BTreeMap<u32, String>, NetlinkError> {
    let mut out = std::collections::BTreeMap::new();
    for ifindex in ifindexes {
        let Ok(name) = nix::net::if_::if_indextoname(ifindex) else {
            continue;
        };
        let mut found = false;
        for (hook, prog) in OURS {
            found |= !find(ifindex, hook, prog)?.is_empty();
        }
        if found {
            out.insert(ifindex, name.to_string_lossy().into_owned());
        }
    }
    Ok(out)
}

/// One of our programs on one hook.
pub struct Program<'a> {
    pub hook: TcAttachType,
    pub fd: RawFd,
    pub name: &'a str,
}

/// A filter found on a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Priority and protocol, as the kernel keys the filter's chain.
    pub info: u32,
    pub handle: u32,
}

fn parent(hook: TcAttachType) -> u32 {
    let minor = match hook {
        TcAttachType::Ingress => TC_H_MIN_INGRESS,
        TcAttachType::Egress => TC_H_MIN_EGRESS,
        // Custom parents are never ours.
        TcAttachType::Custom(h) => return h,
    };
    (TC_H_CLSACT & 0xFFFF_0000) | minor
}

fn tcmsg(ifindex: u32, handle: u32, parent: u32, info: u32) -> [u8; TCMSG_LEN] {
    let mut b = [0u8; TCMSG_LEN];
    b[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    b[8..12].copy_from_slice(&handle.to_ne_bytes());
    b[12..16].copy_from_slice(&parent.to_ne_bytes());
    b[16..20].copy_from_slice(&info.to_ne_bytes());
    b
}

fn our_info() -> u32 {
    (u32::from(PRIORITY) << 16) | u32::from(ETH_P_ALL.to_be())
}

fn add_clsact(ifindex: u32, seq: u32) -> Vec<u8> {
    let mut r = Request::new(
        RTM_NEWQDISC,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
        &tcmsg(ifindex, CLSACT_HANDLE, TC_H_CLSACT, 0),
    );
    r.attr_str(TCA_KIND, "clsact");
    r.finish()
}

fn add_filter(ifindex: u32, p: &Program<'_>, seq: u32) -> Vec<u8> {
    let mut r = Request::new(
        RTM_NEWTFILTER,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
        &tcmsg(ifindex, HANDLE, parent(p.hook), our_info()),
    );
    r.attr_str(TCA_KIND, "bpf")
        .begin_nested(TCA_OPTIONS)
        .attr_u32(TCA_BPF_FD, p.fd as u32)
        .attr_str(TCA_BPF_NAME, p.name)
        .attr_u32(TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT)
        .end_nested();
    r.finish()
}

fn delete_filter(ifindex: u32, hook: TcAttachType, f: Filter, seq: u32) -> Vec<u8> {
    Request::new(
        RTM_DELTFILTER,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &tcmsg(ifindex, f.handle, parent(hook), f.info),
    )
    .finish()
}

/// Attaches `programs` as filters of interface `ifindex`, adding its
/// clsact qdisc if it has none: all of them or, on any failure, none.
pub fn attach(ifindex: u32, programs: &[Program<'_>]) -> Result<(), NetlinkError> {
    let sock = Socket::open()?;
    let mut requests = vec![add_clsact(ifindex, 1)];
    let mut seqs = vec![1];
    for (i, p) in programs.iter().enumerate() {
        let seq = 2 + i as u32;
        requests.push(add_filter(ifindex, p, seq));
        seqs.push(seq);
    }
    let answers = sock.acked(&requests, &seqs)?;
    // A qdisc already there is used as it is (another TC user's, or ours).
    let qdisc = match answers[0] {
        EEXIST => 0,
        e => e,
    };
    let failed = std::iter::once(qdisc)
        .chain(answers[1..].iter().copied())
        .find(|&e| e != 0);
    let Some(errno) = failed else {
        return Ok(());
    };
    // Undo the filters that went in; the qdisc may stay (empty, harmless).
    let mut undo = Vec::new();
    let mut undo_seqs = Vec::new();
    for (i, p) in programs.iter().enumerate() {
        if answers[1 + i] == 0 {
            let seq = 100 + i as u32;
            let ours = Filter {
                info: our_info(),
                handle: HANDLE,
            };
            undo.push(delete_filter(ifindex, p.hook, ours, seq));
            undo_seqs.push(seq);
        }
    }
    if !undo.is_empty() {
        for (e, seq) in sock.acked(&undo, &undo_seqs)?.into_iter().zip(&undo_seqs) {
            if e != 0 {
                tracing::warn!(
                    ifindex,
                    seq,
                    errno = e,
                    "undoing a filter of a failed attach"
                );
            }
        }
    }
    Err(std::io::Error::from_raw_os_error(errno).into())
}

/// The filters on `hook` of interface `ifindex` that run a program named
/// `name` (none when the interface or its clsact qdisc is gone).
pub fn find(ifindex: u32, hook: TcAttachType, name: &str) -> Result<Vec<Filter>, NetlinkError> {
    let sock = Socket::open()?;
    let seq = 1;
    let request = Request::new(
        RTM_GETTFILTER,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        &tcmsg(ifindex, 0, parent(hook), 0),
    )
    .finish();
    let mut out = Vec::new();
    sock.dump(request, seq, |m| {
        if m.kind == RTM_NEWTFILTER {
            if let Some(f) = named_filter(m.body, name)? {
                out.push(f);
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// A dumped filter message's filter, when it is a bpf filter running a
/// program named `name`. A chain's head (handle 0) is not a filter.
fn named_filter(body: &[u8], name: &str) -> Result<Option<Filter>, NetlinkError> {
    if body.len() < TCMSG_LEN {
        return Err(NetlinkError::Malformed(format!(
            "a filter message of {} bytes",
            body.len()
        )));
    }
    let handle = u32_at(body, 8);
    let info = u32_at(body, 16);
    if handle == 0 {
        return Ok(None);
    }
    let attrs = attributes(&body[TCMSG_LEN..])?;
    let kind = attrs
        .iter()
        .find(|(k, _)| *k == TCA_KIND)
        .map(|(_, v)| attr_string(v));
    if kind != Some(&b"bpf"[..]) {
        return Ok(None);
    }
    let Some((_, options)) = attrs.iter().find(|(k, _)| *k == TCA_OPTIONS) else {
        return Ok(None);
    };
    let named = attributes(options)?
        .iter()
        .any(|(k, v)| *k == TCA_BPF_NAME && attr_string(v) == name.as_bytes());
    Ok(named.then_some(Filter { info, handle }))
}

/// Removes every filter running one of `programs` (by name) from
/// interface `ifindex`; how many it removed. An interface that is gone
/// has none.
pub fn remove(ifindex: u32, programs: &[(TcAttachType, &str)]) -> Result<usize, NetlinkError> {
    let mut requests = Vec::new();
    let mut seqs = Vec::new();
    for &(hook, name) in programs {
        for f in find(ifindex, hook, name)? {
            let seq = 1 + seqs.len() as u32;
            requests.push(delete_filter(ifindex, hook, f, seq));
            seqs.push(seq);
        }
    }
    if requests.is_empty() {
        return Ok(0);
    }
    let sock = Socket::open()?;
    let mut removed = 0;
    for e in sock.acked(&requests, &seqs)? {
        match e {
            0 => removed += 1,
            // Gone meanwhile, with its interface or by another hand.
            libc::ENOENT | libc::ENODEV => {}
            e => return Err(std::io::Error::from_raw_os_error(e).into()),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::rtnetlink::messages;

    #[test]
    fn our_filter_is_found_by_name_and_others_are_not() {
        let mut body = tcmsg(7, HANDLE, parent(TcAttachType::Ingress), our_info()).to_vec();
        let mut r = Request::new(RTM_NEWTFILTER, 0, 1, &body);
        r.attr_str(TCA_KIND, "bpf")
            .begin_nested(TCA_OPTIONS)
            .attr_str(TCA_BPF_NAME, "palisade_from_pod")
            .end_nested();
        let msg = r.finish();
        let m = &messages(&msg).unwrap()[0];
        assert_eq!(
            named_filter(m.body, "palisade_from_pod").unwrap(),
            Some(Filter {
                info: our_info(),
                handle: HANDLE
            })
        );
        assert_eq!(named_filter(m.body, "palisade_to_pod").unwrap(), None);
        // A chain's head carries the kind but is no filter.
        body[8..12].copy_from_slice(&0u32.to_ne_bytes());
        let mut r = Request::new(RTM_NEWTFILTER, 0, 1, &body);
        r.attr_str(TCA_KIND, "bpf");
        let msg = r.finish();
        assert_eq!(
            named_filter(messages(&msg).unwrap()[0].body, "x").unwrap(),
            None
        );
    }

    #[test]
    fn a_damaged_filter_message_is_an_error() {
        assert!(named_filter(&[0u8; 10], "x").is_err());
        let mut body = tcmsg(7, HANDLE, 0, 0).to_vec();
        body.extend_from_slice(&[40, 0, 1, 0]);
        assert!(named_filter(&body, "x").is_err());
    }

    #[test]
    fn the_hooks_are_the_clsact_parents() {
        assert_eq!(parent(TcAttachType::Ingress), 0xFFFF_FFF2);
        assert_eq!(parent(TcAttachType::Egress), 0xFFFF_FFF3);
        // Priority in the high half, ETH_P_ALL in network order below.
        assert_eq!(our_info(), 0x0001_0300);
    }
}
