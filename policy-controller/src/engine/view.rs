//! The engine's objects as a [`ClusterState`], for the reference model
//! (the debug service's Explain). Pods come back as the engine keeps them
//! (labels, node, addresses, named container ports): all the model reads of
//! a pod. Finished pods are not kept, so they are not here either.

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use palisade_proto::v1::Protocol;

use super::Engine;
use crate::cluster::ClusterState;
use crate::resolve::PodInfo;

impl Engine {
    /// Every object the engine holds, sorted as [`ClusterState::from_objects`]
    /// sorts them. Costs a copy of the cluster: for operators' queries.
    pub fn cluster_view(&self, marker: String) -> ClusterState {
        let o = &self.objects;
        let mut namespaces: Vec<Namespace> = o
            .namespaces()
            .filter_map(|ns| {
                o.ns_object_labels(ns).map(|labels| Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        labels: Some(labels.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                })
            })
            .collect();
        namespaces.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut pods: Vec<Pod> = o.all_pods().map(|p| pod_object(p)).collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        let mut policy_keys: Vec<_> = o.policy_keys().collect();
        policy_keys.sort();
        let policies = policy_keys
            .iter()
            .filter_map(|(ns, name)| o.policy(ns, name).map(|p| (**p).clone()))
            .collect();
        let mut service_keys: Vec<_> = o.service_keys().collect();
        service_keys.sort();
        let services = service_keys
            .iter()
            .filter_map(|(ns, name)| o.service(ns, name).map(|s| (**s).clone()))
            .collect();
        let mut slice_keys: Vec<_> = o.slice_keys().cloned().collect();
        slice_keys.sort();
        let endpoint_slices = slice_keys
            .iter()
            .filter_map(|k| o.slice(k).map(|s| (**s).clone()))
            .collect();
        let cluster_policies = o.tiered().map(|t| t.policy.clone()).collect();
        let nodes = o.nodes().map(|n| (**n).clone()).collect();
        ClusterState {
            namespaces,
            pods,
            policies,
            services,
            endpoint_slices,
            cluster_policies,
            nodes,
            marker,
        }
    }
}

fn pod_object(p: &PodInfo) -> Pod {
    let ports: Vec<ContainerPort> = p
        .named_ports
        .iter()
        .flat_map(|(name, numbers)| {
            numbers.iter().map(move |(proto, number)| ContainerPort {
                name: Some(name.clone()),
                container_port: i32::from(*number),
                protocol: Some(protocol_name(*proto).to_string()),
                ..Default::default()
            })
        })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(p.name.clone()),
            namespace: Some(p.namespace.clone()),
            labels: Some(p.labels.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: p.node.clone(),
            host_network: Some(p.host_network),
            containers: vec![Container {
                name: "ports".into(),
                ports: Some(ports),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            pod_ips: Some(
                p.ips
                    .iter()
                    .map(|ip| PodIP { ip: ip.to_string() })
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
        _ => "TCP",
    }
}
