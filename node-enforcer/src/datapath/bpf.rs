//! The real datapath: Palisade's TC programs loaded with aya, their maps
//! pinned under the enforcer's pin root, attached with TCX to pod host veths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap, MapData};
use aya::programs::tc::SchedClassifierLinkId;
use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use palisade_ebpf::{
    Endpoint, PolicyKey, PolicyValue, PortKey, PortValue, MAP_ENDPOINTS, MAP_POLICY, MAP_PORTS,
    POLICY_ID_BITS, PROG_FROM_POD, PROG_TO_POD,
};

use super::{Datapath, DatapathError, PolicyId, PortSetId, Result};
use crate::compile::{PortEntry, PortSet, Prefix};

pub struct BpfDatapath {
    pin_root: PathBuf,
    ebpf: Ebpf,
    endpoints: HashMap<MapData, u32, Endpoint>,
    policy: LpmTrie<MapData, PolicyKey, PolicyValue>,
    ports: LpmTrie<MapData, PortKey, PortValue>,
    links: BTreeMap<String, (SchedClassifierLinkId, SchedClassifierLinkId)>,
}

fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> DatapathError {
    DatapathError::new(format!("{what}: {e}"))
}

impl BpfDatapath {
    /// Loads the programs, pinning their maps under `pin_root` (created if
    /// missing) so that several enforcers on one machine stay apart.
    pub fn load(pin_root: &Path) -> Result<Self> {
        std::fs::create_dir_all(pin_root)
            .map_err(|e| err(format!("creating pin root {}", pin_root.display()), e))?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pin_root)
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
        let policy =
            LpmTrie::try_from(take(&mut ebpf, MAP_POLICY)?).map_err(|e| err(MAP_POLICY, e))?;
        let ports =
            LpmTrie::try_from(take(&mut ebpf, MAP_PORTS)?).map_err(|e| err(MAP_PORTS, e))?;
        let mut dp = BpfDatapath {
            pin_root: pin_root.to_path_buf(),
            ebpf,
            endpoints,
            policy,
            ports,
            links: BTreeMap::new(),
        };
        dp.clear_tables()?;
        Ok(dp)
    }

    /// Pinned maps outlive the process. Programs are not pinned (yet), so
    /// nothing is attached after a restart and entries left by the previous
    /// process would only collide with the ids this one hands out.
    fn clear_tables(&mut self) -> Result<()> {
        let keys: Vec<u32> = self.endpoints.keys().filter_map(|k| k.ok()).collect();
        for k in keys {
            let _ = self.endpoints.remove(&k);
        }
        let keys: Vec<Key<PolicyKey>> = self.policy.keys().filter_map(|k| k.ok()).collect();
        for k in keys {
            let _ = self.policy.remove(&k);
        }
        let keys: Vec<Key<PortKey>> = self.ports.keys().filter_map(|k| k.ok()).collect();
        for k in keys {
            let _ = self.ports.remove(&k);
        }
        Ok(())
    }

    fn program(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        self.ebpf
            .program_mut(name)
            .ok_or_else(|| DatapathError::new(format!("program {name} missing")))?
            .try_into()
            .map_err(|e| err(name, e))
    }
}

fn policy_key(id: PolicyId, p: &Prefix) -> Key<PolicyKey> {
    Key::new(
        POLICY_ID_BITS + u32::from(p.len),
        PolicyKey {
            policy_id: id,
            addr: p.addr,
        },
    )
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
        for (prefix, ps) in entries {
            self.policy
                .insert(&policy_key(id, prefix), PolicyValue { portset_id: *ps }, 0)
                .map_err(|e| err(format!("writing {MAP_POLICY}"), e))?;
        }
        Ok(())
    }

    fn remove_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        for (prefix, _) in entries {
            // Missing entries are fine: removal follows a partial insert too.
            let _ = self.policy.remove(&policy_key(id, prefix));
        }
        Ok(())
    }

    fn ifindex(&mut self, ifname: &str) -> Result<u32> {
        nix::net::if_::if_nametoindex(ifname)
            .map_err(|e| err(format!("interface {ifname:?} does not exist"), e))
    }

    fn attach(&mut self, ifname: &str, _ifindex: u32) -> Result<()> {
        if self.links.contains_key(ifname) {
            return Ok(());
        }
        let from = self
            .program(PROG_FROM_POD)?
            .attach(ifname, TcAttachType::Ingress)
            .map_err(|e| err(format!("attaching {PROG_FROM_POD} to {ifname} ingress"), e))?;
        let to = match self
            .program(PROG_TO_POD)?
            .attach(ifname, TcAttachType::Egress)
        {
            Ok(id) => id,
            Err(e) => {
                let _ = self.program(PROG_FROM_POD)?.detach(from);
                return Err(err(
                    format!("attaching {PROG_TO_POD} to {ifname} egress"),
                    e,
                ));
            }
        };
        self.links.insert(ifname.to_string(), (from, to));
        Ok(())
    }

    fn detach(&mut self, ifname: &str, _ifindex: u32) -> Result<()> {
        let Some((from, to)) = self.links.remove(ifname) else {
            return Ok(());
        };
        // When the veth is already gone the kernel has dropped the links;
        // detaching then fails harmlessly.
        let a = self.program(PROG_FROM_POD)?.detach(from);
        let b = self.program(PROG_TO_POD)?.detach(to);
        if nix::net::if_::if_nametoindex(ifname).is_err() {
            return Ok(());
        }
        a.and(b)
            .map_err(|e| err(format!("detaching from {ifname}"), e))
    }

    fn set_endpoint(&mut self, ifindex: u32, ingress: PolicyId, egress: PolicyId) -> Result<()> {
        self.endpoints
            .insert(
                ifindex,
                Endpoint {
                    ingress_policy: ingress,
                    egress_policy: egress,
                },
                0,
            )
            .map_err(|e| err(format!("writing {MAP_ENDPOINTS}"), e))
    }

    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        match self.endpoints.remove(&ifindex) {
            Ok(()) => Ok(()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(err(format!("removing endpoint {ifindex}"), e)),
        }
    }

    fn describe(&self) -> String {
        self.pin_root.display().to_string()
    }
}
