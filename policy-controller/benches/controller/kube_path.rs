//! A change through the kube source's path: the cluster served by the API
//! double over HTTP, the real kube-rs watchers, the feed and the hub. Times
//! the first sync (lists, staging, full computation) and single pod
//! relabels from the API server's write to the node's new plan.

#[allow(dead_code)]
#[path = "../../tests/api_double/mod.rs"]
mod api_double;

use std::time::{Duration, Instant};

use policy_controller::cluster::Object;
use policy_controller::feed;
use policy_controller::hub::Hub;
use policy_controller::source::kube as kube_source;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::shapes::{self, Scale, Shape};
use crate::{line, peak_mb};

const DEADLINE: Duration = Duration::from_secs(300);

fn value(object: Object) -> Value {
    let v = match object {
        Object::Namespace(o) => serde_json::to_value(o),
        Object::Pod(o) => serde_json::to_value(o),
        Object::NetworkPolicy(o) => serde_json::to_value(o),
        Object::Service(o) => serde_json::to_value(o),
        Object::EndpointSlice(o) => serde_json::to_value(o),
        Object::Node(o) => serde_json::to_value(o),
        Object::ClusterNetworkPolicy(p) => panic!(
            "{}: the shapes write no ClusterNetworkPolicy through the kube path",
            p.id()
        ),
    };
    v.expect("objects serialize")
}

pub fn run(shape: Shape, scale: Scale) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(measure(shape, scale));
}

async fn measure(shape: Shape, scale: Scale) {
    let double = api_double::ApiDouble::start().await;
    for i in 0..scale.namespaces {
        for object in shapes::namespace_objects(shape, scale, i, true) {
            double.apply(value(object));
        }
    }
    let client = kube::Client::try_from(kube::Config::new(double.url.parse().unwrap())).unwrap();
    let hub = Hub::new(1);
    let (tx, rx) = mpsc::unbounded_channel();
    let (etx, erx) = watch::channel(Vec::new());
    let start = Instant::now();
    let source = tokio::spawn(kube_source::run(client, tx, etx));
    tokio::spawn(feed::run_changes(hub.clone(), rx, erx));
    while !hub.view().source_synced {
        assert!(start.elapsed() < DEADLINE, "the kube source did not sync");
        tokio::time::sleep(Duration::from_millis(5)).await; // poll: the hub has no sync signal
    }
    line(
        scale.name,
        shape,
        "kube_sync",
        &[
            ("ms", format!("{:.0}", start.elapsed().as_secs_f64() * 1e3)),
            ("peak_mb", format!("{:.0}", peak_mb())),
        ],
    );

    let mut times = Vec::new();
    for rep in 0..5 {
        let i = (rep * 7919 + 17) % scale.namespaces;
        let pod = shapes::pod(
            shape,
            i,
            0,
            i * 4,
            scale.nodes,
            shapes::default_app(shape, 2),
        );
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("the shape places every pod");
        let mut sub = hub.subscribe(&node).expect("synced");
        sub.rx.borrow_and_update();
        let start = Instant::now();
        double.apply(value(Object::Pod(pod)));
        tokio::time::timeout(DEADLINE, sub.rx.changed())
            .await
            .expect("the relabel reached the node's plan")
            .expect("the hub is open");
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let counters = hub.counters();
    line(
        scale.name,
        shape,
        "kube_change",
        &[
            ("ms", format!("{:.3}", shapes::median(times))),
            ("peak_mb", format!("{:.0}", peak_mb())),
            ("views", counters.views.to_string()),
            ("changes", counters.changes.to_string()),
        ],
    );
    source.abort();
}
