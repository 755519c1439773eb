//! The real datapath: Palisade's TC programs loaded with aya, their maps
//! pinned under the enforcer's pin root, attached with TCX to pod host veths.
//!
//! Maps and links are pinned, so they outlive the process: when the enforcer
//! stops or crashes, every pod stays enforced by the programs already
//! attached, and the next process swaps its own programs into those links
//! (one atomic `bpf_link_update` each) and takes the tables over.
//!
//! Composition with other TC users: each program is attached at the HEAD of
//! its interface's TCX chain (`LinkOrder::first()`), so no program that runs
//! before it can redirect or pass a packet around policy. An allowed packet
//! returns TCX_NEXT (not TCX_PASS), so the programs attached after ours
//! (a CNI's own, observability) still see it; a denied one is dropped there.
//! A program attached later with `first()` itself would run before ours:
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
//! Every write of the endpoint table goes through `endpoint_cache`, which
//! keeps the programs' array copy of it (`pal_ep_cache`, read by the IPv4
//! fast path) from ever being trusted while stale or half written.
//!
//! Pinned maps keep their type and size across upgrades (aya opens a pin
//! as it is), so a map whose shape changes gets a new pin name: `pal_ct4`
//! beside `pal_conntrack`, `pal_verdicts` (with room for later kinds) for
//! `pal_dir_stats` and `pal_stats` (unpinned after adopt), `pal_ep_cache`
//! new beside `pal_endpoints`.

mod audit;
mod conntrack_maps;
mod endpoint_cache;
mod policy_tables;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap, MapData};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use endpoint_cache::EndpointCacheWriter;
use palisade_ebpf::{
    Endpoint, PortKey, PortValue, MAP_CONNTRACK, MAP_CT4, MAP_ENDPOINTS, MAP_PORTS,
    MAP_STATS_RETIRED, PROG_FROM_POD, PROG_TO_POD,
};
use policy_tables::PolicyTables;

use super::{Adopted, Datapath, DatapathError, EndpointEntry, PolicyId, PortSetId, Result};
use crate::compile::{PortEntry, PortSet, Prefix};

pub struct BpfDatapath {
    pin_root: PathBuf,
    ebpf: Ebpf,
    endpoints: HashMap<MapData, u32, Endpoint>,
    /// `pal_endpoints` again for the IPv4 fast path; every write of
    /// `endpoints` goes through it (see endpoint_cache).
    ep_cache: EndpointCacheWriter,
    policies: PolicyTables,
    ports: LpmTrie<MapData, PortKey, PortValue>,
    /// The next epoch to hand out; above every epoch in the endpoint and
    /// conntrack maps (see the module comment).
    next_epoch: u32,
    /// Pinned links per interface: (from_pod at TC ingress, to_pod at TC
    /// egress). Holding the fds is not what keeps them attached; the pins are.
    links: BTreeMap<String, [FdLink; 2]>,
}

/// The two hooks of an interface, with the suffix of their pin files.
const HOOKS: [(&str, TcAttachType, &str); 2] = [
    (PROG_FROM_POD, TcAttachType::Ingress, "from_pod"),
    (PROG_TO_POD, TcAttachType::Egress, "to_pod"),
];

pub(super) fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> DatapathError {
    DatapathError::new(format!("{what}: {e}"))
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
        std::fs::create_dir_all(pin_root)
            .map_err(|e| err(format!("creating pin root {}", pin_root.display()), e))?;
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(pin_root);
        if let Some(n) = conntrack_entries {
            if n == 0 {
                return Err(DatapathError::new(
                    "the conntrack map needs at least one entry",
                ));
            }
            loader.map_max_entries(MAP_CONNTRACK, n);
            loader.map_max_entries(MAP_CT4, n);
        }
        let mut ebpf = loader
            .load(palisade_ebpf::OBJECT)
            .map_err(|e| err("loading the eBPF object", e))?;
        for name in [PROG_FROM_POD, PROG_TO_POD] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or_else(|| DatapathError::new(format!("program {name} missing from object")))?
                .try_into()
                .map_err(|e| err(name, e))?;
            prog.load().map_err(|e| err(format!("loading {name}"), e))?;
        }
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| DatapathError::new(format!("map {name} missing from object")))
        };
        let endpoints = HashMap::try_from(take(&mut ebpf, MAP_ENDPOINTS)?)
            .map_err(|e| err(MAP_ENDPOINTS, e))?;
        let ep_cache = EndpointCacheWriter::take(&mut ebpf)?;
        let policies = PolicyTables::take(&mut ebpf)?;
        let ports =
            LpmTrie::try_from(take(&mut ebpf, MAP_PORTS)?).map_err(|e| err(MAP_PORTS, e))?;
        let next_epoch = first_unused_epoch(&endpoints, &ebpf)?;
        std::fs::create_dir_all(pin_root.join("links"))
            .map_err(|e| err("creating the links pin directory", e))?;
        Ok(BpfDatapath {
            pin_root: pin_root.to_path_buf(),
            ebpf,
            endpoints,
            ep_cache,
            policies,
            ports,
            next_epoch,
            links: BTreeMap::new(),
        })
    }

    /// Unpins older versions' counters ([`MAP_STATS_RETIRED`]), which no
    /// program of this version writes: left pinned, they would only sit
    /// there looking like counters that stopped. Called once the links run
    /// this version's programs; a program of an older version still
    /// holding such a map keeps it alive until it is unloaded.
    fn unpin_retired_stats(&self) -> Result<()> {
        for name in MAP_STATS_RETIRED {
            let path = self.pin_root.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "unpinned an older version's verdict counters");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(err(format!("unpinning {}", path.display()), e)),
            }
        }
        Ok(())
    }

    fn link_pin(&self, ifname: &str, hook: &str) -> PathBuf {
        self.pin_root
            .join("links")
            .join(format!("{}@{hook}", pin_name(ifname)))
    }

    /// Takes over the links a previous process pinned: each gets this
    /// process's program, atomically, so the hook is never empty. A link
    /// whose interface is gone is unpinned.
    fn adopt_links(&mut self) -> Result<std::collections::BTreeSet<String>> {
        let dir = self.pin_root.join("links");
        let mut names: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| err(dir.display(), e))? {
            let entry = entry.map_err(|e| err(dir.display(), e))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some((encoded, _)) = file.rsplit_once('@') {
                names.insert(ifname_of_pin(encoded));
            }
        }
        let mut adopted = std::collections::BTreeSet::new();
        for ifname in names {
            match self.adopt_interface(&ifname) {
                Ok(links) => {
                    self.links.insert(ifname.clone(), links);
                    adopted.insert(ifname);
                }
                Err(e) => {
                    tracing::warn!(%ifname, "dropping a pinned link that cannot be adopted: {e}");
                    for (_, _, hook) in HOOKS {
                        let _ = std::fs::remove_file(self.link_pin(&ifname, hook));
                    }
                }
            }
        }
        Ok(adopted)
    }

    fn adopt_interface(&mut self, ifname: &str) -> Result<[FdLink; 2]> {
        nix::net::if_::if_nametoindex(ifname)
            .map_err(|e| err(format!("interface {ifname:?}"), e))?;
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
            .ok_or_else(|| DatapathError::new(format!("program {program} missing")))?
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
            .ok_or_else(|| DatapathError::new(format!("program {name} missing")))?
            .try_into()
            .map_err(|e| err(name, e))
    }
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
fn first_unused_epoch(endpoints: &HashMap<MapData, u32, Endpoint>, ebpf: &Ebpf) -> Result<u32> {
    let mut highest = conntrack_maps::highest_epoch(ebpf)?;
    for item in endpoints.iter() {
        let (_, e) = item.map_err(|e| err(MAP_ENDPOINTS, e))?;
        highest = highest.max(e.ingress_epoch).max(e.egress_epoch);
    }
    Ok(highest.wrapping_add(1).max(1))
}

/// The map value for an endpoint entry; more addresses than the programs
/// hold is an error (writing some of them would drop the pod's traffic from
/// the rest, writing none would drop everything).
fn endpoint_value(entry: &EndpointEntry) -> Result<Endpoint> {
    const _: () = assert!(super::MAX_POD_ADDRS == palisade_ebpf::MAX_POD_ADDRS);
    Endpoint::new(entry.ingress, entry.egress, &entry.pod_addrs).ok_or_else(|| {
        DatapathError::new(format!(
            "pod has {} addresses, the datapath holds at most {}",
            entry.pod_addrs.len(),
            palisade_ebpf::MAX_POD_ADDRS
        ))
    })
}

/// The epochs of an endpoint's new entry: a direction whose policy id stays
/// keeps its epoch (its flows stay established); one that changes, or is
/// new, gets `fresh`. Also says whether `fresh` was used.
fn epochs_for(old: Option<&Endpoint>, new: &Endpoint, fresh: u32) -> (u32, u32, bool) {
    let keep = |old_id: u32, old_epoch: u32, new_id: u32| (old_id == new_id).then_some(old_epoch);
    let ingress = old.and_then(|o| keep(o.ingress_policy, o.ingress_epoch, new.ingress_policy));
    let egress = old.and_then(|o| keep(o.egress_policy, o.egress_epoch, new.egress_policy));
    let used = ingress.is_none() || egress.is_none();
    (ingress.unwrap_or(fresh), egress.unwrap_or(fresh), used)
}

fn port_keys(id: PortSetId, set: &PortSet) -> Vec<Key<PortKey>> {
    set.0
        .iter()
        .map(|e| match *e {
            PortEntry::Any => PortKey::lpm_any_protocol(id),
            PortEntry::Proto(proto) => PortKey::lpm(id, proto, 0, 0),
            PortEntry::Block { proto, port, bits } => PortKey::lpm(id, proto, port, bits),
        })
        .collect()
}

impl Datapath for BpfDatapath {
    fn adopt(&mut self) -> Result<Adopted> {
        let attached = self.adopt_links()?;
        let mut adopted = Adopted {
            attached,
            ..Adopted::default()
        };
        super::inspect::read_tables(
            &self.endpoints,
            &self.policies.trie,
            &self.ports,
            &mut adopted,
        )?;
        self.policies.adopt(&adopted.policies)?;
        // Loading invalidated the whole cache (it may be older than these
        // entries); each entry as it is now goes back in.
        for item in self.endpoints.iter() {
            let (ifindex, ep) = item.map_err(|e| err(MAP_ENDPOINTS, e))?;
            self.ep_cache.fill(ifindex, &ep);
        }
        // The older programs no longer run on any adopted link.
        let moved = conntrack_maps::move_v4_entries(&mut self.ebpf)?;
        if moved > 0 {
            tracing::info!(moved, "moved IPv4 conntrack entries to {MAP_CT4}");
        }
        self.unpin_retired_stats()?;
        Ok(adopted)
    }

    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        for k in port_keys(id, set) {
            self.ports
                .insert(&k, PortValue::ALLOW, 0)
                .map_err(|e| err(format!("writing {MAP_PORTS}"), e))?;
        }
        Ok(())
    }

    fn remove_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        for k in port_keys(id, set) {
            let _ = self.ports.remove(&k);
        }
        Ok(())
    }

    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.policies.add(id, entries)
    }

    fn remove_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
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

    fn attach(&mut self, ifname: &str, _ifindex: u32) -> Result<()> {
        if self.links.contains_key(ifname) {
            return Ok(());
        }
        let mut made: Vec<FdLink> = Vec::with_capacity(2);
        for (prog_name, attach_type, hook) in HOOKS {
            let path = self.link_pin(ifname, hook);
            let result = (|| {
                let prog = self.program(prog_name)?;
                // Head of the chain: see the module comment.
                let id = prog
                    .attach_with_options(
                        ifname,
                        attach_type,
                        TcAttachOptions::TcxOrder(LinkOrder::first()),
                    )
                    .map_err(|e| err(format!("attaching {prog_name} to {ifname}"), e))?;
                let link = prog.take_link(id).map_err(|e| err(prog_name, e))?;
                let fd = FdLink::try_from(link).map_err(|e| err(prog_name, e))?;
                let pinned = fd
                    .pin(&path)
                    .map_err(|e| err(format!("pinning {}", path.display()), e))?;
                Ok(FdLink::from(pinned))
            })();
            match result {
                Ok(fd) => made.push(fd),
                Err(e) => {
                    // Undo the first hook if the second failed: both or none.
                    for (_, _, hook) in HOOKS {
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

    fn detach(&mut self, ifname: &str, _ifindex: u32) -> Result<()> {
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

    fn set_endpoint(&mut self, ifindex: u32, entry: &EndpointEntry) -> Result<()> {
        // Policies, epochs and addresses in one entry, one update: a packet
        // never sees new policies with old addresses or an old epoch.
        let mut value = endpoint_value(entry)?;
        let old = match self.endpoints.get(&ifindex, 0) {
            Ok(old) => Some(old),
            Err(aya::maps::MapError::KeyNotFound) => None,
            Err(e) => {
                return Err(err(
                    format!("reading {MAP_ENDPOINTS} for ifindex {ifindex}"),
                    e,
                ))
            }
        };
        let fresh = self.next_epoch;
        let (ingress_epoch, egress_epoch, used) = epochs_for(old.as_ref(), &value, fresh);
        value.ingress_epoch = ingress_epoch;
        value.egress_epoch = egress_epoch;
        let endpoints = &mut self.endpoints;
        self.ep_cache.change(ifindex, || {
            endpoints
                .insert(ifindex, value, 0)
                .map_err(|e| err(format!("writing {MAP_ENDPOINTS} for ifindex {ifindex}"), e))
        })?;
        self.ep_cache.fill(ifindex, &value);
        if used {
            self.next_epoch = fresh.wrapping_add(1).max(1);
        }
        Ok(())
    }

    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        let endpoints = &mut self.endpoints;
        self.ep_cache
            .forget(ifindex, || match endpoints.remove(&ifindex) {
                Ok(()) => Ok(()),
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(err(format!("removing endpoint {ifindex}"), e)),
            })
    }

    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        let mut out = Vec::new();
        for ifa in nix::ifaddrs::getifaddrs().map_err(|e| err("listing the node's addresses", e))? {
            let Some(addr) = ifa.address else { continue };
            if let Some(v4) = addr.as_sockaddr_in() {
                out.push(std::net::IpAddr::V4(v4.ip()));
            } else if let Some(v6) = addr.as_sockaddr_in6() {
                // Link-local addresses exist per interface (one more with
                // every pod veth) and never source a connection to a pod;
                // counting them would rewrite every table on each pod add.
                if !v6.ip().is_unicast_link_local() {
                    out.push(std::net::IpAddr::V6(v6.ip()));
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn describe(&self) -> String {
        self.pin_root.display().to_string()
    }

    fn set_audit(&mut self, ifindex: u32, entry: &super::AuditEntry) -> Result<()> {
        audit::set(&mut self.ebpf, ifindex, entry)
    }

    fn remove_audit(&mut self, ifindex: u32) -> Result<()> {
        audit::remove(&mut self.ebpf, ifindex)
    }

    fn audit_entries(&mut self) -> Result<BTreeMap<u32, super::AuditEntry>> {
        audit::entries(&mut self.ebpf)
    }

    // In-place edits of a table in use (reconciler::in_place), built on
    // add_policy and remove_policy so they follow whatever layout those
    // give the policy map: each is one single-key write per entry, in order.
    fn update_policy(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()> {
        self.add_policy(id, upserts)?;
        // remove_policy reads only the prefixes.
        let removals: Vec<(Prefix, PortSetId)> = removals.iter().map(|p| (*p, 0)).collect();
        self.remove_policy(id, &removals)
    }

    fn renew_epochs(&mut self, ifindex: u32, ingress: bool, egress: bool) -> Result<()> {
        let mut value = self
            .endpoints
            .get(&ifindex, 0)
            .map_err(|e| err(format!("reading {MAP_ENDPOINTS} for ifindex {ifindex}"), e))?;
        let fresh = self.next_epoch;
        if ingress {
            value.ingress_epoch = fresh;
        }
        if egress {
            value.egress_epoch = fresh;
        }
        // One update of the whole entry: policies and addresses unchanged.
        let endpoints = &mut self.endpoints;
        self.ep_cache.change(ifindex, || {
            endpoints
                .insert(ifindex, value, 0)
                .map_err(|e| err(format!("writing {MAP_ENDPOINTS} for ifindex {ifindex}"), e))
        })?;
        self.ep_cache.fill(ifindex, &value);
        self.next_epoch = fresh.wrapping_add(1).max(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_value_carries_every_address_or_refuses() {
        let addr = |last: u8| {
            let mut a = [0u8; 16];
            a[10] = 0xff;
            a[11] = 0xff;
            a[15] = last;
            a
        };
        let entry = EndpointEntry {
            ingress: 3,
            egress: 4,
            pod_addrs: vec![addr(1), addr(2)],
        };
        let v = endpoint_value(&entry).unwrap();
        assert_eq!((v.ingress_policy, v.egress_policy), (3, 4));
        assert_eq!(v.pod_addrs(), &[addr(1), addr(2)]);

        let too_many = EndpointEntry {
            pod_addrs: (1..=5).map(addr).collect(),
            ..entry
        };
        let e = endpoint_value(&too_many).unwrap_err().to_string();
        assert!(e.contains("5 addresses") && e.contains("at most 4"), "{e}");
    }

    #[test]
    fn a_direction_gets_a_fresh_epoch_exactly_when_its_policy_changes() {
        let ep = |ingress, egress, ie, ee| Endpoint {
            ingress_epoch: ie,
            egress_epoch: ee,
            ..Endpoint::new(ingress, egress, &[]).unwrap()
        };
        assert_eq!(epochs_for(None, &ep(1, 2, 0, 0), 9), (9, 9, true), "new");
        let old = ep(1, 2, 4, 5);
        assert_eq!(epochs_for(Some(&old), &ep(1, 2, 0, 0), 9), (4, 5, false));
        assert_eq!(epochs_for(Some(&old), &ep(3, 2, 0, 0), 9), (9, 5, true));
        assert_eq!(epochs_for(Some(&old), &ep(1, 0, 0, 0), 9), (4, 9, true));
        assert_eq!(epochs_for(Some(&old), &ep(0, 0, 0, 0), 9), (9, 9, true));
    }

    /// A pin root under bpffs that goes away with the test.
    struct PinRoot(PathBuf);

    impl Drop for PinRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Waits (deadline 10 s) until the cache slot of `ifindex` holds the
    /// endpoint's current entry.
    fn until_cached(dp: &BpfDatapath, ifindex: u32) {
        let ep = dp.endpoints.get(&ifindex, 0).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !dp.ep_cache.holds(ifindex, &ep).unwrap() {
            assert_eq!(dp.ep_cache.error(), None);
            assert!(
                std::time::Instant::now() < deadline,
                "slot never filled: {:?}",
                dp.ep_cache.slot(ifindex).unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(5)); // poll: the filler waits out two grace periods
        }
    }

    /// Right after a change returns, the slot is invalid or already holds
    /// the new entry: never valid with anything else.
    fn not_stale(dp: &BpfDatapath, ifindex: u32) {
        let ep = dp.endpoints.get(&ifindex, 0).unwrap();
        let slot = dp.ep_cache.slot(ifindex).unwrap();
        assert!(
            slot.valid == 0 || slot == palisade_ebpf::EndpointCache::of(ifindex, &ep),
            "{slot:?} for {ep:?}"
        );
    }

    #[test]
    fn the_endpoint_cache_follows_every_endpoint_change_and_survives_a_reload() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let root = PinRoot(PathBuf::from(format!(
            "/sys/fs/bpf/palisade-unit-ep-cache-{}",
            std::process::id()
        )));
        let v4 = |last: u8| {
            std::net::Ipv4Addr::new(10, 0, 0, last)
                .to_ipv6_mapped()
                .octets()
        };
        let v6 = "fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets();
        // Two interfaces that share a slot, and one of its own.
        let (a, b, c) = (7, 7 + palisade_ebpf::EP_CACHE_SLOTS, 9);
        let entry = |ingress, addrs: Vec<[u8; 16]>| EndpointEntry {
            ingress,
            egress: 0,
            pod_addrs: addrs,
        };

        let mut dp = BpfDatapath::load(&root.0).unwrap();
        dp.set_endpoint(a, &entry(1, vec![v6, v4(2)])).unwrap();
        not_stale(&dp, a);
        until_cached(&dp, a);
        let slot = dp.ep_cache.slot(a).unwrap();
        assert_eq!((slot.v4_count, slot.v4[0]), (1, [10, 0, 0, 2]), "IPv4 only");

        // A new policy moves the epoch: the old slot is never trusted again.
        dp.set_endpoint(a, &entry(2, vec![v4(2)])).unwrap();
        not_stale(&dp, a);
        until_cached(&dp, a);
        dp.renew_epochs(a, true, true).unwrap();
        not_stale(&dp, a);
        until_cached(&dp, a);

        // b takes the shared slot; removing a then leaves b's entry alone.
        dp.set_endpoint(c, &entry(0, vec![v4(4)])).unwrap();
        dp.set_endpoint(b, &entry(3, vec![v4(3)])).unwrap();
        not_stale(&dp, b);
        until_cached(&dp, b);
        dp.remove_endpoint(a).unwrap();
        assert!(dp
            .ep_cache
            .holds(b, &dp.endpoints.get(&b, 0).unwrap())
            .unwrap());
        dp.remove_endpoint(b).unwrap();
        assert_eq!(dp.ep_cache.slot(b).unwrap().valid, 0, "removed: at once");
        until_cached(&dp, c);

        // A new process trusts nothing it finds until it adopted it.
        drop(dp);
        let mut dp = BpfDatapath::load(&root.0).unwrap();
        assert_eq!(dp.ep_cache.slot(c).unwrap().valid, 0);
        dp.adopt().unwrap();
        until_cached(&dp, c);
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
