//! `--node-processes image`: the node processes run from Palisade's image, as the
//! chart's pods, the way a kubelet would run them (see [`crate::kubelet`]).
//!
//! For each lab the chart is rendered with the real Helm library, once per
//! node, with values that point its host paths into that node's own
//! directory under the run dir (the lab's nodes share one machine, so each
//! needs its own bpffs, run dir, state dir, CNI dirs and kubelet seccomp
//! dir; `helm/palisade/ci/custom-paths-values.yaml` is the same kind of
//! change). Everything else is the chart's: the DaemonSet's pod (its init
//! containers install palisade-cni into the node's CNI bin dir and chain it
//! into the node's conflist, which the lab then uses, and install the
//! seccomp profile), and the Deployment's pod in the fabric namespace (the
//! controller's pod network), found by the enforcers through its Service
//! name: the lab serves cluster DNS (the Service's name under the cluster
//! domain, answered with the controller's address) on UDP port 53 of the
//! fabric namespace, and the pods' C library resolves it there with real
//! queries, under the pods' seccomp profiles.
//!
//! What the lab adds, because it stands in for the API server: the
//! controller reads the lab's manifests (`PALISADE_MANIFESTS`, a read-only
//! mount) instead of watching the API, so leader election (a Lease in the
//! API) is off and there is one replica. Flow logs and traces are not
//! available in this mode yet.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::forward::Forwarder;
use super::node::{self, LabNode};
use super::{Lab, LabConfig};
use crate::chart;
use crate::cni::{CNI_VERSION, NETWORK_NAME};
use crate::dns;
use crate::kubelet::{
    self, Node, Overlay, Pod, PodRun, ProbeKind, Rlimits, Seccomp, CLUSTER_DOMAIN,
};
use crate::listener::{self, Listeners};
use crate::process::Daemon;
use crate::scenario::{Protocol, ServedPort};

/// The release's namespace, and the names the chart gives its objects.
pub const NAMESPACE: &str = "palisade-system";
const CONTROLLER_CONTAINER: &str = "controller";
pub(super) const ENFORCER_CONTAINER: &str = "enforcer";
/// The lab's own conflist in each node's CNI conf dir, unless the values
/// name one (`cni.confFile`, which the install init container then reads).
const CONFLIST: &str = "10-palisade-lab.conflist";

/// The conflist the lab writes into each node's CNI conf dir for chart
/// `values` (a values document).
pub fn conflist_name(values: &Value) -> &str {
    match values["cni"]["confFile"].as_str() {
        Some(name) if !name.is_empty() => name,
        _ => CONFLIST,
    }
}
/// podman labels every container of a lab with its id.
pub const LAB_LABEL: &str = "io.palisade.lab";

/// Serves a Kubernetes API (the stand-in of policy-controller's tests) on a
/// listener the lab bound at 127.0.0.1 in the controller pod's network
/// namespace, before the controller starts; it must return at once (serve
/// on a thread of its own).
#[derive(Clone)]
pub struct ApiServer(pub std::sync::Arc<dyn Fn(std::net::TcpListener) -> Result<()> + Send + Sync>);

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiServer")
    }
}

/// What `--node-processes image` needs: the image and the chart to run it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRun {
    /// `repository:tag` of a local image.
    pub image: String,
    pub chart: PathBuf,
}

/// A node's host paths, all under its root.
pub(super) struct NodeRoot {
    pub(super) root: PathBuf,
}

impl NodeRoot {
    pub(super) fn bpffs(&self) -> PathBuf {
        self.root.join("bpf")
    }
    pub(super) fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }
    pub(super) fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }
    pub(super) fn cni_bin(&self) -> PathBuf {
        self.root.join("cni/bin")
    }
    pub(super) fn cni_conf(&self) -> PathBuf {
        self.root.join("cni/net.d")
    }
    pub(super) fn kubelet(&self) -> PathBuf {
        self.root.join("kubelet")
    }
    pub(super) fn tls(&self) -> PathBuf {
        self.root.join("tls")
    }
    pub(super) fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }
}

/// What the lab keeps per lab in image mode.
pub(super) struct ImageState {
    pub(super) run: ImageRun,
    /// The rendered chart of each node.
    pub(super) rendered: Vec<Vec<Value>>,
    pub(super) controller_pod: Option<Pod>,
    pub(super) forwarder: Option<Forwarder>,
    /// The kubeconfig of the caller's API ([`LabConfig::api`]).
    pub(super) kubeconfig: Option<PathBuf>,
    /// The cluster DNS server the pods resolve the Service names with.
    pub(super) cluster_dns: Option<Listeners>,
}

/// The values the lab renders node `node`'s chart with.
pub(super) fn values(config: &LabConfig, run: &ImageRun, root: &NodeRoot) -> Result<Value> {
    if config.flow_log.is_some() || config.otlp_listener {
        bail!("flow logs and traces are not available with --node-processes image");
    }
    let (repository, tag) = chart::split_image(&run.image)?;
    let path = |p: PathBuf| p.display().to_string();
    let mut v = config.chart_values.clone();
    if v.is_null() {
        v = json!({});
    }
    merge(
        &mut v,
        json!({
            "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
            "enforcer": {
                "bpfRoot": path(root.bpffs()),
                "runDir": path(root.run_dir()),
                "stateDir": path(root.state_dir()),
                "kubeletRootDir": path(root.kubelet()),
            },
            "cni": {"binDir": path(root.cni_bin()), "confDir": path(root.cni_conf())},
        }),
    );
    if v["tls"]["enabled"] == true {
        v["tls"]["nodeCertDir"] = path(root.tls()).into();
    }
    if config.api.is_none() {
        // The lab is the API: one replica reading its manifests, no Lease.
        merge(
            &mut v,
            json!({"controller": {"replicas": 1, "leaderElection": {"enabled": false}}}),
        );
    }
    if let Some(mode) = config.mode {
        v["mode"] = mode.as_str().into();
    }
    if let Some(d) = config.pod_up_deadline {
        v["podUpDeadlineMs"] = (d.as_millis() as u64).into();
    }
    if let Some(secs) = config.conntrack_cleanup_secs {
        v["conntrack"] = json!({"cleanupSeconds": secs});
    }
    Ok(v)
}

/// `over` written into `base`, object by object.
pub(super) fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o,
    }
}

/// What podman runs its conmon and runc with at most: it lowers its own
/// RLIMIT_NPROC to this (its default ulimit) before starting them.
const PODMAN_NPROC: u64 = 32768;

/// The runtime's rlimits, which its containers inherit: this process's
/// hard limits, as podman keeps them (RLIMIT_NPROC lowered as podman does).
fn rlimits() -> Result<Rlimits> {
    let hard = |resource| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(resource, &mut limit) } != 0 {
            return Err(std::io::Error::last_os_error()).context("getrlimit");
        }
        Ok(limit.rlim_max)
    };
    Ok(Rlimits {
        nofile: hard(libc::RLIMIT_NOFILE)?,
        nproc: hard(libc::RLIMIT_NPROC)?.min(PODMAN_NPROC),
    })
}

impl Lab {
    pub(super) fn image(&self) -> Option<&ImageState> {
        self.image.as_ref()
    }

    /// Node `i`'s host directories: its own bpffs (a fresh instance, shared
    /// propagation as on a systemd node) and the conflist of its interface
    /// plugin, which the init container will chain palisade-cni into.
    pub(super) fn make_node_root(&mut self, i: usize) -> Result<()> {
        let root = self.nodes[i]
            .root
            .as_ref()
            .expect("image mode nodes have a root");
        let (bpffs, conf_dir) = (root.bpffs(), root.cni_conf());
        for dir in [root.bpffs(), root.cni_conf(), root.pods()] {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        nix::mount::mount(
            Some("bpf"),
            &bpffs,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .with_context(|| format!("mount -t bpf bpf {}", bpffs.display()))?;
        self.nodes[i].bpffs_mounted = true;
        nix::mount::mount(
            None::<&str>,
            &bpffs,
            None::<&str>,
            nix::mount::MsFlags::MS_SHARED,
            None::<&str>,
        )
        .with_context(|| format!("mount --make-shared {}", bpffs.display()))?;
        let conflist = json!({
            "cniVersion": CNI_VERSION,
            "name": NETWORK_NAME,
            "plugins": self.nodes[i].cni.plugins,
        });
        let path = conf_dir.join(conflist_name(&self.config.chart_values));
        std::fs::write(&path, serde_json::to_vec_pretty(&conflist)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Renders every node's chart, in parallel (each render is a Helm
    /// install into a stand-in API server, about a second).
    pub(super) fn render_charts(&mut self) -> Result<()> {
        let state = self.image.as_ref().expect("image mode");
        let run = state.run.clone();
        let values = self
            .nodes
            .iter()
            .map(|n| values(&self.config, &run, n.root.as_ref().expect("a root")))
            .collect::<Result<Vec<_>>>()?;
        let scratch = self.run_dir.clone();
        let rendered = std::thread::scope(|s| {
            let handles: Vec<_> = values
                .iter()
                .map(|v| s.spawn(|| chart::render(&run.chart, v, &scratch)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow!("rendering panicked"))?)
                .collect::<Result<Vec<_>>>()
        })?;
        self.image.as_mut().expect("image mode").rendered = rendered;
        self.serve_cluster_dns()
    }

    /// Serves the controller's Service names as cluster DNS would, on the
    /// address pods are told to ask ([`PodRun::cluster_dns`]).
    fn serve_cluster_dns(&mut self) -> Result<()> {
        let server = node::controller_ip();
        let mut zone = dns::Zone::new();
        for name in controller_service_names(&self.image().expect("image").rendered[0])? {
            zone.insert(
                dns::parse_name(&name)?,
                (
                    dns::DEFAULT_TTL,
                    dns::ZoneAnswer::Addrs(vec![IpAddr::V4(server)]),
                ),
            );
        }
        let port = ServedPort {
            port: dns::DNS_PORT,
            protocol: Protocol::Udp,
        };
        let zone = Arc::new(RwLock::new(zone));
        let listeners = listener::start(
            self.rt().handle(),
            self.fabric(),
            server,
            &[port],
            Some(zone),
        )
        .context("serving the lab's cluster DNS in the fabric namespace")?;
        self.image.as_mut().expect("image mode").cluster_dns = Some(listeners);
        Ok(())
    }

    fn kube_node(&self, i: usize) -> Node {
        let n = &self.nodes[i];
        let root = n.root.as_ref().expect("a root");
        Node {
            name: n.name.clone(),
            labels: Node::standard_labels(&n.name),
            netns: n.ns().path().to_path_buf(),
            seccomp_dir: root.kubelet().join("seccomp"),
        }
    }

    fn pod_run(&self, name: &str, node: Node, pod_netns: Option<PathBuf>) -> Result<PodRun> {
        Ok(PodRun {
            name: name.to_string(),
            namespace: NAMESPACE.to_string(),
            node,
            pod_netns,
            cluster_dns: Some(IpAddr::V4(node::controller_ip())),
            volume_dirs: Default::default(),
            api_kubeconfig: None,
            // The kubelet's default without --seccomp-default.
            seccomp_default: Seccomp::Unconfined,
            rlimits: rlimits()?,
            labels: vec![(LAB_LABEL.to_string(), self.id.clone())],
            overlays: Default::default(),
        })
    }

    /// Starts the controller's pod (the Deployment's template) in the
    /// fabric namespace, and the forwarder from the lab's controller socket.
    pub(super) fn spawn_controller_pod(&mut self) -> Result<Daemon> {
        if self.image().expect("image mode").controller_pod.is_none() {
            let (_, template) =
                kubelet::template_of(&self.image().expect("image").rendered[0], "Deployment")?;
            let mut run = self.pod_run(
                "palisade-controller-lab",
                self.kube_node(0),
                Some(self.fabric().path().to_path_buf()),
            )?;
            match self.image().and_then(|s| s.kubeconfig.clone()) {
                Some(kubeconfig) => run.api_kubeconfig = Some(kubeconfig),
                None => {
                    let manifests = self.manifests.dir().to_path_buf();
                    run.overlays.insert(
                        CONTROLLER_CONTAINER.to_string(),
                        Overlay {
                            env: vec![(
                                "PALISADE_MANIFESTS".into(),
                                manifests.display().to_string(),
                            )],
                            mounts: vec![(manifests.clone(), manifests.display().to_string())],
                        },
                    );
                }
            }
            let state = self.run_dir.join("pods/controller");
            let pod = Pod::new(
                template,
                run,
                &self.image().expect("image").rendered[0],
                &format!("pl{}-controller", self.id),
                &state,
            )?;
            self.image.as_mut().expect("image").controller_pod = Some(pod);
        }
        let port = self.controller_port()?;
        if self.image().expect("image").forwarder.is_none() {
            let addr = SocketAddr::from((node::controller_ip(), port));
            let forwarder = Forwarder::start(
                self.rt(),
                &self.controller_socket,
                self.fabric().path(),
                addr,
            )?;
            self.image.as_mut().expect("image").forwarder = Some(forwarder);
        }
        let log = self.log_dir.join("controller.log");
        let timeout = self.config.start_timeout;
        let pod = self
            .image
            .as_mut()
            .expect("image")
            .controller_pod
            .as_mut()
            .expect("made above");
        pod.start(
            CONTROLLER_CONTAINER,
            crate::preflight::CONTROLLER_BIN,
            &log,
            timeout,
        )
    }

    /// The controller's gRPC port, as the chart sets it.
    fn controller_port(&self) -> Result<u16> {
        let pod = self
            .image()
            .and_then(|s| s.controller_pod.as_ref())
            .expect("made");
        let c = pod
            .template
            .containers
            .iter()
            .find(|c| c.name == CONTROLLER_CONTAINER)
            .ok_or_else(|| anyhow!("the controller pod has no container {CONTROLLER_CONTAINER}"))?;
        c.ports
            .iter()
            .find(|p| p.name.as_deref() == Some("grpc"))
            .map(|p| p.container_port)
            .ok_or_else(|| anyhow!("the controller container declares no grpc port"))
    }

    /// A new enforcer pod of node `i` (the DaemonSet's template): its init
    /// containers run, in order, before it is returned.
    fn new_enforcer_pod(&mut self, i: usize, suffix: &str) -> Result<Pod> {
        let rendered = self.image().expect("image").rendered[i].clone();
        self.new_enforcer_pod_from(i, suffix, &rendered)
    }

    /// [`Lab::new_enforcer_pod`] of the chart as `rendered` (an upgrade's).
    pub(super) fn new_enforcer_pod_from(
        &mut self,
        i: usize,
        suffix: &str,
        rendered: &[Value],
    ) -> Result<Pod> {
        let (_, template) = kubelet::template_of(rendered, "DaemonSet")?;
        let name = format!("palisade-enforcer-{}{suffix}", self.nodes[i].name);
        let run = self.pod_run(&name, self.kube_node(i), None)?;
        let root = self.nodes[i].root.as_ref().expect("a root");
        let state = root.pods().join(&name);
        let mut pod = Pod::new(
            template,
            run,
            rendered,
            &format!("pl{}-{}{suffix}", self.id, self.nodes[i].name),
            &state,
        )?;
        let log = self.nodes[i].enforcer_log.clone();
        pod.run_init_containers(&log, &self.config.cancel)?;
        Ok(pod)
    }

    /// Starts node `i`'s enforcer container: in a new pod the first time
    /// (init containers first, then the lab's CNI chain is the conflist
    /// they left), in the same pod after a crash or a restart, as the
    /// kubelet restarts a container.
    pub(super) fn spawn_enforcer_pod(&mut self, i: usize) -> Result<Daemon> {
        if self.nodes[i].pod.is_none() {
            self.provision_node_certificate(i)?;
            let pod = self.new_enforcer_pod(i, "")?;
            self.nodes[i].pod = Some(pod);
            self.load_chain(i)?;
            let log = self.nodes[i].enforcer_log.clone();
            let sidecars = self.start_sidecars(i, false, &log)?;
            self.nodes[i].sidecars = sidecars;
        }
        let log = self.nodes[i].enforcer_log.clone();
        let timeout = self.config.start_timeout;
        let pod = self.nodes[i].pod.as_mut().expect("made above");
        pod.start(
            ENFORCER_CONTAINER,
            crate::preflight::ENFORCER_BIN,
            &log,
            timeout,
        )
    }

    /// A second pod of the DaemonSet on node 1 (a surge rollout): init
    /// containers, then its enforcer and its other containers.
    pub(super) fn spawn_second_enforcer_pod(&mut self) -> Result<Daemon> {
        let mut pod = self.new_enforcer_pod(0, "-surge")?;
        let log = self.nodes[0].second_log.clone();
        let daemon = pod.start(
            ENFORCER_CONTAINER,
            "second palisade-enforcer",
            &log,
            self.config.start_timeout,
        )?;
        self.nodes[0].second_pod = Some(pod);
        let sidecars = self.start_sidecars(0, true, &log)?;
        self.nodes[0].second_sidecars = sidecars;
        Ok(daemon)
    }

    /// Starts the other containers of node `i`'s pod (`second`: its second
    /// pod's), their logs beside `log`.
    pub(super) fn start_sidecars(
        &mut self,
        i: usize,
        second: bool,
        log: &Path,
    ) -> Result<Vec<(String, Daemon)>> {
        let timeout = self.config.start_timeout;
        let n = &mut self.nodes[i];
        let pod = if second {
            &mut n.second_pod
        } else {
            &mut n.pod
        };
        let sidecars = pod.as_mut().expect("the pod is made first").start_others(
            ENFORCER_CONTAINER,
            log,
            timeout,
        )?;
        for (_, d) in &sidecars {
            self.record_pid(d.pid())?;
        }
        Ok(sidecars)
    }

    /// Stops the container `name` of node `node`'s enforcer pod as the
    /// kubelet does (SIGTERM, SIGKILL after the pod's grace period) and
    /// returns its exit code.
    pub fn stop_sidecar(&mut self, node: &str, name: &str) -> Result<Option<i32>> {
        let i = self.node_index(node)?;
        let grace = self.nodes[i]
            .pod
            .as_ref()
            .map(|p| p.template.termination_grace)
            .ok_or_else(|| anyhow!("node {node} runs no enforcer pod"))?;
        let n = &mut self.nodes[i];
        let at = n
            .sidecars
            .iter()
            .position(|(c, _)| c == name)
            .ok_or_else(|| anyhow!("node {node}'s enforcer pod runs no container {name}"))?;
        let (_, mut sidecar) = n.sidecars.remove(at);
        sidecar.stop(grace)?;
        Ok(sidecar.exit_status().and_then(|s| s.code()))
    }

    /// The log of container `name` of node `node`'s enforcer pod.
    pub fn sidecar_log(&self, node: &str, name: &str) -> Result<PathBuf> {
        let i = self.node_index(node)?;
        self.nodes[i]
            .sidecars
            .iter()
            .find(|(c, _)| c == name)
            .map(|(_, d)| d.log_path().to_path_buf())
            .ok_or_else(|| anyhow!("node {node}'s enforcer pod runs no container {name}"))
    }

    /// The node's chain is what its conflist says after the init container
    /// chained palisade-cni into it; the plugins are found in the node's CNI
    /// bin dir (palisade-cni, copied from the image) and the machine's.
    fn load_chain(&mut self, i: usize) -> Result<()> {
        let root = self.nodes[i].root.as_ref().expect("a root");
        let path = root
            .cni_conf()
            .join(conflist_name(&self.config.chart_values));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let conf: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let plugins = conf["plugins"]
            .as_array()
            .ok_or_else(|| anyhow!("{} has no plugins list", path.display()))?
            .clone();
        let installs = self.nodes[i].pod.as_ref().is_some_and(|p| {
            p.template
                .init_containers
                .iter()
                .any(|c| c.name == "install-cni")
        });
        if !installs {
            self.nodes[i].unenforced = Some(
                "the chart does not chain palisade-cni here (cni.install: false leaves it to the operator)".into(),
            );
            return Ok(());
        }
        if !plugins
            .iter()
            .any(|p| p["type"] == crate::preflight::CNI_BIN)
        {
            bail!(
                "the install-cni init container did not chain palisade-cni into {}:\n{text}",
                path.display()
            );
        }
        let bin = root.cni_bin();
        let node = &mut self.nodes[i];
        node.cni.plugins = plugins;
        node.cni.plugin_dirs = vec![self.config.cni_bin_dir.clone(), bin];
        Ok(())
    }

    /// Waits for a pod's container the way the kubelet decides it: the
    /// readiness probe (`serving`) or the liveness probe (answering at all).
    pub(super) fn wait_probe(&mut self, role: super::processes::Role, serving: bool) -> Result<()> {
        use super::processes::Role;
        let kind = if serving {
            ProbeKind::Readiness
        } else {
            ProbeKind::Liveness
        };
        let timeout = self.config.start_timeout;
        let cancel = self.config.cancel.clone();
        let rt = self.rt.as_ref().expect("the runtime lives until cleanup");
        match role {
            Role::Controller => {
                let pod = self
                    .image
                    .as_ref()
                    .and_then(|s| s.controller_pod.as_ref())
                    .expect("started");
                let daemon = self
                    .controller
                    .as_mut()
                    .ok_or_else(|| anyhow!("the controller is not running"))?;
                kubelet::wait_probe(
                    rt,
                    pod,
                    CONTROLLER_CONTAINER,
                    kind,
                    daemon,
                    timeout,
                    &cancel,
                )
            }
            Role::Enforcer(i) => {
                let n = &mut self.nodes[i];
                let pod = n.pod.as_ref().expect("started");
                let daemon = n
                    .enforcer
                    .as_mut()
                    .ok_or_else(|| anyhow!("the enforcer is not running"))?;
                // The enforcer has only a readiness and a liveness probe on
                // the same check; either says SERVING.
                kubelet::wait_probe(
                    rt,
                    pod,
                    ENFORCER_CONTAINER,
                    ProbeKind::Readiness,
                    daemon,
                    timeout,
                    &cancel,
                )
            }
        }
    }

    /// Binds the caller's API on 127.0.0.1 in the fabric (the controller
    /// pod's network namespace), hands it over, and writes the kubeconfig
    /// the controller pod gets.
    pub(super) fn serve_api(&mut self) -> Result<()> {
        let api = self.config.api.clone().expect("asked for");
        let listener = self
            .fabric()
            .run(|| std::net::TcpListener::bind(("127.0.0.1", 0)))?
            .context("binding the API's listener in the fabric")?;
        let addr = listener.local_addr()?;
        (api.0)(listener).context("starting the caller's API")?;
        let kubeconfig = self.run_dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: lab, cluster: {{server: \"http://{addr}\"}}}}]\n\
             users: [{{name: lab, user: {{}}}}]\n\
             contexts: [{{name: lab, context: {{cluster: lab, user: lab, namespace: {NAMESPACE}}}}}]\n\
             current-context: lab\n"
        );
        std::fs::write(&kubeconfig, text)
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        self.image.as_mut().expect("image mode").kubeconfig = Some(kubeconfig);
        Ok(())
    }

    /// Waits until every enforcer says its plan stream to the controller is
    /// up (through the Service name, and with TLS when the chart asks).
    pub(super) fn wait_connected(&mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + self.config.realize_timeout;
        for i in 0..self.nodes.len() {
            loop {
                self.config.cancel.check()?;
                self.check_processes()?;
                let state = self.enforcer_state_of(i);
                match &state {
                    Ok(s) if s.plan_connected => break,
                    _ if std::time::Instant::now() >= deadline => bail!(
                        "the enforcer of {} did not connect to the controller within {:?}: {}",
                        self.nodes[i].name,
                        self.config.realize_timeout,
                        match state {
                            Ok(s) => format!("plan stream: {:?}", s.plan_stream_error),
                            Err(e) => format!("{e:#}"),
                        }
                    ),
                    _ => {}
                }
                std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
            }
        }
        Ok(())
    }

    /// With TLS, node `i`'s certificate, as the operator provisions it: a
    /// key and a certificate for CN=node:<node> signed with the CA the
    /// chart generated (its Secret keeps ca.key for this), by openssl.
    pub(super) fn provision_node_certificate(&self, i: usize) -> Result<()> {
        let objects = &self.image().expect("image").rendered[i];
        let Some(secret) = objects
            .iter()
            .find(|o| o["kind"] == "Secret" && o["data"]["ca.key"].is_string())
        else {
            return Ok(());
        };
        use base64::Engine;
        let b64 = |k: &str| -> Result<Vec<u8>> {
            Ok(base64::engine::general_purpose::STANDARD
                .decode(secret["data"][k].as_str().unwrap_or(""))?)
        };
        let dir = self.nodes[i].root.as_ref().expect("a root").tls();
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("ca.crt"), b64("ca.crt")?)?;
        let ca_key = self.run_dir.join(format!("ca-{i}.key"));
        std::fs::write(&ca_key, b64("ca.key")?)?;
        let run = |args: &[&str]| -> Result<()> {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .context("running openssl")?;
            if !out.status.success() {
                bail!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        };
        let d = |f: &str| dir.join(f).display().to_string();
        let subject = format!("/CN=node:{}", self.nodes[i].name);
        std::fs::write(
            dir.join("node.ext"),
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )?;
        run(&[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &d("node.key"),
            "-subj",
            &subject,
            "-out",
            &d("node.csr"),
        ])?;
        run(&[
            "x509",
            "-req",
            "-in",
            &d("node.csr"),
            "-CA",
            &d("ca.crt"),
            "-CAkey",
            &ca_key.display().to_string(),
            "-CAcreateserial",
            "-CAserial",
            &d("ca.srl"),
            "-days",
            "2",
            // A v3 certificate (rustls refuses v1, which openssl makes
            // without extensions), for client authentication only.
            "-extfile",
            &d("node.ext"),
            "-out",
            &d("node.crt"),
        ])?;
        let _ = std::fs::remove_file(&ca_key);
        Ok(())
    }

    /// Unmounts node `i`'s bpffs (its pins go with it: the pin root was
    /// removed first).
    pub(super) fn unmount_node_root(node: &mut LabNode) -> Result<()> {
        if !node.bpffs_mounted {
            return Ok(());
        }
        let bpffs = node.root.as_ref().expect("a root").bpffs();
        nix::mount::umount2(&bpffs, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("umount {}", bpffs.display()))?;
        node.bpffs_mounted = false;
        Ok(())
    }

    /// Removes whatever container of this lab is left (a crash of the lab
    /// process between a start and its record).
    pub(super) fn remove_lab_containers(&self) -> Result<Vec<String>> {
        let label = format!("{LAB_LABEL}={}", self.id);
        let left = kubelet::podman::labelled(&label)?;
        for c in &left {
            kubelet::podman::remove(c)?;
        }
        Ok(left)
    }
}

/// The names cluster DNS gives the controller's Service (the one whose
/// selector picks the Deployment's pods), which the lab answers with the
/// controller pod's address. The lab has no kube-proxy for it, so every
/// service port must be its target port.
fn controller_service_names(objects: &[Value]) -> Result<Vec<String>> {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .ok_or_else(|| anyhow!("the chart rendered no Deployment"))?;
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut names = Vec::new();
    for svc in objects.iter().filter(|o| o["kind"] == "Service") {
        let selects = svc["spec"]["selector"]
            .as_object()
            .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| &labels[k] == v));
        if !selects {
            continue;
        }
        let name = svc["metadata"]["name"].as_str().unwrap_or("?");
        for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let target = match &port["targetPort"] {
                Value::String(named) => containers
                    .iter()
                    .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                    .find(|p| p["name"] == named.as_str())
                    .and_then(|p| p["containerPort"].as_u64()),
                Value::Null => port["port"].as_u64(),
                other => other.as_u64(),
            };
            if target != port["port"].as_u64() {
                bail!("Service {name} maps port {} to {target:?}: the lab answers its name with the pod's address and translates no port", port["port"]);
            }
        }
        // Only the full name, as CoreDNS serves it: the shorter ones pods
        // write resolve through the kubelet's search path.
        names.push(format!("{name}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"));
    }
    Ok(names)
}

/// Whether `path` is where a node root would be (for the sweep).
pub fn node_root_bpffs(run_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("node-"))
        .map(|e| e.path().join("bpf"))
        .collect()
}
