//! What the kubelet and a CRI runtime would do with one container of a pod,
//! as `podman run` arguments (pure: every check that needs the machine is in
//! [`super::podman`]).
//!
//! | field | becomes |
//! |---|---|
//! | `hostNetwork: true` | `--network ns:<node netns>` (the lab node is a network namespace), hostname = node name |
//! | `hostNetwork: false` | `--network ns:<pod netns>` given by the caller, hostname = pod name |
//! | `dnsPolicy` | ClusterFirst (without host network) and ClusterFirstWithHostNet: the cluster's DNS server ([`PodRun::cluster_dns`]) in `/etc/resolv.conf` with the kubelet's search path and `ndots:5`, so names resolve through the C library's resolver and real queries; Default (and ClusterFirst with host network, as the kubelet falls back): none |
//! | `command` / `args` | `--entrypoint` (JSON) / arguments after the image |
//! | `env` | `--env`; `fieldRef` spec.nodeName, metadata.name, metadata.namespace answered from the pod's placement |
//! | `runAsUser` / `runAsGroup` (container over pod) | `--user UID[:GID]`; `runAsNonRoot` refuses to start a container whose user would be 0, as the kubelet does |
//! | `allowPrivilegeEscalation: false` | `--security-opt no-new-privileges` |
//! | `readOnlyRootFilesystem` | `--read-only --read-only-tmpfs=false` (no tmpfs a kubelet would not add) |
//! | `capabilities` | `--cap-drop`, `--cap-add`; unset: the runtime's default set |
//! | `seccompProfile` (container over pod) | RuntimeDefault: podman's default profile (containers-common's, as CRI-O's); Unconfined: `seccomp=unconfined`; Localhost: `seccomp=<kubelet seccomp dir>/<profile>`; unset: [`PodRun::seccomp_default`] (the kubelet's is Unconfined unless it runs with `--seccomp-default`) |
//! | `volumeMounts` + `hostPath` | a bind mount of the path on the node (here: this machine's path); `HostToContainer` is `rslave` |
//! | `volumeMounts` + `secret` / `configMap` | a read-only bind of the files the caller wrote for it ([`PodRun::volume_dirs`]), as the kubelet's volume dirs |
//! | `volumeMounts` + `emptyDir` (default medium) | a bind of a directory the caller made empty for this pod ([`PodRun::volume_dirs`]) |
//! | `resources` | limits.memory: `--memory`; limits.cpu: `--cpus`; requests.cpu: `--cpu-shares` (the kubelet's milli * 1024 / 1000); requests.memory: scheduling only |
//! | `terminationGracePeriodSeconds` | `--stop-timeout` |
//! | `automountServiceAccountToken` (default true) | with [`PodRun::api_kubeconfig`]: the stand-in API's kubeconfig, read-only, and `KUBECONFIG` (the stand-in serves plain HTTP, which in-cluster config cannot use); false: nothing |
//! | `imagePullPolicy`, `imagePullSecrets` | `--pull never`: there is no registry; the image must be on the machine |
//! | `nodeSelector` | checked against the node's labels: a pod that would not be scheduled there is refused |
//! | `tolerations`, `affinity`, `priorityClassName`, `ports` | scheduling, eviction and documentation only: nothing on one node |
//!
//! The rlimits are the runtime's own ([`PodRun::rlimits`]): a container
//! inherits its runtime's, and podman's defaults exceed this machine's hard
//! limits.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::spec::{
    Container, DnsPolicy, EnvValue, FieldRef, PodTemplate, Propagation, Seccomp, VolumeSource,
};

/// Why a container of a pod cannot be run as specified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}, container {container}: {reason}")]
pub struct RunError {
    pub pod: String,
    pub container: String,
    pub reason: String,
}

/// The node a pod is placed on.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The node's network namespace: a host network pod's.
    pub netns: PathBuf,
    /// The kubelet's `<root-dir>/seccomp`: Localhost profiles are relative to it.
    pub seccomp_dir: PathBuf,
}

impl Node {
    /// The labels every kubelet puts on its node.
    pub fn standard_labels(name: &str) -> BTreeMap<String, String> {
        [
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", std::env::consts::ARCH),
        ]
        .into_iter()
        .map(|(k, v)| {
            let v = if v == "x86_64" { "amd64" } else { v };
            let v = if v == "aarch64" { "arm64" } else { v };
            (k.to_string(), v.to_string())
        })
        .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimits {
    pub nofile: u64,
    pub nproc: u64,
}

/// Additions to one container that the pod template does not say and the
/// lab's environment needs (the lab standing in for the API server). They
/// may only add: an overlay naming a variable the template sets is refused.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    pub env: Vec<(String, String)>,
    /// (host path, container path), read-only.
    pub mounts: Vec<(PathBuf, String)>,
}

/// One pod placed on a node, with what the kubelet would know about it.
#[derive(Debug, Clone)]
pub struct PodRun {
    pub name: String,
    pub namespace: String,
    pub node: Node,
    /// The pod's own network namespace (None for host network pods).
    pub pod_netns: Option<PathBuf>,
    /// The cluster's DNS server (the kube-dns Service's address).
    pub cluster_dns: Option<IpAddr>,
    /// Where the secret and configMap volumes' files were written, by
    /// volume name.
    pub volume_dirs: BTreeMap<String, PathBuf>,
    pub api_kubeconfig: Option<PathBuf>,
    pub seccomp_default: Seccomp,
    pub rlimits: Rlimits,
    /// podman labels on every container (for finding them again).
    pub labels: Vec<(String, String)>,
    /// By container name.
    pub overlays: BTreeMap<String, Overlay>,
}

/// The cluster's DNS domain, the kubelet's `--cluster-domain` default.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The kubelet's DNS search path for a ClusterFirst pod in `namespace`.
pub fn cluster_search(namespace: &str) -> [String; 3] {
    [
        format!("{namespace}.svc.{CLUSTER_DOMAIN}"),
        format!("svc.{CLUSTER_DOMAIN}"),
        CLUSTER_DOMAIN.to_string(),
    ]
}

/// Where the kubeconfig goes in a container that gets API access.
pub const KUBECONFIG_PATH: &str = "/var/run/secrets/palisade-lab/kubeconfig";

/// What the image says about itself that the kubelet needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageConfig {
    /// The image's `USER`, as written (`65532:65532`, `root`, empty).
    pub user: String,
}

impl PodRun {
    fn fail(&self, container: &Container, reason: impl Into<String>) -> RunError {
        RunError {
            pod: format!("{}/{}", self.namespace, self.name),
            container: container.name.clone(),
            reason: reason.into(),
        }
    }

    /// Whether the pod fits the node (its nodeSelector).
    pub fn check_node(&self, pod: &PodTemplate) -> Result<(), String> {
        for (key, want) in &pod.node_selector {
            if self.node.labels.get(key) != Some(want) {
                return Err(format!(
                    "nodeSelector {key}={want} does not match node {} (labels {:?})",
                    self.node.name, self.node.labels
                ));
            }
        }
        Ok(())
    }

    /// The Localhost profile file a container would use, if any.
    pub fn seccomp_file(&self, pod: &PodTemplate, container: &Container) -> Option<PathBuf> {
        match self.seccomp(pod, container) {
            Seccomp::Localhost(p) => Some(self.node.seccomp_dir.join(p)),
            _ => None,
        }
    }

    fn seccomp(&self, pod: &PodTemplate, container: &Container) -> Seccomp {
        container
            .security
            .seccomp
            .clone()
            .or_else(|| pod.security.seccomp.clone())
            .unwrap_or_else(|| self.seccomp_default.clone())
    }

    /// The network namespace the container joins.
    pub fn netns<'a>(&'a self, pod: &PodTemplate) -> Option<&'a Path> {
        if pod.host_network {
            Some(&self.node.netns)
        } else {
            self.pod_netns.as_deref()
        }
    }

    /// `podman run` arguments (after `run`, before nothing: they end with
    /// the image and its arguments) for `container` named `name`.
    pub fn args(
        &self,
        pod: &PodTemplate,
        container: &Container,
        image: &ImageConfig,
        name: &str,
    ) -> Result<Vec<String>, RunError> {
        self.check_node(pod).map_err(|r| self.fail(container, r))?;
        let mut a: Vec<String> = vec![format!("--name={name}"), "--pull=never".into()];
        for (k, v) in &self.labels {
            a.push(format!("--label={k}={v}"));
        }
        a.push(format!("--label=io.kubernetes.pod.name={}", self.name));
        a.push(format!(
            "--label=io.kubernetes.pod.namespace={}",
            self.namespace
        ));
        a.push(format!(
            "--label=io.kubernetes.container.name={}",
            container.name
        ));

        let netns = self.netns(pod).ok_or_else(|| {
            self.fail(
                container,
                "the pod has no host network and no pod network was given",
            )
        })?;
        a.push(format!("--network=ns:{}", netns.display()));
        let hostname = if pod.host_network {
            &self.node.name
        } else {
            &self.name
        };
        a.push(format!("--hostname={hostname}"));
        let cluster_dns = match pod.dns_policy {
            DnsPolicy::ClusterFirstWithHostNet => true,
            DnsPolicy::ClusterFirst => !pod.host_network,
            DnsPolicy::Default => false,
        };
        match self.cluster_dns.filter(|_| cluster_dns) {
            // What the kubelet writes for ClusterFirst: the names a pod
            // gives are tried under its namespace's domains first.
            Some(server) => {
                a.push(format!("--dns={server}"));
                for domain in cluster_search(&self.namespace) {
                    a.push(format!("--dns-search={domain}"));
                }
                a.push("--dns-option=ndots:5".into());
            }
            None => a.push("--dns=none".into()),
        }

        self.user_args(pod, container, image, &mut a)?;
        let sec = &container.security;
        if sec.allow_privilege_escalation == Some(false) {
            a.push("--security-opt=no-new-privileges".into());
        }
        if sec.read_only_root_filesystem {
            a.push("--read-only".into());
            a.push("--read-only-tmpfs=false".into());
        }
        if let Some(caps) = &sec.capabilities {
            a.extend(caps.drop.iter().map(|c| format!("--cap-drop={c}")));
            a.extend(caps.add.iter().map(|c| format!("--cap-add={c}")));
        }
        match self.seccomp(pod, container) {
            Seccomp::RuntimeDefault => {}
            Seccomp::Unconfined => a.push("--security-opt=seccomp=unconfined".into()),
            Seccomp::Localhost(p) => a.push(format!(
                "--security-opt=seccomp={}",
                self.node.seccomp_dir.join(p).display()
            )),
        }

        let r = &container.resources;
        if let Some(bytes) = r.memory_limit {
            a.push(format!("--memory={bytes}"));
        }
        if let Some(milli) = r.cpu_limit_milli {
            a.push(format!("--cpus={}.{:03}", milli / 1000, milli % 1000));
        }
        if let Some(milli) = r.cpu_request_milli {
            a.push(format!("--cpu-shares={}", (milli * 1024 / 1000).max(2)));
        }
        a.push(format!(
            "--stop-timeout={}",
            pod.termination_grace.as_secs()
        ));
        a.push(format!("--ulimit=nofile={0}:{0}", self.rlimits.nofile));
        a.push(format!("--ulimit=nproc={0}:{0}", self.rlimits.nproc));

        self.env_args(pod, container, &mut a)?;
        self.mount_args(pod, container, &mut a)?;

        if !container.command.is_empty() {
            let json = serde_json::to_string(&container.command).expect("strings serialize");
            a.push(format!("--entrypoint={json}"));
        }
        a.push(container.image.clone());
        a.extend(container.args.iter().cloned());
        Ok(a)
    }

    fn user_args(
        &self,
        pod: &PodTemplate,
        c: &Container,
        image: &ImageConfig,
        a: &mut Vec<String>,
    ) -> Result<(), RunError> {
        let uid = c.security.run_as_user.or(pod.security.run_as_user);
        let gid = c.security.run_as_group.or(pod.security.run_as_group);
        let non_root = c
            .security
            .run_as_non_root
            .or(pod.security.run_as_non_root)
            .unwrap_or(false);
        let image_uid = || -> Result<u32, RunError> {
            let user = image.user.split(':').next().unwrap_or("");
            match user {
                "" | "root" => Ok(0),
                u => u.parse().map_err(|_| {
                    self.fail(
                        c,
                        format!("the image's user {u:?} is not numeric, so runAsNonRoot cannot be verified"),
                    )
                }),
            }
        };
        let effective = match uid {
            Some(u) => u,
            None => image_uid()?,
        };
        if non_root && effective == 0 {
            return Err(self.fail(
                c,
                "runAsNonRoot is set and the container would run as root (uid 0)",
            ));
        }
        match (uid, gid) {
            (Some(u), Some(g)) => a.push(format!("--user={u}:{g}")),
            (Some(u), None) => a.push(format!("--user={u}")),
            (None, Some(g)) => a.push(format!("--user={}:{g}", image_uid()?)),
            (None, None) => {}
        }
        Ok(())
    }

    fn env_args(
        &self,
        pod: &PodTemplate,
        c: &Container,
        a: &mut Vec<String>,
    ) -> Result<(), RunError> {
        let mut names = Vec::new();
        for e in &c.env {
            let value = match &e.value {
                EnvValue::Literal(v) => v.clone(),
                EnvValue::Field(FieldRef::NodeName) => self.node.name.clone(),
                EnvValue::Field(FieldRef::PodName) => self.name.clone(),
                EnvValue::Field(FieldRef::PodNamespace) => self.namespace.clone(),
            };
            a.push(format!("--env={}={value}", e.name));
            names.push(e.name.as_str());
        }
        let mut extra: Vec<(String, String)> = Vec::new();
        if pod.automount_service_account_token != Some(false) {
            if let Some(kubeconfig) = &self.api_kubeconfig {
                a.push(format!(
                    "--mount=type=bind,source={},destination={KUBECONFIG_PATH},ro",
                    bind_path(kubeconfig, c, self)?
                ));
                extra.push(("KUBECONFIG".into(), KUBECONFIG_PATH.into()));
            }
        }
        if let Some(o) = self.overlays.get(&c.name) {
            extra.extend(o.env.iter().cloned());
        }
        for (k, v) in extra {
            if names.contains(&k.as_str()) {
                return Err(self.fail(
                    c,
                    format!(
                        "the lab would override {k}, which the template sets: overlays only add"
                    ),
                ));
            }
            a.push(format!("--env={k}={v}"));
        }
        Ok(())
    }

    fn mount_args(
        &self,
        pod: &PodTemplate,
        c: &Container,
        a: &mut Vec<String>,
    ) -> Result<(), RunError> {
        for m in &c.mounts {
            let volume = pod
                .volumes
                .iter()
                .find(|v| v.name == m.volume)
                .ok_or_else(|| self.fail(c, format!("volume {:?} is not declared", m.volume)))?;
            let (source, read_only) = match &volume.source {
                VolumeSource::HostPath { path, .. } => (PathBuf::from(path), m.read_only),
                VolumeSource::EmptyDir => (
                    self.volume_dirs.get(&volume.name).cloned().ok_or_else(|| {
                        self.fail(
                            c,
                            format!("no directory was made for volume {:?}", volume.name),
                        )
                    })?,
                    m.read_only,
                ),
                // Secret and configMap volumes are always read-only.
                VolumeSource::Secret { .. } | VolumeSource::ConfigMap { .. } => (
                    self.volume_dirs.get(&volume.name).cloned().ok_or_else(|| {
                        self.fail(
                            c,
                            format!("no files were written for volume {:?}", volume.name),
                        )
                    })?,
                    true,
                ),
            };
            let mut spec = format!(
                "--mount=type=bind,source={},destination={}",
                bind_path(&source, c, self)?,
                bind_path(Path::new(&m.path), c, self)?
            );
            if read_only {
                spec.push_str(",ro");
            }
            if m.propagation == Propagation::HostToContainer {
                spec.push_str(",bind-propagation=rslave");
            }
            a.push(spec);
        }
        if let Some(o) = self.overlays.get(&c.name) {
            for (host, path) in &o.mounts {
                a.push(format!(
                    "--mount=type=bind,source={},destination={},ro",
                    bind_path(host, c, self)?,
                    bind_path(Path::new(path), c, self)?
                ));
            }
        }
        Ok(())
    }
}

/// A path as `--mount` takes it: commas separate its options.
fn bind_path(p: &Path, c: &Container, run: &PodRun) -> Result<String, RunError> {
    let s = p.display().to_string();
    if s.contains(',') || !s.starts_with('/') {
        return Err(run.fail(
            c,
            format!("{s:?} cannot be bind mounted (absolute, no comma)"),
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::spec::parse_template;
    use super::*;
    use serde_json::json;

    fn run() -> PodRun {
        PodRun {
            name: "enforcer-x".into(),
            namespace: "palisade-system".into(),
            node: Node {
                name: "node-1".into(),
                labels: Node::standard_labels("node-1"),
                netns: "/run/netns/node".into(),
                seccomp_dir: "/var/lib/kubelet/seccomp".into(),
            },
            pod_netns: None,
            cluster_dns: Some("10.0.0.10".parse().unwrap()),
            volume_dirs: BTreeMap::new(),
            api_kubeconfig: None,
            seccomp_default: Seccomp::Unconfined,
            rlimits: Rlimits {
                nofile: 1024,
                nproc: 512,
            },
            labels: vec![("lab".into(), "abc".into())],
            overlays: BTreeMap::new(),
        }
    }

    fn image(user: &str) -> ImageConfig {
        ImageConfig { user: user.into() }
    }

    fn args_of(
        template: serde_json::Value,
        run: &PodRun,
        user: &str,
    ) -> Result<Vec<String>, RunError> {
        let pod = parse_template(&template, "t").unwrap();
        run.args(&pod, &pod.containers[0], &image(user), "ctr")
    }

    #[test]
    fn an_enforcer_like_pod_becomes_these_arguments() {
        let t = json!({"spec": {
            "hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "enforcer", "image": "img:1", "command": ["/usr/local/bin/palisade-enforcer"],
                "env": [{"name": "PALISADE_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, {"name": "A", "value": "b"}],
                "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN"]},
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "palisade/enforcer.json"}},
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                "volumeMounts": [{"name": "bpffs", "mountPath": "/sys/fs/bpf", "mountPropagation": "HostToContainer"}]
            }],
            "volumes": [{"name": "bpffs", "hostPath": {"path": "/sys/fs/bpf", "type": "Directory"}}]
        }});
        let a = args_of(t, &run(), "65532:65532").unwrap();
        let want = [
            "--name=ctr",
            "--pull=never",
            "--label=lab=abc",
            "--label=io.kubernetes.pod.name=enforcer-x",
            "--label=io.kubernetes.pod.namespace=palisade-system",
            "--label=io.kubernetes.container.name=enforcer",
            "--network=ns:/run/netns/node",
            "--hostname=node-1",
            "--dns=10.0.0.10",
            "--dns-search=palisade-system.svc.cluster.local",
            "--dns-search=svc.cluster.local",
            "--dns-search=cluster.local",
            "--dns-option=ndots:5",
            "--user=0",
            "--security-opt=no-new-privileges",
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop=ALL",
            "--cap-add=BPF",
            "--cap-add=NET_ADMIN",
            "--security-opt=seccomp=/var/lib/kubelet/seccomp/palisade/enforcer.json",
            "--memory=536870912",
            "--cpu-shares=51",
            "--stop-timeout=30",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=512:512",
            "--env=PALISADE_NODE_NAME=node-1",
            "--env=A=b",
            "--mount=type=bind,source=/sys/fs/bpf,destination=/sys/fs/bpf,bind-propagation=rslave",
            "--entrypoint=[\"/usr/local/bin/palisade-enforcer\"]",
            "img:1",
        ];
        assert_eq!(a, want);
    }

    #[test]
    fn run_as_non_root_is_enforced_against_the_image_user() {
        let t = |sc: serde_json::Value| json!({"spec": {"securityContext": sc, "containers": [{"name": "c", "image": "i"}]}});
        let mut r = run();
        r.pod_netns = Some("/run/netns/pod".into());
        assert!(args_of(t(json!({"runAsNonRoot": true})), &r, "65532:65532").is_ok());
        let e = args_of(t(json!({"runAsNonRoot": true})), &r, "").unwrap_err();
        assert!(e.reason.contains("would run as root"), "{e}");
        let e = args_of(
            t(json!({"runAsNonRoot": true, "runAsUser": 0})),
            &r,
            "65532",
        )
        .unwrap_err();
        assert!(e.reason.contains("would run as root"), "{e}");
        let e = args_of(t(json!({"runAsNonRoot": true})), &r, "nonroot").unwrap_err();
        assert!(e.reason.contains("not numeric"), "{e}");
        let a = args_of(t(json!({"runAsUser": 65532, "runAsGroup": 65532})), &r, "").unwrap();
        assert!(a.contains(&"--user=65532:65532".to_string()));
        // Not host network: the pod's own namespace and name.
        assert!(a.contains(&"--network=ns:/run/netns/pod".to_string()));
        assert!(a.contains(&"--hostname=enforcer-x".to_string()));
    }

    #[test]
    fn seccomp_follows_container_then_pod_then_the_kubelet_default() {
        let mut r = run();
        r.pod_netns = Some("/p".into());
        let with = |pod: serde_json::Value, c: serde_json::Value| json!({"spec": {"securityContext": {"seccompProfile": pod}, "containers": [{"name": "c", "image": "i", "securityContext": {"seccompProfile": c}}]}});
        let a = args_of(
            with(
                json!({"type": "RuntimeDefault"}),
                json!({"type": "Unconfined"}),
            ),
            &r,
            "",
        )
        .unwrap();
        assert!(a.contains(&"--security-opt=seccomp=unconfined".to_string()));
        let a = args_of(with(json!({"type": "RuntimeDefault"}), json!(null)), &r, "").unwrap();
        assert!(!a.iter().any(|x| x.contains("seccomp")), "{a:?}");
        let a = args_of(
            json!({"spec": {"containers": [{"name": "c", "image": "i"}]}}),
            &r,
            "",
        )
        .unwrap();
        assert!(
            a.contains(&"--security-opt=seccomp=unconfined".to_string()),
            "the kubelet's default"
        );
    }

    #[test]
    fn dns_gives_cluster_names_only_where_the_kubelet_would() {
        let t = |host: bool, policy: &str| json!({"spec": {"hostNetwork": host, "dnsPolicy": policy, "containers": [{"name": "c", "image": "i"}]}});
        let mut r = run();
        r.pod_netns = Some("/p".into());
        let has = |a: Vec<String>| {
            let dns = a.iter().any(|x| x == "--dns=10.0.0.10");
            assert_eq!(dns, !a.iter().any(|x| x == "--dns=none"), "{a:?}");
            dns
        };
        assert!(has(
            args_of(t(true, "ClusterFirstWithHostNet"), &r, "").unwrap()
        ));
        assert!(!has(args_of(t(true, "ClusterFirst"), &r, "").unwrap()));
        assert!(has(args_of(t(false, "ClusterFirst"), &r, "").unwrap()));
        assert!(!has(args_of(t(false, "Default"), &r, "").unwrap()));
    }

    #[test]
    fn overlays_add_and_never_override() {
        let t = json!({"spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]}]}});
        let mut r = run();
        r.overlays.insert(
            "c".into(),
            Overlay {
                env: vec![("B".into(), "2".into())],
                mounts: vec![("/m".into(), "/m".into())],
            },
        );
        let a = args_of(t.clone(), &r, "").unwrap();
        assert!(a.contains(&"--env=B=2".to_string()));
        assert!(a.contains(&"--mount=type=bind,source=/m,destination=/m,ro".to_string()));
        r.overlays
            .get_mut("c")
            .unwrap()
            .env
            .push(("A".into(), "9".into()));
        assert!(args_of(t, &r, "")
            .unwrap_err()
            .reason
            .contains("overlays only add"));
    }

    #[test]
    fn a_node_selector_that_does_not_match_is_refused() {
        let t = |sel: serde_json::Value| json!({"spec": {"hostNetwork": true, "nodeSelector": sel, "containers": [{"name": "c", "image": "i"}]}});
        assert!(args_of(t(json!({"kubernetes.io/os": "linux"})), &run(), "").is_ok());
        let e = args_of(t(json!({"disk": "ssd"})), &run(), "").unwrap_err();
        assert!(e.reason.contains("nodeSelector disk=ssd"), "{e}");
    }

    #[test]
    fn secret_volumes_are_read_only_binds_of_their_written_files() {
        let t = json!({"spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "i",
            "volumeMounts": [{"name": "tls", "mountPath": "/etc/tls"}]}],
            "volumes": [{"name": "tls", "secret": {"secretName": "s"}}]}});
        let mut r = run();
        assert!(args_of(t.clone(), &r, "")
            .unwrap_err()
            .reason
            .contains("no files were written"));
        r.volume_dirs.insert("tls".into(), "/run/vol/tls".into());
        let a = args_of(t, &r, "").unwrap();
        assert!(a.contains(
            &"--mount=type=bind,source=/run/vol/tls,destination=/etc/tls,ro".to_string()
        ));
    }
}
