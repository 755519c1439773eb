//! The real datapath: Palisade's TC programs loaded with aya, their maps
//! pinned under the enforcer's pin root, attached with TCX to pod host veths
//! (a pod-up attaches them as clsact filters first, promoted to TCX links
//! when the node is quiet: see `filters` and DESIGN.md, "Attaching fast").
//!
//! Maps and links are pinned, so they outlive the process: when the enforcer
//! stops or crashes, every pod stays enforced by the programs already
//! attached, and the next process swaps its own programs into those links
//! (one atomic `bpf_link_update` each) and takes the tables over.
//!
//! Composition with other TC users: each program is attached at the HEAD of
//! its interface's TCX chain (`BPF_F_BEFORE` with no relative link,
//! `tcx_link`), so no program that runs before it can redirect or pass a
//! packet around policy. An allowed packet
//! returns TCX_NEXT (not TCX_PASS), so the programs attached after ours
//! (a CNI's own, observability) still see it; a denied one is dropped there.
//! A program attached later the same way would run before ours:
//! that takes root on the node, which is outside what we can defend.
//!
//! Epochs: the programs let an established flow pass on one conntrack
//! lookup when its entry was written under the direction's current epoch.
//! So whenever `set_endpoint` changes a direction's policy id, that
//! direction gets an epoch no entry can hold: drawn from one node-wide
//! counter that starts above every epoch found in the maps. A table in use
//! is edited in place only by adding or removing host keys
//! (`update_policy`); the reconciler then calls `renew_epochs` for its users
//! when the edit narrowed the table, and for every isolated direction when
//! it takes over from a predecessor (which may have died in between).
//!
//! Every write of endpoint state goes through `endpoint_slots`, which
//! orders it so that no packet ever reads another endpoint's state or a
//! half-written one; policy tables are edited in place and removed only in
//! ways packets cannot misread either (`policy_tables`, and a grace period
//! between the endpoints' last write that named a table and its removal).
//!
//! Pinned maps keep their type and size across upgrades (aya opens a pin
//! as it is), so a map whose shape changes gets a new pin name: `pal_ct4`
//! beside `pal_conntrack`, `pal_verdicts` for `pal_dir_stats` and
//! `pal_stats`, `pal_ep_slots` for `pal_endpoints`, `pal_ep_cache` and
//! `pal_audit`; `legacy` moves what the older ones hold and unpins them.

mod conntrack_maps;
mod endpoint_slots;
pub(crate) mod filters;
pub(crate) mod grace;
pub mod learned;
mod legacy;
mod link_target;
pub(crate) mod mapped;
mod policy_tables;
mod tcx_link;

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, MapData};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::SchedClassifierLink;
use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use endpoint_slots::EndpointSlots;
use grace::Grace;
use link_target::LinkTargetError;
use palisade_ebpf::{
    audit_word, CtConfig, Direction, EpSlot, PortKey, PortValue, MAP_CONNTRACK, MAP_CT4,
    MAP_CT_CONFIG, MAP_DNS_FRAMES, MAP_PORTS, PROG_FROM_POD, PROG_TO_POD,
};
use policy_tables::PolicyTables;

use super::{
    Adopted, AttachMode, Datapath, DatapathError, DatapathErrorKind, EndpointEntry, PolicyId,
    PortSetId, Result,
};
use crate::compile::{PortSet, Prefix};
use crate::sys_bpf;

pub struct BpfDatapath {
    pin_root: PathBuf,
    ebpf: Ebpf,
    /// Every endpoint write (see endpoint_slots).
    slots: EndpointSlots,
    policies: PolicyTables,
    ports: LpmTrie<MapData, PortKey, PortValue>,
    /// The next epoch to hand out; above every epoch in the endpoint and
    /// conntrack maps (see the module comment).
    next_epoch: u32,
    /// Pinned links per interface: (from_pod at TC ingress, to_pod at TC
    /// egress). Holding the fds is not what keeps them attached; the pins are.
    links: BTreeMap<String, [FdLink; 2]>,
    /// How a pod-up attaches: see [`AttachMode`].
    attach_mode: AttachMode,
    /// Interfaces attached by filters (`filters`), not yet promoted to
    /// links.
    fast: BTreeMap<String, FastAttached>,
    /// Names whose pinned links a restart could not read (`PinnedOn::
    /// Unknown`): kept, and never unpinned or replaced by name, as the
    /// interface they are on may have another name by now.
    unlocated: BTreeSet<String>,
    /// Last: the threads above wait on it.
    grace: Arc<Grace>,
}

/// For the kernel tests in `tests/bpf_datapath.rs` only: what packets
/// read, which only a test may look at behind the datapath's back.
impl BpfDatapath {
    /// The endpoint slot of `ifindex` as packets read it.
    #[doc(hidden)]
    pub fn test_slot(&self, ifindex: u32) -> Option<EpSlot> {
        self.slots.get(ifindex)
    }

    /// Which slot holds `ifindex`, and whether packets trust it there by
    /// its position (its home) yet.
    #[doc(hidden)]
    pub fn test_slot_position(&self, ifindex: u32) -> Option<(u32, bool)> {
        self.slots.where_is(ifindex)
    }

    /// The next epoch this datapath hands out.
    #[doc(hidden)]
    pub fn test_next_epoch(&self) -> u32 {
        self.next_epoch
    }
}

#[derive(Clone, Copy)]
struct FastAttached {
    ifindex: u32,
    since: std::time::Instant,
}

/// The two hooks of an interface, with the suffix of their pin files.
const HOOKS: [(&str, TcAttachType, &str); 2] = [
    (PROG_FROM_POD, TcAttachType::Ingress, "from_pod"),
    (PROG_TO_POD, TcAttachType::Egress, "to_pod"),
];

/// `what` failed because of `e`; the kind is the cause's (see
/// `DatapathErrorKind::of`).
pub(super) fn err(
    what: impl std::fmt::Display,
    e: impl Into<super::error::Cause>,
) -> DatapathError {
    DatapathError::caused(what, e)
}

/// Sizes of the maps [`BpfDatapath::load_opts`] creates; None: as compiled.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Entries of the conntrack maps.
    pub conntrack_entries: Option<u32>,
    /// Bytes of the ring buffer of DNS frames copied and held for the
    /// learner (`pal_dns_frames`): what bounds the answers held at once;
    /// one that does not fit passes unheld (counted).
    pub dns_frames_bytes: Option<u32>,
}

/// The kernel's rule for a ring buffer's size: a power of two, and whole
/// pages (4 KiB here); at most 1 GiB, far past any need.
pub fn check_dns_frames_bytes(n: u32) -> std::result::Result<(), String> {
    const PAGE: u32 = 4096;
    const MAX: u32 = 1 << 30;
    if !n.is_power_of_two() || !(PAGE..=MAX).contains(&n) {
        return Err(format!(
            "{n} bytes for the held DNS frames: a power of two from {PAGE} to {MAX} is needed"
        ));
    }
    Ok(())
}

impl BpfDatapath {
    /// Loads the programs, pinning their maps under `pin_root` (created if
    /// missing) so that several enforcers on one machine stay apart.
    pub fn load(pin_root: &Path) -> Result<Self> {
        Self::load_with(pin_root, None)
    }

    /// `conntrack_entries`: the size of the conntrack map when it is first
    /// created (an existing pinned map keeps its size: replacing it would
    /// forget every established flow).
    pub fn load_with(pin_root: &Path, conntrack_entries: Option<u32>) -> Result<Self> {
        Self::load_opts(
            pin_root,
            LoadOptions {
                conntrack_entries,
                ..Default::default()
            },
        )
    }

    /// [`BpfDatapath::load`] with the sizes of `opts` for the maps it
    /// creates (an existing pinned map keeps its size).
    pub fn load_opts(pin_root: &Path, opts: LoadOptions) -> Result<Self> {
        std::fs::create_dir_all(pin_root)
            .map_err(|e| err(format!("creating pin root {}", pin_root.display()), e))?;
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(pin_root);
        if let Some(n) = opts.conntrack_entries {
            if n == 0 {
                return Err(DatapathError::invariant(
                    "the conntrack map needs at least one entry",
                ));
            }
            loader.map_max_entries(MAP_CONNTRACK, n);
            loader.map_max_entries(MAP_CT4, n);
        }
        if let Some(n) = opts.dns_frames_bytes {
            check_dns_frames_bytes(n).map_err(DatapathError::invariant)?;
            loader.map_max_entries(MAP_DNS_FRAMES, n);
        }
        let mut ebpf = load_object(&mut loader)?;
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| DatapathError::invariant(format!("map {name} missing from object")))
        };
        let grace = Grace::start()?;
        let slots = EndpointSlots::take(&mut ebpf, grace.clone())?;
        // An older version's endpoints, before any link runs these
        // programs (they read only the slots).
        if let Some(n) = legacy::take_over(pin_root, &slots)? {
            tracing::info!(endpoints = n, "took over an older version's endpoints");
        }
        let policies = PolicyTables::take(&mut ebpf, grace.clone())?;
        let ports =
            LpmTrie::try_from(take(&mut ebpf, MAP_PORTS)?).map_err(|e| err(MAP_PORTS, e))?;
        let next_epoch = first_unused_epoch(&slots, &ebpf)?;
        std::fs::create_dir_all(pin_root.join("links"))
            .map_err(|e| err("creating the links pin directory", e))?;
        let mut dp = BpfDatapath {
            pin_root: pin_root.to_path_buf(),
            ebpf,
            slots,
            policies,
            ports,
            next_epoch,
            links: BTreeMap::new(),
            attach_mode: AttachMode::Fast,
            fast: BTreeMap::new(),
            unlocated: BTreeSet::new(),
            grace,
        };
        dp.set_conntrack_share(None)?;
        Ok(dp)
    }

    /// Loads the object once, into maps of its own in a scratch directory
    /// beside `pin_root`, and lets it all go. What this node refuses (a
    /// seccomp profile, a missing capability, the verifier, a kernel
    /// without a feature) is found before the node lock: in a surge
    /// rollout, a version that cannot run here must fail while the running
    /// enforcer still has the node, not after taking it over. The large
    /// hash maps are made small ([`PREFLIGHT_SMALL_MAPS`]): their creation
    /// is what is in question, not their size.
    pub fn preflight(pin_root: &Path, opts: LoadOptions) -> Result<()> {
        let scratch = Scratch::create(pin_root)?;
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(&scratch.0);
        for name in PREFLIGHT_SMALL_MAPS {
            loader.map_max_entries(name, PREFLIGHT_MAP_ENTRIES);
        }
        if let Some(n) = opts.dns_frames_bytes {
            check_dns_frames_bytes(n).map_err(DatapathError::invariant)?;
            loader.map_max_entries(MAP_DNS_FRAMES, n);
        }
        load_object(&mut loader).map(drop)
    }

    /// Sets the most conntrack entries one hook of one endpoint may hold
    /// (DESIGN invariant 18); None: a quarter of the IPv4 conntrack map as
    /// it is (a pinned map keeps the size it was made with). Returns the
    /// share set. A share past the map's size is the map's size.
    pub fn set_conntrack_share(&mut self, share: Option<u32>) -> Result<u32> {
        let size = conntrack_maps::entries(&self.ebpf, MAP_CT4)?;
        let share = match share {
            Some(0) => {
                return Err(DatapathError::invariant(
                    "the conntrack share must allow at least one entry",
                ))
            }
            Some(n) => n.min(size),
            None => default_conntrack_share(size),
        };
        let map = self.ebpf.map_mut(MAP_CT_CONFIG).ok_or_else(|| {
            DatapathError::invariant(format!("map {MAP_CT_CONFIG} missing from object"))
        })?;
        let mut config: Array<&mut MapData, CtConfig> =
            Array::try_from(map).map_err(|e| err(MAP_CT_CONFIG, e))?;
        config
            .set(0, CtConfig { share, pad: 0 }, 0)
            .map_err(|e| err(format!("writing {MAP_CT_CONFIG}"), e))?;
        Ok(share)
    }

    /// Waits until packets can no longer act on what endpoints named before
    /// their last write (a policy table about to be removed): a grace
    /// period past that write. Without grace periods (nohz_full kernels)
    /// it cannot wait, says so once, and lets the removal go ahead as
    /// before this wait existed.
    fn quiesce_endpoints(&self) {
        if let Err(e) = self.grace.wait_past(self.slots.last_write()) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| tracing::warn!(error = %e, "tables are removed without waiting for packets that named them"));
        }
    }

    /// How pod-ups attach from now on (`AttachMode::Fast` unless set).
    pub fn with_attach_mode(mut self, mode: AttachMode) -> Self {
        self.attach_mode = mode;
        self
    }

    /// The fast attachment (see `filters`): both programs as filters.
    fn attach_filters(&mut self, ifindex: u32) -> Result<()> {
        let mut fds = Vec::with_capacity(2);
        for (prog_name, attach_type, _) in HOOKS {
            let prog = self.program(prog_name)?;
            let fd = prog.fd().map_err(|e| err(prog_name, e))?;
            fds.push((attach_type, prog_name, fd.as_fd().as_raw_fd()));
        }
        let programs: Vec<filters::Program<'_>> = fds
            .iter()
            .map(|&(hook, name, fd)| filters::Program { hook, fd, name })
            .collect();
        filters::attach(ifindex, &programs)
            .map_err(|e| err(format!("attaching filters to ifindex {ifindex}"), e))
    }

    /// Removes our filters from interface `ifindex` (none if it is gone).
    fn remove_filters(&self, ifindex: u32) -> Result<usize> {
        filters::remove(ifindex, &filters::OURS)
            .map_err(|e| err(format!("removing the filters of ifindex {ifindex}"), e))
    }

    /// The links at the head of both hooks of interface `ifindex`, pinned
    /// under `ifname`, the name it was attached by: the steady state. Made
    /// by index (`tcx_link`), so a rename or a newer interface of the name
    /// cannot put them elsewhere.
    fn attach_tcx(&mut self, ifname: &str, ifindex: u32) -> Result<()> {
        if self.unlocated.contains(ifname) {
            return Err(DatapathError::invariant(format!(
                "attaching to {ifname} (index {ifindex}): its name's pins hold links a restart could not read, which may be on another interface now; they are kept, and this interface is not attached by links until a restart reads them"
            )));
        }
        let mut made: Vec<FdLink> = Vec::with_capacity(2);
        for (prog_name, attach_type, hook) in HOOKS {
            let path = self.link_pin(ifname, hook);
            let result = (|| {
                let prog = self
                    .program(prog_name)?
                    .fd()
                    .and_then(|fd| Ok(fd.as_fd().try_clone_to_owned()?))
                    .map_err(|e| err(prog_name, e))?;
                let link =
                    tcx_link::attach_first(prog.as_fd(), ifindex, attach_type).map_err(|e| {
                        gone_or(
                            ifindex,
                            format!("attaching {prog_name} to {ifname} (index {ifindex})"),
                            e,
                        )
                    })?;
                // After the attach, so a stale link replaced here leaves
                // the hook only once ours is on it.
                self.clear_stale_pin(&path, ifindex)?;
                sys_bpf::obj_pin(link.as_fd(), &path)
                    .map_err(|e| err(format!("pinning {}", path.display()), e))?;
                PinnedLink::from_pin(&path).map(FdLink::from).map_err(|e| {
                    let _ = std::fs::remove_file(&path);
                    err(format!("opening {}", path.display()), e)
                })
            })();
            match result {
                Ok(fd) => made.push(fd),
                Err(e) => {
                    // Undo the first hook if the second failed: both or
                    // none. Only the pins of the hooks done: a pin found in
                    // the way is another interface's, and stays.
                    for (_, _, hook) in &HOOKS[..made.len()] {
                        let _ = std::fs::remove_file(self.link_pin(ifname, hook));
                    }
                    return Err(e);
                }
            }
        }
        let to = made.pop().expect("two hooks");
        let from = made.pop().expect("two hooks");
        self.links.insert(ifname.to_string(), [from, to]);
        Ok(())
    }

    /// Makes way at `path` for a link of interface `ifindex`: a pin there
    /// that is not one this process holds is a previous process's (killed
    /// between its two hooks, or before a detach finished). It is removed
    /// if its link is on `ifindex` (ours, attached by then, replaces it) or
    /// on no interface; one on another live
    /// interface, or that cannot be read, stays, and the attach fails
    /// rather than detach someone else's programs.
    fn clear_stale_pin(&self, path: &Path, ifindex: u32) -> Result<()> {
        let on = match link_target::pinned_tcx_ifindex(path) {
            Err(LinkTargetError::Open { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(())
            }
            Err(e) => {
                return Err(err(
                    format!(
                        "{} is pinned already and cannot be read; not replacing it",
                        path.display()
                    ),
                    e,
                ))
            }
            Ok(on) => on,
        };
        if on != ifindex && !index_gone(on) {
            return Err(DatapathError::invariant(format!(
                "{} is pinned already, by a link on interface {on}; not replacing it, which would detach that interface's programs",
                path.display()
            )));
        }
        std::fs::remove_file(path)
            .map_err(|e| err(format!("removing the stale pin {}", path.display()), e))
    }

    /// Interfaces a previous process attached by filters and did not
    /// promote (it stopped first): found by the endpoint slots no link
    /// covers, and promoted now, so every adopted interface runs this
    /// process's programs at the head of its chains. Returns every such
    /// interface that still exists, by its name now and its index. One that
    /// went meanwhile is skipped; one whose promotion fails stays on its
    /// filters, which keep enforcing, is named in `warnings` and is promoted
    /// later, as at runtime.
    fn adopt_filters(
        &mut self,
        linked: &BTreeMap<String, u32>,
        warnings: &mut Vec<String>,
    ) -> Result<BTreeMap<String, u32>> {
        let covered: BTreeSet<u32> = linked.values().copied().collect();
        let candidates: Vec<u32> = self
            .slots
            .all()
            .into_keys()
            .filter(|i| !covered.contains(i))
            .collect();
        let mut found = BTreeMap::new();
        for ifindex in candidates {
            match filters::with_ours([ifindex]) {
                Ok(ours) => found.extend(ours),
                // Deleted while we looked, with its filters.
                Err(_) if index_gone(ifindex) => {}
                // Filters we cannot see would be left without an endpoint
                // entry (which passes everything): stop instead.
                Err(e) => {
                    return Err(err(
                        format!(
                            "listing the filters of ifindex {ifindex}, an endpoint without links"
                        ),
                        e,
                    ))
                }
            }
        }
        let mut adopted = BTreeMap::new();
        for (ifindex, ifname) in found {
            match self
                .attach_tcx(&ifname, ifindex)
                .and_then(|()| self.remove_filters(ifindex).map(drop))
            {
                Ok(()) => {}
                Err(e) if e.kind() == DatapathErrorKind::InterfaceGone => continue,
                Err(e) => self.keep_on_filters(&ifname, ifindex, e, warnings),
            }
            adopted.insert(ifname, ifindex);
        }
        Ok(adopted)
    }

    /// An adopted interface whose promotion failed: its filters keep
    /// enforcing, and it waits for promotion like a pod-up's (`promote`
    /// retries; links already made are kept).
    fn keep_on_filters(
        &mut self,
        ifname: &str,
        ifindex: u32,
        e: DatapathError,
        warnings: &mut Vec<String>,
    ) {
        warnings.push(format!(
            "promoting {ifname} (index {ifindex}) from the previous enforcer's filters to links: {e}; its filters keep enforcing its policy, and the promotion is retried"
        ));
        let since = std::time::Instant::now();
        self.fast
            .insert(ifname.to_string(), FastAttached { ifindex, since });
    }

    fn link_pin(&self, ifname: &str, hook: &str) -> PathBuf {
        link_pin(&self.pin_root, ifname, hook)
    }

    /// Takes over the links a previous process pinned: each gets this
    /// process's program, atomically, so the hook is never empty. Returns
    /// them by the name they were pinned by, with the index of the
    /// interface the kernel says they are on: an interface renamed since is
    /// still taken over (the reconciler follows it by index). A link whose
    /// interface is gone is unpinned; an interface with one hook's link
    /// only (its attach was cut short) is attached anew.
    ///
    /// Kept as they are, named in `warnings`, with the previous process's
    /// program (on the same pinned maps): links on a live interface that
    /// cannot be taken over (listed as attached, by that interface's
    /// index), and links that cannot be read (`unlocated`: where they are
    /// cannot be said, so neither can whose endpoint entry they need).
    /// Unpinning either would detach a live pod's policy.
    fn adopt_links(&mut self, warnings: &mut Vec<String>) -> Result<BTreeMap<String, u32>> {
        let mut adopted = BTreeMap::new();
        for ifname in super::inspect::pinned_link_names(&self.pin_root)? {
            let (taken, index) = match self.pinned_links_on(&ifname) {
                PinnedOn::Live(index) => (self.adopt_interface(&ifname).map(Some), index),
                PinnedOn::Half(index) => (self.adopt_half(&ifname, index, warnings), index),
                PinnedOn::Unknown(e) => {
                    warnings.push(format!(
                        "{ifname}: its pinned links could not be read ({e}); kept, with the previous enforcer's programs, on whichever interface they are; endpoint entries no link explains are set to deny until a restart reads them"
                    ));
                    self.unlocated.insert(ifname);
                    continue;
                }
                PinnedOn::Gone(e) => {
                    tracing::info!(%ifname, "unpinning the links of an interface that is gone: {e}");
                    for (_, _, hook) in HOOKS {
                        let _ = std::fs::remove_file(self.link_pin(&ifname, hook));
                    }
                    continue;
                }
            };
            match taken {
                Ok(Some(links)) => {
                    self.links.insert(ifname.clone(), links);
                }
                Ok(None) => {}
                Err(e) => warnings.push(format!(
                    "{ifname} (index {index}): its pinned links could not be taken over ({e}); kept, so the previous enforcer's programs go on enforcing there until the interface goes or a restart takes them over"
                )),
            }
            adopted.insert(ifname, index);
        }
        Ok(adopted)
    }

    /// An interface a previous process left with one hook's link: a fresh
    /// pair replaces it. If the links cannot be made, filters enforce
    /// instead and the promotion is retried as at runtime; the lone link
    /// stays until a promotion replaces it.
    fn adopt_half(
        &mut self,
        ifname: &str,
        ifindex: u32,
        warnings: &mut Vec<String>,
    ) -> Result<Option<[FdLink; 2]>> {
        let Err(e) = self.attach_tcx(ifname, ifindex) else {
            return Ok(None);
        };
        self.attach_filters(ifindex).map_err(|f| {
            err(
                format!("{ifname} had one hook's link only, and neither links ({e}) nor filters could be attached"),
                f,
            )
        })?;
        warnings.push(format!(
            "{ifname} (index {ifindex}) had one hook's link only, and links could not be made ({e}); its filters enforce its policy, and the promotion is retried"
        ));
        let since = std::time::Instant::now();
        self.fast
            .insert(ifname.to_string(), FastAttached { ifindex, since });
        Ok(None)
    }

    /// Which interface `ifname`'s pinned links are on, read from the links
    /// themselves, never from the name: a renamed interface's name may be
    /// another's, or no one's.
    fn pinned_links_on(&self, ifname: &str) -> PinnedOn {
        let mut on = Vec::with_capacity(2);
        for (_, _, hook) in HOOKS {
            let path = self.link_pin(ifname, hook);
            match link_target::pinned_tcx_ifindex(&path) {
                Ok(index) => on.push(Some(index)),
                Err(LinkTargetError::Open { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    on.push(None)
                }
                Err(e) => return PinnedOn::Unknown(err(format!("interface {ifname:?}"), e)),
            }
        }
        let indexes: BTreeSet<u32> = on.iter().flatten().copied().collect();
        let gone =
            |msg: String| PinnedOn::Gone(DatapathError::new(DatapathErrorKind::InterfaceGone, msg));
        match indexes.iter().copied().collect::<Vec<_>>()[..] {
            [] => gone(format!("no link is pinned for {ifname}")),
            [index] if index_gone(index) => {
                gone(format!("interface {index} of {ifname}'s links is gone"))
            }
            [index] if on.contains(&None) => PinnedOn::Half(index),
            [index] => PinnedOn::Live(index),
            _ => PinnedOn::Unknown(DatapathError::invariant(format!(
                "the links pinned for {ifname} are on two interfaces, {indexes:?}"
            ))),
        }
    }

    fn adopt_interface(&mut self, ifname: &str) -> Result<[FdLink; 2]> {
        let mut out = Vec::with_capacity(2);
        for (prog_name, _, hook) in HOOKS {
            let path = self.link_pin(ifname, hook);
            let pinned = PinnedLink::from_pin(&path).map_err(|e| err(path.display(), e))?;
            let link = SchedClassifierLink::try_from(FdLink::from(pinned))
                .map_err(|e| err(path.display(), e))?;
            let prog = self.program(prog_name)?;
            let id = prog
                .attach_to_link(link)
                .map_err(|e| err(format!("updating {}", path.display()), e))?;
            let link = prog.take_link(id).map_err(|e| err(path.display(), e))?;
            out.push(FdLink::try_from(link).map_err(|e| err(path.display(), e))?);
        }
        let to = out.pop().expect("two hooks");
        let from = out.pop().expect("two hooks");
        Ok([from, to])
    }

    /// Runs one of the programs on a frame with BPF_PROG_TEST_RUN, as if it
    /// arrived on interface `ifindex`, and returns the TC verdict. Nothing
    /// needs to be attached; used to check the tables against their model.
    pub fn test_run(&self, program: &str, frame: &[u8], ifindex: u32) -> Result<i32> {
        use aya::programs::{TestRun, TestRunOptions};
        let prog: &SchedClassifier = self
            .ebpf
            .program(program)
            .ok_or_else(|| DatapathError::invariant(format!("program {program} missing")))?
            .try_into()
            .map_err(|e| err(program, e))?;
        // struct __sk_buff up to and including ifindex (offset 40).
        let mut ctx = [0u8; 44];
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        let mut out = vec![0u8; frame.len() + 256];
        let run = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ..TestRunOptions::default()
            })
            .map_err(|e| err("BPF_PROG_TEST_RUN", e))?;
        Ok(run.return_value as i32)
    }

    fn program(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        self.ebpf
            .program_mut(name)
            .ok_or_else(|| DatapathError::invariant(format!("program {name} missing")))?
            .try_into()
            .map_err(|e| err(name, e))
    }
}

/// The object loaded (maps created or opened, as `loader` says) with both
/// programs through the verifier.
fn load_object(loader: &mut EbpfLoader<'_>) -> Result<Ebpf> {
    let mut ebpf = loader
        .load(palisade_ebpf::OBJECT)
        // With its causes: "failed to create map" alone does not say
        // whether seccomp, a capability or memory refused it.
        .map_err(|e| DatapathError::chained("loading the eBPF object", e))?;
    for name in [PROG_FROM_POD, PROG_TO_POD] {
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or_else(|| DatapathError::invariant(format!("program {name} missing from object")))?
            .try_into()
            .map_err(|e| err(name, e))?;
        prog.load().map_err(|e| err(format!("loading {name}"), e))?;
    }
    Ok(ebpf)
}

/// The hash maps a preflight makes small: the verifier does not read their
/// size, and at full size most are preallocated (tens of MB).
const PREFLIGHT_SMALL_MAPS: [&str; 10] = [
    palisade_ebpf::MAP_EP_INDEX,
    palisade_ebpf::MAP_POLICY_EXACT,
    palisade_ebpf::MAP_POLICY_LENS,
    MAP_CONNTRACK,
    MAP_CT4,
    palisade_ebpf::MAP_LEARNED_INDEX,
    palisade_ebpf::MAP_FRAGS4,
    palisade_ebpf::MAP_FRAGS6,
    palisade_ebpf::MAP_DNS_FRAGS,
    palisade_ebpf::MAP_DNS_SERVERS,
];
const PREFLIGHT_MAP_ENTRIES: u32 = 1024;

/// A preflight's own pin directory beside the pin root (bpffs refuses dots
/// in names), removed with its pins when dropped. Two enforcers may preflight at once (a surge, each
/// its container's PID 1): the name is drawn per process. One left by a
/// process killed mid-preflight is removed by a later one once it is
/// older than [`SCRATCH_STALE`].
struct Scratch(PathBuf);

const SCRATCH_STALE: std::time::Duration = std::time::Duration::from_secs(600);

impl Scratch {
    fn create(pin_root: &Path) -> Result<Scratch> {
        let parent = pin_root.parent().unwrap_or(Path::new("/"));
        let prefix = format!(
            "{}-preflight-",
            pin_root.file_name().unwrap_or_default().to_string_lossy()
        );
        if let Ok(entries) = std::fs::read_dir(parent) {
            for e in entries.flatten() {
                let stale = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > SCRATCH_STALE);
                if stale && e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = parent.join(format!("{prefix}{:x}-{nanos:x}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("creating {}", dir.display()), e))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!("removing the preflight's {}: {e}", self.0.display());
        }
    }
}

/// Which interface a previous process's pinned links are on.
enum PinnedOn {
    /// This one, which exists (under the pin's name or another).
    Live(u32),
    /// This one, which exists, by one hook's link only: the other's pin is
    /// missing (the previous process stopped between the two).
    Half(u32),
    /// None any more: the links can be unpinned.
    Gone(DatapathError),
    /// Cannot be said (a pin could not be read, or the two are on two
    /// interfaces): the links are kept.
    Unknown(DatapathError),
}

/// Whether the kernel says no interface has index `ifindex` (a failed
/// lookup is not an answer).
fn index_gone(ifindex: u32) -> bool {
    ifindex == 0
        || matches!(
            nix::net::if_::if_indextoname(ifindex),
            Err(nix::errno::Errno::ENXIO | nix::errno::Errno::ENODEV)
        )
}

/// `what` failed because of `e`: an InterfaceGone error if interface
/// `ifindex` is gone by now (whatever `e` says), else of `e`'s kind.
fn gone_or(ifindex: u32, what: String, e: impl Into<super::error::Cause>) -> DatapathError {
    if index_gone(ifindex) {
        DatapathError::new(
            DatapathErrorKind::InterfaceGone,
            format!("{what}: no interface has index {ifindex}"),
        )
    } else {
        err(what, e)
    }
}

/// Where the link of `ifname`'s `hook` is pinned.
fn link_pin(pin_root: &Path, ifname: &str, hook: &str) -> PathBuf {
    pin_root
        .join("links")
        .join(format!("{}@{hook}", pin_name(ifname)))
}

/// The index of the interface the links pinned for `ifname` are on, for
/// reading only (0: gone, or neither the links nor the name say).
pub(crate) fn pinned_link_index(pin_root: &Path, ifname: &str) -> u32 {
    let (_, _, hook) = HOOKS[0];
    link_target::pinned_tcx_ifindex(&link_pin(pin_root, ifname, hook))
        .ok()
        .or_else(|| nix::net::if_::if_nametoindex(ifname).ok())
        .unwrap_or(0)
}

/// bpffs refuses names with a dot, which interface names may have
/// (`eth0.100`): percent-encode it (and `%` and `@`, so decoding is exact).
fn pin_name(ifname: &str) -> String {
    let mut out = String::with_capacity(ifname.len());
    for c in ifname.chars() {
        match c {
            '%' => out.push_str("%25"),
            '.' => out.push_str("%2E"),
            '@' => out.push_str("%40"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn ifname_of_pin(encoded: &str) -> String {
    encoded
        .replace("%2E", ".")
        .replace("%40", "@")
        .replace("%25", "%")
}

/// One more than the highest epoch any endpoint or conntrack entry holds, so
/// a fresh epoch never matches an entry left by an earlier process, pod or
/// policy. (2^32 policy changes on one node would wrap it.)
fn first_unused_epoch(slots: &EndpointSlots, ebpf: &Ebpf) -> Result<u32> {
    let mut highest = conntrack_maps::highest_epoch(ebpf)?;
    for e in slots.all().values() {
        highest = highest.max(e.ingress().epoch).max(e.egress().epoch);
    }
    Ok(highest.wrapping_add(1).max(1))
}

/// A quarter of a conntrack map of `size` entries: one pod hook alone fills
/// at most that, and a pod flooding new flows makes entries at its own
/// hook and at its peers' ingress hooks, so half the table stays for
/// everyone else even then.
fn default_conntrack_share(size: u32) -> u32 {
    (size / 4).max(1)
}

/// The slot value an endpoint entry asks for (its epochs given); more
/// addresses than the programs hold is an error (writing some of them
/// would drop the pod's traffic from the rest, writing none would drop
/// everything).
fn endpoint_value(ifindex: u32, entry: &EndpointEntry, epochs: (u32, u32)) -> Result<EpSlot> {
    let dir = |policy, epoch| Direction { policy, epoch };
    EpSlot::new(
        ifindex,
        dir(entry.ingress, epochs.0),
        dir(entry.egress, epochs.1),
        &entry.pod_addrs,
    )
    .ok_or_else(|| {
        DatapathError::invariant(format!(
            "pod has {} addresses, the datapath holds at most {}",
            entry.pod_addrs.len(),
            palisade_ebpf::MAX_POD_ADDRS
        ))
    })
}

/// The epochs of an endpoint's new entry: a direction whose policy id stays
/// keeps its epoch (its flows stay established); one that changes, or is
/// new, gets `fresh`. Also says whether `fresh` was used.
fn epochs_for(old: Option<&EpSlot>, new: &EndpointEntry, fresh: u32) -> (u32, u32, bool) {
    let keep = |old: Direction, new_id: u32| (old.policy == new_id).then_some(old.epoch);
    let ingress = old.and_then(|o| keep(o.ingress(), new.ingress));
    let egress = old.and_then(|o| keep(o.egress(), new.egress));
    let used = ingress.is_none() || egress.is_none();
    (ingress.unwrap_or(fresh), egress.unwrap_or(fresh), used)
}

/// The table's keys of a port set, each with its value (a denying entry
/// of a tiered set holds `allow` 0, which the programs read as a drop).
fn port_keys(id: PortSetId, set: &PortSet) -> Vec<(Key<PortKey>, PortValue)> {
    set.0
        .iter()
        .map(|e| {
            let key = match e.key() {
                (None, _, _) => PortKey::lpm_any_protocol(id),
                (Some(proto), port, bits) => PortKey::lpm(id, proto, port, bits),
            };
            let value = if e.allows() {
                PortValue::ALLOW
            } else {
                PortValue::DENY
            };
            (key, value)
        })
        .collect()
}

impl Datapath for BpfDatapath {
    fn adopt(&mut self) -> Result<Adopted> {
        let mut warnings = Vec::new();
        let mut attached = self.adopt_links(&mut warnings)?;
        let by_filters = self.adopt_filters(&attached, &mut warnings)?;
        if !by_filters.is_empty() {
            tracing::info!(interfaces = ?by_filters, "took over the interfaces a previous process had attached by filters");
        }
        attached.extend(by_filters);
        let mut adopted = Adopted {
            attached,
            unlocated: self.unlocated.clone(),
            warnings,
            ..Adopted::default()
        };
        super::inspect::read_tables(
            &self.slots.all(),
            &self.policies.trie,
            &self.ports,
            &mut adopted,
        )?;
        self.policies.adopt(&adopted.policies)?;
        // The older programs no longer run on any adopted link.
        let moved = conntrack_maps::move_v4_entries(&mut self.ebpf)?;
        if moved > 0 {
            tracing::info!(moved, "moved IPv4 conntrack entries to {MAP_CT4}");
        }
        legacy::unpin(&self.pin_root)?;
        Ok(adopted)
    }

    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        for (k, v) in port_keys(id, set) {
            self.ports
                .insert(&k, v, 0)
                .map_err(|e| err(format!("writing {MAP_PORTS}"), e))?;
        }
        Ok(())
    }

    fn remove_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.quiesce_endpoints();
        for (k, _) in port_keys(id, set) {
            let _ = self.ports.remove(&k);
        }
        Ok(())
    }

    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.policies.add(id, entries)
    }

    fn remove_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        // Only tables no endpoint names any more are removed; a packet
        // that read the name before the endpoint's last write may still be
        // judging by it.
        self.quiesce_endpoints();
        self.policies.remove(id, entries)
    }

    fn ifindex(&mut self, ifname: &str) -> Result<u32> {
        nix::net::if_::if_nametoindex(ifname)
            .map_err(|e| err(format!("interface {ifname:?} does not exist"), e))
    }

    fn interfaces(&mut self) -> Result<BTreeMap<String, u32>> {
        // One walk of the kernel's list (if_nameindex is a netlink dump in
        // glibc), not a lookup per name.
        Ok(nix::net::if_::if_nameindex()
            .map_err(|e| err("listing interfaces", e))?
            .iter()
            .map(|i| (i.name().to_string_lossy().into_owned(), i.index()))
            .collect())
    }

    fn interfaces_named(&mut self, names: &[&str]) -> Result<BTreeMap<String, u32>> {
        // One lookup by name each (SIOCGIFINDEX) on one socket: a dump of
        // every link with its statistics costs a node with many pods far
        // more, and so does a socket per name (see `ifindex`).
        let lookup = super::ifindex::IndexLookup::open()
            .map_err(|e| err("opening a socket to look up interfaces", e))?;
        let mut out = BTreeMap::new();
        for name in names {
            match lookup.index(name) {
                Ok(Some(i)) => {
                    out.insert(name.to_string(), i);
                }
                Ok(None) => {}
                // Not an answer about the interface: the caller keeps what
                // it knew rather than forget a pod's interface.
                Err(e) => return Err(err(format!("looking up interface {name:?}"), e)),
            }
        }
        Ok(out)
    }

    fn interfaces_indexed(&mut self, indexes: &[u32]) -> Result<BTreeMap<u32, String>> {
        // As `interfaces_named`: one SIOCGIFNAME each, on one socket.
        let lookup = super::ifindex::IndexLookup::open()
            .map_err(|e| err("opening a socket to look up interfaces", e))?;
        let mut out = BTreeMap::new();
        for &index in indexes {
            match lookup.name(index) {
                Ok(Some(name)) => {
                    out.insert(index, name);
                }
                Ok(None) => {}
                Err(e) => return Err(err(format!("looking up ifindex {index}"), e)),
            }
        }
        Ok(out)
    }

    fn attach(&mut self, ifname: &str, ifindex: u32) -> Result<()> {
        if self.links.contains_key(ifname) {
            return Ok(());
        }
        if self.fast.get(ifname).is_some_and(|f| f.ifindex == ifindex) {
            return Ok(());
        }
        // A recorded fast attachment of another index: that interface is
        // gone, and its filters with it.
        self.fast.remove(ifname);
        if self.attach_mode == AttachMode::Fast {
            match self.attach_filters(ifindex) {
                Ok(()) => {
                    let since = std::time::Instant::now();
                    self.fast
                        .insert(ifname.to_string(), FastAttached { ifindex, since });
                    return Ok(());
                }
                // Another filter in our place, or no clsact qdisc to be
                // had: the links do not depend on either.
                Err(e) => tracing::info!(%ifname, "attaching by links: {e}"),
            }
        }
        self.attach_tcx(ifname, ifindex)?;
        if self.attach_mode == AttachMode::Fast {
            // Our own filters from an earlier process may be what stood
            // in the way; behind the links they only judge twice.
            if let Err(e) = self.remove_filters(ifindex) {
                tracing::warn!(%ifname, "{e}");
            }
        }
        Ok(())
    }

    fn detach(&mut self, ifname: &str, _ifindex: u32) -> Result<()> {
        if let Some(f) = self.fast.get(ifname).copied() {
            // By index: a newer interface of the same name is not touched.
            self.remove_filters(f.ifindex)?;
            self.fast.remove(ifname);
        }
        if self.unlocated.contains(ifname) {
            // Those pins may hold another interface's links now (see
            // `unlocated`); this name never got links of this process.
            return Ok(());
        }
        // Unpinning and closing the last fd releases a link, which detaches
        // it; a link whose interface is already gone was released already.
        for (_, _, hook) in HOOKS {
            let path = self.link_pin(ifname, hook);
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(err(format!("unpinning {}", path.display()), e));
                }
            }
        }
        self.links.remove(ifname);
        Ok(())
    }

    fn unpromoted(&self) -> Vec<(String, u32, std::time::Instant)> {
        let mut out: Vec<_> = self
            .fast
            .iter()
            .map(|(n, f)| (n.clone(), f.ifindex, f.since))
            .collect();
        out.sort_by_key(|(_, _, since)| *since);
        out
    }

    fn promote(&mut self, ifname: &str) -> Result<()> {
        let Some(f) = self.fast.get(ifname).copied() else {
            return Ok(());
        };
        if index_gone(f.ifindex) {
            // A newer interface may have its name; its filters went with it.
            self.fast.remove(ifname);
            return Ok(());
        }
        // By index: a renamed interface is promoted too, its links pinned
        // by the name it was attached by, as the reconciler knows it.
        if !self.links.contains_key(ifname) {
            self.attach_tcx(ifname, f.ifindex)?;
        }
        // The links judge first from here on; the filters only twice.
        self.remove_filters(f.ifindex)?;
        self.fast.remove(ifname);
        Ok(())
    }

    fn set_endpoint(&mut self, ifindex: u32, entry: &EndpointEntry) -> Result<()> {
        // Each direction's policy id and epoch change together, in one
        // store; addresses only with a slot of their own (endpoint_slots).
        let old = self.slots.get(ifindex);
        let fresh = self.next_epoch;
        let (ingress_epoch, egress_epoch, used) = epochs_for(old.as_ref(), entry, fresh);
        let value = endpoint_value(ifindex, entry, (ingress_epoch, egress_epoch))?;
        self.slots
            .set(ifindex, value.ingress(), value.egress(), value.pod_addrs())
            .map_err(|e| err(format!("writing the endpoint of ifindex {ifindex}"), e))?;
        if used {
            self.next_epoch = fresh.wrapping_add(1).max(1);
        }
        Ok(())
    }

    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        self.slots
            .remove(ifindex)
            .map_err(|e| err(format!("removing endpoint {ifindex}"), e))
    }

    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        // One address dump, not getifaddrs' dump of every link first (see
        // `addresses`); IPv6 link-local addresses are left out there.
        super::addresses::node_addresses().map_err(|e| err("listing the node's addresses", e))
    }

    fn describe(&self) -> String {
        self.pin_root.display().to_string()
    }

    fn set_learns(&mut self, ifindex: u32, learns: bool) -> Result<()> {
        let flags = if learns {
            palisade_ebpf::EP_FLAG_LEARNS
        } else {
            0
        };
        self.slots.set_flags(ifindex, flags)
    }

    fn set_audit(&mut self, ifindex: u32, entry: &super::AuditEntry) -> Result<()> {
        self.slots
            .set_audit(ifindex, audit_word(entry.ingress, entry.egress))
    }

    fn remove_audit(&mut self, ifindex: u32) -> Result<()> {
        if self.slots.get(ifindex).is_none() {
            return Ok(());
        }
        self.slots.set_audit(ifindex, 0)
    }

    fn audit_entries(&mut self) -> Result<BTreeMap<u32, super::AuditEntry>> {
        Ok(self
            .slots
            .all()
            .into_iter()
            .filter(|(_, e)| e.audit != 0)
            .map(|(ifindex, e)| {
                let (ingress, egress) = e.audit();
                (ifindex, super::AuditEntry { ingress, egress })
            })
            .collect())
    }

    // In-place edits of a table in use (reconciler::in_place): the trie
    // one key at a time, in order, the exact map and length list only
    // where no packet can be reading what they replace (policy_tables).
    fn update_policy(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()> {
        self.policies.edit(id, upserts, removals)
    }

    fn renew_epochs(&mut self, ifindex: u32, ingress: bool, egress: bool) -> Result<()> {
        let old = self.slots.get(ifindex).ok_or_else(|| {
            DatapathError::invariant(format!(
                "renewing the epochs of ifindex {ifindex}: no endpoint"
            ))
        })?;
        let fresh = self.next_epoch;
        let renew = |d: Direction, yes: bool| {
            if yes {
                Direction { epoch: fresh, ..d }
            } else {
                d
            }
        };
        // Policies and addresses unchanged: one store per direction.
        self.slots.set(
            ifindex,
            renew(old.ingress(), ingress),
            renew(old.egress(), egress),
            old.pod_addrs(),
        )?;
        self.next_epoch = fresh.wrapping_add(1).max(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> [u8; 16] {
        std::net::Ipv4Addr::new(10, 0, 0, last)
            .to_ipv6_mapped()
            .octets()
    }

    #[test]
    fn endpoint_value_carries_every_address_or_refuses() {
        let entry = EndpointEntry {
            ingress: 3,
            egress: 4,
            pod_addrs: vec![v4(1), v4(2)],
        };
        let v = endpoint_value(7, &entry, (5, 6)).unwrap();
        assert_eq!((v.ingress().policy, v.egress().policy), (3, 4));
        assert_eq!((v.ingress().epoch, v.egress().epoch), (5, 6));
        assert_eq!(v.pod_addrs(), &[v4(1), v4(2)]);

        let too_many = EndpointEntry {
            pod_addrs: (1..=5).map(v4).collect(),
            ..entry
        };
        let e = endpoint_value(7, &too_many, (0, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("5 addresses") && e.contains("at most 4"), "{e}");
    }

    #[test]
    fn a_direction_gets_a_fresh_epoch_exactly_when_its_policy_changes() {
        let entry = |ingress, egress| EndpointEntry {
            ingress,
            egress,
            pod_addrs: Vec::new(),
        };
        let slot =
            |ingress, egress, ie, ee| endpoint_value(1, &entry(ingress, egress), (ie, ee)).unwrap();
        assert_eq!(epochs_for(None, &entry(1, 2), 9), (9, 9, true), "new");
        let old = slot(1, 2, 4, 5);
        assert_eq!(epochs_for(Some(&old), &entry(1, 2), 9), (4, 5, false));
        assert_eq!(epochs_for(Some(&old), &entry(3, 2), 9), (9, 5, true));
        assert_eq!(epochs_for(Some(&old), &entry(1, 0), 9), (4, 9, true));
        assert_eq!(epochs_for(Some(&old), &entry(0, 0), 9), (9, 9, true));
    }

    #[test]
    fn the_default_conntrack_share_is_a_quarter_of_the_map() {
        assert_eq!(default_conntrack_share(65536), 16384);
        assert_eq!(default_conntrack_share(3), 1);
    }

    #[test]
    fn pin_names_have_no_dots_and_decode_exactly() {
        for name in ["veth1", "eth0.100", "a%2Eb", "x@y", "%", "."] {
            let pin = pin_name(name);
            assert!(!pin.contains('.') && !pin.contains('@'), "{pin}");
            assert_eq!(ifname_of_pin(&pin), name);
        }
    }
}
