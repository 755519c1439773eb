//! Pods: their namespaces, their CNI attachments, their listeners and their
//! manifests, created and removed together.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::{Lab, LabNode};
use crate::cni::{Attachment, Sandbox};
use crate::listener::{self, Listeners};
use crate::netns::NetNs;
use crate::runtime::PodRuntime;
use crate::scenario::{Kind, Object, ObjectKey, PodName, ServedPort};

pub(super) struct LabPod {
    pub(super) netns: NetNs,
    pub(super) sandbox: Sandbox,
    pub(super) attachment: Option<Attachment>,
    pub(super) ports: Vec<ServedPort>,
    pub(super) listeners: Listeners,
    /// Set when containerd made the sandbox (`sandbox.container_id` is its
    /// id, `netns` its namespace): the lab removes it over CRI.
    pub(super) cri: Option<super::cri_pods::CriPod>,
    /// Set for a host-network pod (`spec.hostNetwork: true`): its node's
    /// addresses. Such a pod has no attachment and no namespace of its own:
    /// `netns` is its node's, which its teardown leaves alone.
    pub(super) host_ips: Option<Vec<IpAddr>>,
}

impl LabPod {
    /// The pod's addresses: its attachment's, or its node's for a
    /// host-network pod (empty while it has neither).
    pub(super) fn ips(&self) -> &[IpAddr] {
        match (&self.attachment, &self.host_ips) {
            (Some(a), _) => &a.ips,
            (None, Some(ips)) => ips,
            (None, None) => &[],
        }
    }
}

/// Whether the pod runs in its node's network namespace.
pub(super) fn is_host_network(object: &Object) -> bool {
    object.body()["spec"]["hostNetwork"] == Value::Bool(true)
}

impl Lab {
    /// Creates or updates objects, wires new pods through the CNI chain,
    /// starts their listeners, and publishes. Returns the new revision;
    /// [`Lab::wait_realized`] waits for it.
    pub fn apply(&mut self, objects: &[Object]) -> Result<u64> {
        self.apply_wired(objects, true)
    }

    /// [`Lab::apply`] that publishes new pods as scheduled (Pending, no
    /// network) and stops there: the controller plans them, and
    /// [`Lab::wire`] makes their network (the CNI ADD) later, so a test can
    /// time an ADD whose plan the node already has.
    pub fn apply_unwired(&mut self, objects: &[Object]) -> Result<u64> {
        self.apply_wired(objects, false)
    }

    /// The CNI ADD (and listeners) of pods [`Lab::apply_unwired`] published.
    pub fn wire(&mut self, pods: &[PodName]) -> Result<u64> {
        for pod in pods {
            if self.pods.contains_key(pod) {
                bail!("pod {pod} is wired already");
            }
            let object = self
                .objects
                .get(&ObjectKey::pod(pod))
                .cloned()
                .ok_or_else(|| anyhow!("pod {pod} was not applied"))?;
            self.add_pod(pod, &object)?;
        }
        self.sync_services()?;
        self.manifests.publish()
    }

    fn apply_wired(&mut self, objects: &[Object], wire: bool) -> Result<u64> {
        self.config.cancel.check()?;
        // As the API server does on create: Services get their ClusterIP.
        let objects = &self.assign_cluster_ips(objects)?;
        for o in objects {
            if let Some(ns) = &o.key().namespace {
                let declared = |k: &ObjectKey| k.kind == Kind::Namespace && &k.name == ns;
                if !self.objects.keys().any(declared) && !objects.iter().any(|o| declared(o.key()))
                {
                    bail!(
                        "apply {}: namespace {ns} does not exist in the lab",
                        o.key()
                    );
                }
            }
        }
        self.check_services(objects)?;
        let placed = self.place(objects)?;
        // Namespaces first, like kubectl: the controller may read at any time.
        let mut ordered: Vec<&Object> = objects.iter().collect();
        ordered.sort_by_key(|o| o.key().kind != Kind::Namespace);
        let mut new_pods = Vec::new();
        for o in ordered {
            let key = o.key().clone();
            if let Some(pod) = key.pod_name() {
                let ips = self
                    .pods
                    .get(&pod)
                    .map(|p| p.ips().to_vec())
                    .filter(|ips| !ips.is_empty());
                let node = placed[&pod];
                self.placement.insert(pod.clone(), node);
                if ips.is_none() {
                    new_pods.push(pod);
                }
                // A new pod is first written Pending, as the scheduler would,
                // so its policy can be known before its network exists.
                self.manifests
                    .write(&key, &pod_manifest(o, &self.nodes[node], ips.as_deref()))?;
            } else {
                self.manifests.write(&key, o.body())?;
            }
            self.objects.insert(key, o.clone());
        }
        self.sync_services()?;
        self.manifests.publish()?;

        for o in objects {
            let Some(pod) = o.key().pod_name() else {
                continue;
            };
            let ports_changed = self.pods.get(&pod).is_some_and(|p| p.ports != o.ports());
            if ports_changed {
                self.restart_listeners(&pod, o.ports())?;
            }
        }
        if !wire {
            return self.manifests.publish();
        }
        for (i, pod) in new_pods.iter().enumerate() {
            let result = self
                .config
                .cancel
                .check()
                .map_err(anyhow::Error::from)
                .and_then(|()| {
                    let object = self.objects[&ObjectKey::pod(pod)].clone();
                    self.add_pod(pod, &object)
                });
            if let Err(e) = result {
                // Leave no half-made pod: the failed one and those not wired
                // yet are withdrawn, as if never applied.
                for p in &new_pods[i..] {
                    if let Some(made) = self.pods.remove(p) {
                        let _ = self.teardown_pod(made);
                    }
                    let key = ObjectKey::pod(p);
                    self.objects.remove(&key);
                    self.placement.remove(p);
                    let _ = self.manifests.remove(&key);
                }
                let _ = self.sync_services();
                let _ = self.manifests.publish();
                return Err(e);
            }
        }
        // Backends exist once their pods are wired.
        self.sync_services()?;
        self.manifests.publish()
    }

    /// The node of each pod among `objects`: where it already runs, the
    /// node its `spec.nodeName` names, or the next node round-robin. Checks
    /// everything before anything is placed.
    fn place(&mut self, objects: &[Object]) -> Result<BTreeMap<PodName, usize>> {
        let mut placed = BTreeMap::new();
        let mut next = self.next_node;
        for o in objects {
            let Some(pod) = o.key().pod_name() else {
                continue;
            };
            let asked = match o.body()["spec"]["nodeName"].as_str() {
                Some(name) => Some(
                    self.node_index(name)
                        .with_context(|| format!("pod {pod}: spec.nodeName"))?,
                ),
                None => None,
            };
            let node = match (self.placement.get(&pod), asked) {
                (Some(&now), Some(asked)) if now != asked => bail!(
                    "pod {pod}: spec.nodeName cannot change (it runs on {}, the update says {})",
                    self.nodes[now].name,
                    self.nodes[asked].name
                ),
                (Some(&now), _) => now,
                (None, Some(asked)) => asked,
                (None, None) => {
                    let n = next % self.nodes.len();
                    next += 1;
                    n
                }
            };
            placed.insert(pod, node);
        }
        self.next_node = next;
        Ok(placed)
    }

    fn add_pod(&mut self, pod: &PodName, object: &Object) -> Result<()> {
        let node = self
            .pod_node(pod)
            .ok_or_else(|| anyhow!("pod {pod} was not placed on a node"))?;
        if is_host_network(object) {
            return self.add_host_pod(pod, object, node);
        }
        if let Some(why) = &self.nodes[node].unenforced {
            bail!("pod {pod}: {why}");
        }
        if self.config.runtime == PodRuntime::Containerd {
            return self.add_pod_cri(pod, object, node);
        }
        let index = self.next_pod;
        self.next_pod += 1;
        let ns_name = format!("pl{}-p{index}", self.id);
        self.made_netns.push(ns_name.clone());
        let netns = NetNs::create(&ns_name).with_context(|| format!("pod {pod}"))?;
        let sandbox = Sandbox {
            pod: pod.clone(),
            container_id: format!("pl{}p{index}", self.id),
            netns: netns.path().to_path_buf(),
        };
        let n = &self.nodes[node];
        let attachment = match n.cni.add(n.ns(), &sandbox, &self.config.cancel) {
            Ok(a) => a,
            Err(e) => {
                let _ = netns.delete();
                return Err(e);
            }
        };
        self.made_interfaces
            .extend(attachment.host_interfaces.iter().cloned());
        let manifest = pod_manifest(object, &self.nodes[node], Some(&attachment.ips));
        self.pods.insert(
            pod.clone(),
            LabPod {
                netns,
                sandbox,
                attachment: Some(attachment),
                ports: Vec::new(),
                listeners: Listeners::default(),
                cri: None,
                host_ips: None,
            },
        );
        self.manifests.write(object.key(), &manifest)?;
        self.restart_listeners(pod, object.ports())
    }

    /// A host-network pod, as the kubelet starts one: no sandbox namespace
    /// and no CNI ADD; its listeners in its node's namespace, its address
    /// the node's. Whatever the pod runtime: the lab runs it itself, as
    /// nothing of containerd's would take part (no CNI, no namespace).
    fn add_host_pod(&mut self, pod: &PodName, object: &Object, node: usize) -> Result<()> {
        let index = self.next_pod;
        self.next_pod += 1;
        let n = &self.nodes[node];
        let netns = NetNs::from_existing(n.ns().name());
        let sandbox = Sandbox {
            pod: pod.clone(),
            container_id: format!("pl{}h{index}", self.id),
            netns: netns.path().to_path_buf(),
        };
        let ips = n.addresses.clone();
        let manifest = pod_manifest(object, n, Some(&ips));
        self.pods.insert(
            pod.clone(),
            LabPod {
                netns,
                sandbox,
                attachment: None,
                ports: Vec::new(),
                listeners: Listeners::default(),
                cri: None,
                host_ips: Some(ips),
            },
        );
        if let Err(e) = self.restart_listeners(pod, object.ports()) {
            // Another host-network pod of the node may hold the port.
            self.pods.remove(pod);
            return Err(e.context(format!(
                "pod {pod} is host-network: its ports are its node's ({})",
                self.nodes[node].name
            )));
        }
        self.manifests.write(object.key(), &manifest)
    }

    pub(super) fn restart_listeners(&mut self, pod: &PodName, ports: &[ServedPort]) -> Result<()> {
        let handle = self.rt().handle().clone();
        let dns = self.dns_zone_of(pod);
        let p = self
            .pods
            .get_mut(pod)
            .ok_or_else(|| anyhow!("pod {pod} is not in the lab"))?;
        // The old sockets must close before the same ports can be bound again.
        p.listeners = Listeners::default();
        p.ports = Vec::new();
        // A host-network pod serves on its node's address (see
        // listener::start); a pod's namespace has one address.
        let ip = p
            .host_ips
            .iter()
            .flatten()
            .find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
        let listeners = retry_bind(|| listener::start(&handle, &p.netns, ip, ports, dns.clone()))
            .with_context(|| format!("starting the listeners of pod {pod}"))?;
        p.listeners = listeners;
        p.ports = ports.to_vec();
        Ok(())
    }

    /// Deletes objects. A deleted pod gets CNI DEL and loses its namespace;
    /// a deleted namespace takes its pods and policies with it. Returns the
    /// new revision.
    pub fn delete(&mut self, keys: &[ObjectKey]) -> Result<u64> {
        self.config.cancel.check()?;
        for key in keys {
            if !self.objects.contains_key(key) {
                bail!("delete {key}: it is not in the lab");
            }
        }
        let mut errors = Vec::new();
        for key in keys {
            let doomed: Vec<ObjectKey> = if key.kind == Kind::Namespace {
                self.objects
                    .keys()
                    .filter(|k| k.namespace.as_deref() == Some(&key.name))
                    .cloned()
                    .chain([key.clone()])
                    .collect()
            } else {
                vec![key.clone()]
            };
            for k in doomed {
                if let Some(pod) = k.pod_name().and_then(|p| self.pods.remove(&p)) {
                    if let Err(e) = self.teardown_pod(pod) {
                        errors.push(format!("{e:#}"));
                    }
                }
                self.manifests.remove(&k)?;
                self.objects.remove(&k);
                if let Some(pod) = k.pod_name() {
                    self.placement.remove(&pod);
                }
            }
        }
        if let Err(e) = self.sync_services() {
            errors.push(format!("{e:#}"));
        }
        let revision = self.manifests.publish()?;
        if !errors.is_empty() {
            bail!("delete: {}", errors.join("; "));
        }
        Ok(revision)
    }

    pub(super) fn teardown_pod(&self, pod: LabPod) -> Result<()> {
        if pod.cri.is_some() {
            return self.teardown_pod_cri(pod);
        }
        if pod.host_ips.is_some() {
            // Its listeners close; its namespace is the node's, and stays.
            drop(pod.listeners);
            return Ok(());
        }
        let mut errors = Vec::new();
        let node = self
            .pod_node(&pod.sandbox.pod)
            .and_then(|i| self.nodes.get(i));
        if let (Some(a), Some(node)) = (&pod.attachment, node) {
            if let Some(ns) = &node.ns {
                if let Err(e) = node.cni.del(ns, &pod.sandbox, Some(&a.result)) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        // Open sockets would keep the namespace alive after it is unmounted.
        drop(pod.listeners);
        if let Err(e) = pod.netns.delete() {
            errors.push(format!("{e:#}"));
        }
        if !errors.is_empty() {
            bail!("removing pod {}: {}", pod.sandbox.pod, errors.join("; "));
        }
        Ok(())
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodName> {
        self.pods.keys()
    }

    /// The pod's (first) address; a host-network pod's is its node's.
    pub fn pod_ip(&self, pod: &PodName) -> Option<IpAddr> {
        self.pods.get(pod).and_then(|p| p.ips().first().copied())
    }

    /// The pod's IPv6 address, in a dual-stack lab
    /// ([`super::LabConfig::pod_subnet6`]).
    pub fn pod_ip6(&self, pod: &PodName) -> Option<std::net::Ipv6Addr> {
        self.pods.get(pod).and_then(|p| {
            p.ips().iter().find_map(|ip| match ip {
                IpAddr::V6(v6) => Some(*v6),
                IpAddr::V4(_) => None,
            })
        })
    }

    /// Every pod with an address, by name.
    pub fn pod_ips(&self) -> BTreeMap<PodName, IpAddr> {
        self.pods
            .keys()
            .filter_map(|p| self.pod_ip(p).map(|ip| (p.clone(), ip)))
            .collect()
    }

    /// Every object as the lab holds it now.
    pub fn objects(&self) -> impl Iterator<Item = &Object> {
        self.objects.values()
    }

    /// The object as the lab holds it now.
    pub fn object(&self, key: &ObjectKey) -> Option<&Object> {
        self.objects.get(key)
    }

    pub fn pod_netns(&self, pod: &PodName) -> Option<&str> {
        self.pods.get(pod).map(|p| p.netns.name())
    }

    pub fn host_interfaces(&self, pod: &PodName) -> Vec<String> {
        self.pods
            .get(pod)
            .and_then(|p| p.attachment.as_ref())
            .map(|a| a.host_interfaces.clone())
            .unwrap_or_default()
    }
}

/// The pod as the API server would show it once scheduled to the node
/// (`ips` = None) or running with its addresses, and its node's
/// (`hostIP`, `hostIPs`).
pub(super) fn pod_manifest(object: &Object, node: &LabNode, ips: Option<&[IpAddr]>) -> Value {
    let mut body = object.body().clone();
    body["spec"]["nodeName"] = node.name.as_str().into();
    let list = |ips: &[IpAddr]| {
        ips.iter()
            .map(|ip| json!({"ip": ip.to_string()}))
            .collect::<Vec<_>>()
    };
    body["status"] = match ips {
        Some(ips) => json!({
            "phase": "Running",
            "podIP": ips.first().map(ToString::to_string),
            "podIPs": list(ips),
            "hostIP": node.addresses.first().map(ToString::to_string),
            "hostIPs": list(&node.addresses),
        }),
        None => json!({"phase": "Pending"}),
    };
    body
}

/// Aborted listener tasks close their sockets asynchronously, so a rebind of
/// the same port may briefly see EADDRINUSE.
fn retry_bind<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline && is_addr_in_use(&e) => {
                std::thread::sleep(Duration::from_millis(20)); // poll: inside a loop bounded by a deadline
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_addr_in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    })
}
