//! An in-memory datapath that checks, after every operation, the invariant a
//! packet could observe: every endpoint refers only to complete tables.

use std::collections::{BTreeMap, BTreeSet};

use super::{Adopted, Datapath, DatapathError, EndpointEntry, PolicyId, PortSetId, Result};
use crate::compile::{PortSet, Prefix};

#[derive(Debug, Default)]
pub struct FakeDatapath {
    pub interfaces: BTreeMap<String, u32>,
    pub attached: BTreeSet<String>,
    pub endpoints: BTreeMap<u32, EndpointEntry>,
    pub policies: BTreeMap<PolicyId, Vec<(Prefix, PortSetId)>>,
    pub portsets: BTreeMap<PortSetId, PortSet>,
    pub log: Vec<String>,
    /// Interfaces whose attach fails, to test error paths.
    pub fail_attach: BTreeSet<String>,
    /// Operations that fail, by the start of their log line
    /// (`"add_policy"`, `"set_endpoint 10"`, `"detach veth-a"`, ...).
    pub fail: BTreeSet<String>,
    pub node_addresses: Vec<std::net::IpAddr>,
    /// Set when an operation left a window a packet could see.
    pub violations: Vec<String>,
}

impl FakeDatapath {
    pub fn with_interfaces(names: &[&str]) -> Self {
        let mut f = FakeDatapath::default();
        for (i, n) in names.iter().enumerate() {
            f.interfaces.insert(n.to_string(), 10 + i as u32);
        }
        f
    }

    /// Fails `op` if a test asked for it, before it changes anything.
    fn injected(&self, op: &str) -> Result<()> {
        match self.fail.iter().find(|f| op.starts_with(f.as_str())) {
            Some(f) => Err(DatapathError::new(format!("{op}: injected failure ({f})"))),
            None => Ok(()),
        }
    }

    fn check(&mut self, op: &str) {
        self.log.push(op.to_string());
        for (ifindex, e) in &self.endpoints {
            for id in [&e.ingress, &e.egress] {
                // 0: not isolated; u32::MAX: the reconciler's deny-all, which
                // no table ever has, on purpose.
                if *id == 0 || *id == u32::MAX {
                    continue;
                }
                match self.policies.get(id) {
                    None => self.violations.push(format!(
                        "after {op}: endpoint {ifindex} refers to missing policy {id}"
                    )),
                    Some(entries) => {
                        for (_, ps) in entries {
                            if *ps != 0 && !self.portsets.contains_key(ps) {
                                self.violations.push(format!(
                                    "after {op}: policy {id} refers to missing portset {ps}"
                                ));
                            }
                        }
                    }
                }
            }
        }
        for name in &self.attached {
            let idx = self.interfaces.get(name).copied().unwrap_or(0);
            if !self.endpoints.contains_key(&idx) {
                self.violations.push(format!(
                    "after {op}: {name} is attached without an endpoint entry (fails open)"
                ));
            }
        }
    }

    /// Panics naming every moment a packet could have seen a half-made
    /// datapath.
    pub fn assert_no_violations(&self) {
        assert!(self.violations.is_empty(), "{:?}", self.violations);
    }

    /// Nothing attached and no table left.
    pub fn assert_empty(&self) {
        assert!(self.attached.is_empty(), "attached: {:?}", self.attached);
        assert!(self.endpoints.is_empty(), "endpoints: {:?}", self.endpoints);
        assert!(self.policies.is_empty(), "policies: {:?}", self.policies);
        assert!(self.portsets.is_empty(), "portsets: {:?}", self.portsets);
    }

    /// The endpoint entry of an interface, by name.
    pub fn endpoint_of(&self, ifname: &str) -> Option<(PolicyId, PolicyId)> {
        let idx = self.interfaces.get(ifname)?;
        self.endpoints.get(idx).map(|e| (e.ingress, e.egress))
    }
}

impl Datapath for FakeDatapath {
    fn adopt(&mut self) -> Result<Adopted> {
        Ok(Adopted {
            endpoints: self.endpoints.clone(),
            policies: self.policies.clone(),
            portsets: self.portsets.clone(),
            attached: self.attached.clone(),
        })
    }
    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.injected(&format!("add_portset {id}"))?;
        self.portsets.insert(id, set.clone());
        self.check(&format!("add_portset {id}"));
        Ok(())
    }
    fn remove_portset(&mut self, id: PortSetId, _: &PortSet) -> Result<()> {
        self.injected(&format!("remove_portset {id}"))?;
        self.portsets.remove(&id);
        self.check(&format!("remove_portset {id}"));
        Ok(())
    }
    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.injected(&format!("add_policy {id}"))?;
        self.policies.insert(id, entries.to_vec());
        self.check(&format!("add_policy {id}"));
        Ok(())
    }
    fn remove_policy(&mut self, id: PolicyId, _: &[(Prefix, PortSetId)]) -> Result<()> {
        self.injected(&format!("remove_policy {id}"))?;
        self.policies.remove(&id);
        self.check(&format!("remove_policy {id}"));
        Ok(())
    }
    fn ifindex(&mut self, ifname: &str) -> Result<u32> {
        self.interfaces
            .get(ifname)
            .copied()
            .ok_or_else(|| DatapathError::new(format!("interface {ifname:?} does not exist")))
    }
    fn interfaces(&mut self) -> Result<BTreeMap<String, u32>> {
        Ok(self.interfaces.clone())
    }
    fn attach(&mut self, ifname: &str, _: u32) -> Result<()> {
        if self.fail_attach.contains(ifname) {
            return Err(DatapathError::new(format!(
                "attach to {ifname}: injected failure"
            )));
        }
        self.injected(&format!("attach {ifname}"))?;
        self.attached.insert(ifname.to_string());
        self.check(&format!("attach {ifname}"));
        Ok(())
    }
    fn detach(&mut self, ifname: &str, _: u32) -> Result<()> {
        self.injected(&format!("detach {ifname}"))?;
        self.attached.remove(ifname);
        self.check(&format!("detach {ifname}"));
        Ok(())
    }
    fn set_endpoint(&mut self, ifindex: u32, entry: &EndpointEntry) -> Result<()> {
        self.injected(&format!("set_endpoint {ifindex}"))?;
        self.endpoints.insert(ifindex, entry.clone());
        self.check(&format!(
            "set_endpoint {ifindex} {} {}",
            entry.ingress, entry.egress
        ));
        Ok(())
    }
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        self.injected(&format!("remove_endpoint {ifindex}"))?;
        self.endpoints.remove(&ifindex);
        self.check(&format!("remove_endpoint {ifindex}"));
        Ok(())
    }
    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        Ok(self.node_addresses.clone())
    }
    fn describe(&self) -> String {
        "fake".into()
    }
}
