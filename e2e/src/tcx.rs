//! The kernel's own answer to "which programs are on this device's TC
//! hooks": BPF_PROG_QUERY for TCX ingress and egress (the bpftool of this
//! machine predates TCX and shows nothing), and `tc filter show` for classic
//! clsact filters.
//!
//! The query must run in the device's namespace (ifindexes are per
//! namespace); callers run it on a thread inside it.

use std::process::Command;

use anyhow::{bail, Context, Result};

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The `query` member of `union bpf_attr`, laid out as the kernel reads it.
#[repr(C, align(8))]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// How many programs are attached to each TCX hook of `ifindex`
/// (ingress, egress), in the calling thread's namespace.
pub fn tcx_counts(ifindex: u32) -> Result<(u32, u32)> {
    Ok((
        query(ifindex, BPF_TCX_INGRESS)?,
        query(ifindex, BPF_TCX_EGRESS)?,
    ))
}

fn query(ifindex: u32, attach_type: u32) -> Result<u32> {
    let mut attr = QueryAttr {
        target_ifindex: ifindex,
        attach_type,
        ..QueryAttr::default()
    };
    // SAFETY: attr is a live, correctly sized bpf_attr prefix; with
    // prog_ids = 0 the kernel only writes the count back into attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut QueryAttr,
            std::mem::size_of::<QueryAttr>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("BPF_PROG_QUERY on ifindex {ifindex}"));
    }
    Ok(attr.prog_cnt)
}

/// Classic TC filters with a BPF program on the device (`tc filter show`),
/// run in the namespace at `netns_path`.
pub fn classic_bpf_filters(netns_path: &str, dev: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for hook in ["ingress", "egress"] {
        let out = Command::new("nsenter")
            .arg(format!("--net={netns_path}"))
            .args(["tc", "filter", "show", "dev", dev, hook])
            .output()
            .context("running tc filter show")?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            // No clsact qdisc: no classic filter.
            if err.contains("Cannot find specified qdisc") || err.trim().is_empty() {
                continue;
            }
            bail!("tc filter show dev {dev} {hook} failed: {}", err.trim());
        }
        found.extend(bpf_filter_lines(
            &String::from_utf8_lossy(&out.stdout),
            hook,
        ));
    }
    Ok(found)
}

fn bpf_filter_lines(text: &str, hook: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(" bpf "))
        .map(|l| format!("tc/{hook}: {}", l.trim()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_attr_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<QueryAttr>(), 64);
        assert_eq!(std::mem::offset_of!(QueryAttr, prog_ids), 16);
        assert_eq!(std::mem::offset_of!(QueryAttr, prog_cnt), 24);
        assert_eq!(std::mem::offset_of!(QueryAttr, revision), 56);
    }

    #[test]
    fn finds_bpf_filters_only() {
        let out = "filter protocol all pref 49152 bpf chain 0 \nfilter protocol all pref 49152 bpf chain 0 handle 0x1 palisade direct-action not_in_hw id 12\nfilter protocol ip pref 1 u32 chain 0\n";
        assert_eq!(bpf_filter_lines(out, "ingress").len(), 2);
    }
}
