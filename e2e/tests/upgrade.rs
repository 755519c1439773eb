//! A rolling upgrade of the enforcer between two images, and the rollback,
//! as the chart's DaemonSet does it (`maxSurge: 1`, `maxUnavailable: 0`):
//! the new image's pod starts while the old one runs and waits on the node
//! lock; the old pod is deleted and exits cleanly; the new one takes the
//! node over. Throughout, a UDP stream and a TCP connection keep flowing
//! (not one datagram lost), and pods started while no enforcer serves are
//! enforced once up.
//!
//! The two images are this tree built as two versions (`scripts/image.sh`
//! and `--version VERSION-next`): the binaries are the same, so this tests
//! the handover, not compatibility between releases' state formats.

mod common;
use common::require_root;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use palisade_e2e::chart::default_chart;
use palisade_e2e::lab::ImageRun;
use palisade_e2e::probe::echo;
use palisade_e2e::scenario::Target;
use palisade_e2e::{Lab, LabConfig, Outcome, PodName};

/// The stream's port on pod b (allowed from a).
const STREAM_PORT: u16 = 9000;
/// Between two datagrams of the stream: about 1,000 a second.
const STREAM_EVERY: Duration = Duration::from_millis(1);
const TIMEOUT: Duration = Duration::from_secs(1);

/// b takes TCP 80 and the stream's port from a; a itself is isolated, so
/// b's echoes reach a only as replies of an established flow (conntrack).
const POLICIES: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: b-from-a, namespace: x}
    spec:
      podSelector: {matchLabels: {app: b}}
      policyTypes: [Ingress]
      ingress:
        - from: [{podSelector: {matchLabels: {app: a}}}]
          ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 9000}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: a-isolated, namespace: x}
    spec: {podSelector: {matchLabels: {app: a}}, policyTypes: [Ingress]}
"#;

/// Two pods started during a handover: one the policy selects, one not.
fn new_pods(round: usize) -> Vec<palisade_e2e::Object> {
    policies(&format!(
        r#"
objects:
  - {{apiVersion: v1, kind: Namespace, metadata: {{name: x, labels: {{ns: x}}}}}}
  - {{apiVersion: v1, kind: Pod, metadata: {{name: b{round}, namespace: x, labels: {{app: b}}}}, spec: {{containers: [{{name: c, image: none, ports: [{{containerPort: 80}}]}}]}}}}
  - {{apiVersion: v1, kind: Pod, metadata: {{name: d{round}, namespace: x, labels: {{app: d}}}}, spec: {{containers: [{{name: c, image: none, ports: [{{containerPort: 80}}]}}]}}}}
"#
    ))
}

fn pod(name: &str) -> PodName {
    PodName::parse(name).unwrap()
}

/// A datagram stream from a to b, each echoed back by b: what each side
/// received, by sequence number.
struct Stream {
    stop: AtomicBool,
    sent: AtomicU32,
    client: UdpSocket,
    server: UdpSocket,
}

struct Received {
    sent: u32,
    at_b: BTreeSet<u32>,
    echoed: BTreeSet<u32>,
}

impl Stream {
    fn open(lab: &Lab) -> Stream {
        let server = pod_ns(lab, "x/b")
            .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, STREAM_PORT)))
            .unwrap()
            .unwrap();
        let b = pod_ipv4(lab, "x/b");
        let client = pod_ns(lab, "x/a")
            .run(|| {
                let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                s.connect((b, STREAM_PORT))?;
                Ok::<_, std::io::Error>(s)
            })
            .unwrap()
            .unwrap();
        Stream {
            stop: AtomicBool::new(false),
            sent: AtomicU32::new(0),
            client,
            server,
        }
    }

    /// Runs the stream while `during` runs, and for `tail` datagrams more;
    /// then collects what arrived, each side until its last datagram or a
    /// second passes.
    fn around<T>(&self, during: impl FnOnce() -> T) -> (T, Received) {
        const TAIL: u32 = 200;
        std::thread::scope(|s| {
            let sender = s.spawn(|| {
                let mut seq = 0u32;
                let mut after = 0;
                while after < TAIL {
                    seq += 1;
                    self.client.send(&seq.to_be_bytes()).expect("stream send");
                    self.sent.store(seq, Ordering::Relaxed);
                    if self.stop.load(Ordering::Relaxed) {
                        after += 1;
                    }
                    // Paces the stream (its shape, not a wait for anything).
                    std::thread::sleep(STREAM_EVERY); // poll: the stream's pacing, not a wait
                }
                seq
            });
            let echoer = s.spawn(|| {
                let mut got = BTreeSet::new();
                let mut buf = [0u8; 8];
                self.server.set_read_timeout(Some(TIMEOUT)).unwrap();
                // Until the sender is done and a second passes silent.
                while let Ok((4, from)) = self.server.recv_from(&mut buf) {
                    got.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
                    let _ = self.server.send_to(&buf[..4], from);
                }
                got
            });
            let echoes = s.spawn(|| {
                let mut got = BTreeSet::new();
                let mut buf = [0u8; 8];
                self.client.set_read_timeout(Some(TIMEOUT)).unwrap();
                while let Ok(4) = self.client.recv(&mut buf) {
                    got.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
                }
                got
            });
            // Stops the sender even if `during` panics (the scope would
            // otherwise wait for it forever).
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let out = {
                let _stop = StopOnDrop(&self.stop);
                during()
            };
            let sent = sender.join().unwrap();
            (
                out,
                Received {
                    sent,
                    at_b: echoer.join().unwrap(),
                    echoed: echoes.join().unwrap(),
                },
            )
        })
    }
}

impl Received {
    fn lost(set: &BTreeSet<u32>, sent: u32) -> u32 {
        (1..=sent).filter(|s| !set.contains(s)).count() as u32
    }
}

#[test]
#[ignore = "needs root"]
fn an_upgrade_and_a_rollback_hand_the_node_over_losing_no_packet() {
    require_root();
    let old = palisade_e2e::image::ensure().unwrap_or_else(|e| panic!("{e:#}"));
    let new = palisade_e2e::image::ensure_next().unwrap_or_else(|e| panic!("{e:#}"));
    assert_ne!(old.reference, new.reference);
    let config = LabConfig {
        image: Some(ImageRun {
            image: old.reference.clone(),
            chart: default_chart(),
        }),
        // As in image_lab: the enforcer's 50m CPU share loads slowly
        // beside other labs; a kubelet keeps probing.
        start_timeout: Duration::from_secs(180),
        ..LabConfig::default()
    };
    let mut lab = lab_with_pods_in(config);
    lab.apply(&policies(POLICIES)).unwrap();
    lab.wait_realized().unwrap();
    let a = pod("x/a");
    let b = Target::parse("x/b").unwrap();
    let mut conn = lab.connect(&a, &b, 80, TIMEOUT).unwrap();
    assert_eq!(echo(&mut conn, TIMEOUT), Outcome::Echo);

    // A new version whose programs this node refuses (here: the enforcer
    // under the runtime's default seccomp profile, which allows bpf(2)
    // only with CAP_SYS_ADMIN) fails before the node lock, while the old
    // enforcer still has the node. Waiting on the lock instead, it would
    // have been Ready through the old one's socket, had the old pod
    // deleted, and then failed: a node without an enforcer.
    let old_id = lab.enforcer_id().map(str::to_string);
    let refused = lab.surge_enforcer_with(
        0,
        &new.reference,
        serde_json::json!({"enforcer": {"seccompProfile": "runtimeDefault"}}),
    );
    let err = match refused {
        Ok(_) => panic!(
            "a surge enforcer that cannot load its programs waits for the node lock\n{}",
            lab.log_tails(30)
        ),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("does not take it over") && err.contains("failed to create map"),
        "{err}"
    );
    // Nor was the surge pod ever Ready: its readiness probe needs the file
    // its enforcer writes once its programs load.
    let pod_run = lab
        .surge_volume(0, "pod-run")
        .expect("the surge pod's emptyDir");
    assert!(pod_run.is_dir());
    assert!(!pod_run.join("programs-loaded").exists());
    lab.abandon_surge(0).unwrap();
    assert_eq!(lab.answering_enforcer_id(), old_id);
    assert_eq!(echo(&mut conn, TIMEOUT), Outcome::Echo);

    for (round, (from, to)) in [(old, new), (new, old)].into_iter().enumerate() {
        let round = round + 2;
        let direction = if round == 2 { "upgrade" } else { "rollback" };
        assert_eq!(lab.enforcer_image(0).unwrap(), from.reference);
        let old_id = lab.enforcer_id().map(str::to_string);
        let pods = new_pods(round);
        let stream = Stream::open(&lab);
        let ((handover, pod_up), got) = stream.around(|| {
            let surge = lab
                .surge_enforcer(0, &to.reference)
                .unwrap_or_else(|e| panic!("{direction}: {e:#}\n{}", lab.log_tails(30)));
            let retiring = lab
                .retire_enforcer(surge)
                .unwrap_or_else(|e| panic!("{direction}: {e:#}\n{}", lab.log_tails(30)));
            // Pods started while no enforcer serves: their ADDs wait for
            // the new one.
            let started = Instant::now();
            lab.apply(&pods).unwrap_or_else(|e| {
                panic!(
                    "{direction}: pods during the handover: {e:#}\n{}",
                    lab.log_tails(30)
                )
            });
            let pod_up = started.elapsed();
            let handover = lab
                .finish_handover(retiring)
                .unwrap_or_else(|e| panic!("{direction}: {e:#}\n{}", lab.log_tails(30)));
            (handover, pod_up)
        });
        assert_eq!(lab.enforcer_image(0).unwrap(), to.reference);
        assert_ne!(
            lab.enforcer_id().map(str::to_string),
            old_id,
            "{direction}: a new enforcer"
        );
        assert_eq!(
            handover.old_exit_code,
            Some(0),
            "{direction}: the old enforcer stops cleanly on SIGTERM\n{}",
            lab.log_tails(30)
        );
        lab.wait_realized().unwrap();
        let lost_at_b = Received::lost(&got.at_b, got.sent);
        let lost_echoes = Received::lost(&got.echoed, got.sent);
        println!(
            "what=handover direction={direction} from={} to={} handover_ms={} old_exit_ms={} pod_up_ms={} datagrams_sent={} datagrams_lost={lost_at_b} echoes_lost={lost_echoes}",
            handover.from,
            handover.to,
            handover.took.as_millis(),
            handover.old_exited_after.as_millis(),
            pod_up.as_millis(),
            got.sent,
        );
        assert_eq!(lost_at_b, 0, "{direction}: datagrams lost on the way to b");
        assert_eq!(
            lost_echoes, 0,
            "{direction}: echoes (established replies) lost on the way to a"
        );
        assert_eq!(
            echo(&mut conn, TIMEOUT),
            Outcome::Echo,
            "{direction}: the TCP connection flows on\n{}",
            lab.log_tails(30)
        );
        let (b_new, d_new) = (format!("x/b{round}"), format!("x/d{round}"));
        let cases: Vec<Case> = vec![
            ("x/a", leak(&b_new), 80, Tcp, Allow),
            ("x/c", leak(&b_new), 80, Tcp, Deny),
            ("x/c", leak(&d_new), 80, Tcp, Allow),
            ("x/c", "x/b", 80, Tcp, Deny),
            ("x/c", "x/a", 80, Tcp, Deny),
            ("x/a", "x/b", 81, Tcp, Deny),
        ];
        assert_verdicts(&lab, &format!("after the {direction}"), &cases);
    }
    drop(conn);
    finish(lab);
}

/// A pod name for [`Case`]'s `&'static str` (a handful per test).
fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}
