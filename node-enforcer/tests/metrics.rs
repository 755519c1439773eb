//! The enforcer's /metrics, served by the real metrics server in process
//! and scraped with a real HTTP client, as grpc_services.rs runs the gRPC
//! servers: the reconciler (with the in-memory datapath) behind the real
//! CNI service gives plan versions and pod up, and a real eBPF datapath
//! loaded under its own pin root gives the maps the scrape reads: its map
//! fill levels, and its verdict counters after packets judged by the real
//! programs (BPF_PROG_TEST_RUN). Needs root and bpffs.

use palisade_test_support::metrics::{get, scrape};
use palisade_test_support::require_root;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use node_enforcer::compile::{PortEntry, PortSet, Prefix};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::fake::FakeDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use node_enforcer::handle::Handle;
use node_enforcer::reconciler::{PlanMessage, Reconciler};
use node_enforcer::{metrics, server};
use palisade_proto::v1::{
    cni_service_client::CniServiceClient, DirectionPolicy, IpPrefix, NodeState, PlanSnapshot,
    PodPolicy, PodRef, PodUpRequest,
};
use palisade_runtime::metrics_http;
use palisade_runtime::transport::{connect, serve, Address};
use tokio::sync::{mpsc, watch};

const DEADLINE: Duration = Duration::from_secs(20);
/// Loopback: every namespace has it, and test runs need no attachment.
const IFINDEX: u32 = 1;
const POD: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);

struct PinRoot(std::path::PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ethernet + IPv4 + a TCP segment (ACK) from `src:40000` to the pod's `port`.
fn segment(src: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&40u16.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&POD.octets());
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.resize(14 + 40, 0);
    f[14 + 20 + 12] = 0x50;
    f[14 + 20 + 13] = 0x10; // ACK: a segment conntrack may vouch for (a SYN never is)
    f
}

async fn scrape_until(
    addr: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let m = scrape(addr).await;
        if done(&m) {
            return m;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {m:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await; // poll: the reconciler applies on its own thread
    }
}

#[tokio::test]
#[ignore = "needs root"]
async fn metrics_follow_plans_pod_up_and_datapath_verdicts() {
    require_root();
    let root = PinRoot(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-metrics-{}",
        std::process::id()
    )));
    let mut dp = BpfDatapath::load_with(&root.0, Some(4096)).expect("load the programs");

    // The reconciler and its CNI service, as grpc_services.rs runs them.
    let dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(dir.path().join("cni.sock"));
    let (tx, rx) = mpsc::channel(16);
    let (state_tx, _state_rx) = watch::channel(NodeState::default());
    let reconciler = Reconciler::new(
        "n1".into(),
        "test".into(),
        FakeDatapath::with_interfaces(&["veth1"]),
    );
    std::thread::spawn(move || reconciler.run(rx, state_tx));
    let handle = Handle::new(tx, Duration::from_secs(5));
    let (router, _health) = server::router(handle.clone(), "eni".into()).await.unwrap();
    let cni_addr = socket.clone();
    tokio::spawn(async move { serve(router, &cni_addr, std::future::pending()).await });

    let listener = metrics_http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(metrics_http::serve(
        listener,
        metrics::scraper(handle.clone(), root.0.clone()),
    ));

    let m = scrape(&addr).await;
    assert_eq!(
        get(&m, "palisade_enforcer_scrape_ok{part=\"reconciler\"}"),
        1.0
    );
    assert_eq!(
        get(&m, "palisade_enforcer_scrape_ok{part=\"datapath\"}"),
        1.0
    );
    assert_eq!(get(&m, "palisade_enforcer_realized_version"), 0.0);
    assert_eq!(
        get(&m, "palisade_enforcer_map_capacity{map=\"pal_ct4\"}"),
        4096.0,
        "the size this datapath was loaded with, read from the kernel"
    );
    assert_eq!(
        get(&m, "palisade_enforcer_map_capacity{map=\"pal_ep_index\"}"),
        f64::from(palisade_ebpf::MAX_ENDPOINTS)
    );
    assert_eq!(
        get(&m, "palisade_enforcer_map_entries{map=\"pal_ep_index\"}"),
        0.0
    );
    assert_eq!(
        get(&m, "palisade_enforcer_conntrack_share"),
        1024.0,
        "a quarter of the conntrack map"
    );
    let verdicts: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("palisade_enforcer_verdicts_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(verdicts, 0.0);
    let pod_ups = get(&m, "palisade_enforcer_pod_up_duration_seconds_count");

    // A plan: received and realized.
    let policy = PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: "a".into(),
        }),
        pod_ips: vec![],
        ingress: Some(DirectionPolicy::default()),
        egress: None,
        policies: vec!["x/deny".into()],
        ..Default::default()
    };
    handle
        .plan(PlanMessage::Snapshot(PlanSnapshot {
            version: 7,
            pods: vec![policy],
            source_synced: true,
            term: 0,
            ..Default::default()
        }))
        .await
        .unwrap();
    let m = scrape_until(&addr, "plan 7 realized", |m| {
        m.get("palisade_enforcer_realized_version") == Some(&7.0)
    })
    .await;
    assert_eq!(get(&m, "palisade_enforcer_plan_version"), 7.0);

    // A pod up through the CNI service is timed.
    let channel = connect(&socket, Duration::from_secs(5)).await.unwrap();
    let up = CniServiceClient::new(channel)
        .pod_up(PodUpRequest {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: "a".into(),
            }),
            container_id: "c1".into(),
            netns: "/run/netns/a".into(),
            host_interfaces: vec!["veth1".into()],
            pod_ips: vec![IpPrefix {
                addr: vec![10, 0, 0, 5],
                prefix_len: 32,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(up.ingress_isolated);
    let m = scrape(&addr).await;
    assert_eq!(
        get(&m, "palisade_enforcer_pod_up_duration_seconds_count"),
        pod_ups + 1.0
    );
    assert_eq!(get(&m, "palisade_enforcer_pods"), 1.0);

    // The real datapath: one endpoint whose ingress allows 10.0.0.1 on
    // TCP/80; packets judged by the real programs are counted.
    dp.add_portset(
        1,
        &PortSet(
            [PortEntry::Block {
                proto: 6,
                port: 80,
                bits: 16,
            }]
            .into(),
        ),
    )
    .unwrap();
    dp.add_policy(
        7,
        &[(Prefix::from_ip(Ipv4Addr::new(10, 0, 0, 1).into(), 32), 1)],
    )
    .unwrap();
    dp.set_endpoint(
        IFINDEX,
        &EndpointEntry {
            ingress: 7,
            egress: 0,
            pod_addrs: vec![POD.to_ipv6_mapped().octets()],
        },
    )
    .unwrap();
    let judge = |dp: &BpfDatapath, from: u8| {
        dp.test_run(
            palisade_ebpf::PROG_TO_POD,
            &segment(Ipv4Addr::new(10, 0, 0, from), 80),
            IFINDEX,
        )
        .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(judge(&dp, 3), palisade_ebpf::VERDICT_DROP);
    }
    assert_eq!(judge(&dp, 1), palisade_ebpf::VERDICT_NEXT);
    let m = scrape(&addr).await;
    let verdicts = |direction: &str, verdict: &str, reason: &str| {
        get(
            &m,
            &format!(
                "palisade_enforcer_verdicts_total{{direction=\"{direction}\",verdict=\"{verdict}\",reason=\"{reason}\"}}"
            ),
        )
    };
    // Judged by the pod's ingress hook (PROG_TO_POD), counted there only.
    assert_eq!(verdicts("ingress", "denied", "policy"), 3.0);
    assert_eq!(verdicts("ingress", "allowed", "policy"), 1.0);
    assert_eq!(verdicts("egress", "denied", "policy"), 0.0);
    assert_eq!(verdicts("egress", "allowed", "policy"), 0.0);
    // Egress judges something too: a packet the pod sends.
    assert_eq!(
        dp.test_run(
            palisade_ebpf::PROG_FROM_POD,
            &segment(Ipv4Addr::new(10, 0, 0, 3), 80),
            IFINDEX
        )
        .unwrap(),
        palisade_ebpf::VERDICT_DROP,
        "a source that is not the pod's own"
    );
    let m = scrape(&addr).await;
    assert_eq!(
        get(
            &m,
            "palisade_enforcer_verdicts_total{direction=\"egress\",verdict=\"denied\",reason=\"spoofed_source\"}"
        ),
        1.0
    );
    assert_eq!(
        get(&m, "palisade_enforcer_map_entries{map=\"pal_ep_index\"}"),
        1.0
    );
    assert_eq!(
        get(&m, "palisade_enforcer_map_entries{map=\"pal_policy\"}"),
        1.0
    );
    assert!(
        get(&m, "palisade_enforcer_map_entries{map=\"pal_ct4\"}") >= 1.0,
        "the allowed SYN made a conntrack entry"
    );
    dp.remove_endpoint(IFINDEX).unwrap();

    // Maps that cannot be read are said so, not shown as zero traffic.
    drop(dp);
    std::fs::remove_dir_all(&root.0).unwrap();
    let m = scrape(&addr).await;
    assert_eq!(
        get(&m, "palisade_enforcer_scrape_ok{part=\"datapath\"}"),
        0.0
    );
    assert!(!m
        .keys()
        .any(|k| k.starts_with("palisade_enforcer_verdicts_total")));
    assert_eq!(get(&m, "palisade_enforcer_realized_version"), 7.0);
}

/// An upgrade from a version whose counters had no room for today's kinds:
/// its maps (`pal_stats`, `pal_dir_stats`) are unpinned once this version's
/// programs run, and the counters read are the new map's, every kind of
/// both directions.
#[test]
#[ignore = "needs root"]
fn older_counter_maps_are_unpinned_after_adopt() {
    require_root();
    use palisade_ebpf::legacy::{MAP_DIR_STATS, MAP_STATS_UNDIRECTED};
    require_root();
    let root = PinRoot(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-retired-stats-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&root.0).unwrap();
    // The older versions' maps as they left them: per-CPU u64 counters of
    // one slot per kind, and of 8 kinds by direction.
    for (name, entries) in [("pal_stats", "8"), ("pal_dir_stats", "16")] {
        let pin = root.0.join(name);
        let out = std::process::Command::new("bpftool")
            .args(["map", "create"])
            .arg(&pin)
            .args(["type", "percpu_array", "key", "4", "value", "8"])
            .args(["entries", entries, "name", name])
            .output()
            .expect("run bpftool");
        assert!(
            out.status.success(),
            "bpftool map create {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut dp = BpfDatapath::load_with(&root.0, Some(4096)).expect("load the programs");
    dp.adopt().expect("adopt");
    for name in [MAP_STATS_UNDIRECTED, MAP_DIR_STATS] {
        assert!(!root.0.join(name).exists(), "{name} still pinned");
    }
    let reading = node_enforcer::metrics_maps::read(&root.0).expect("read the counters");
    assert_eq!(reading.verdicts.len(), palisade_ebpf::STAT_SLOTS as usize);
}
