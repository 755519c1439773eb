//! Scraping a lab process's Prometheus endpoint with a real HTTP client,
//! from inside the network namespace the process runs in.
#![allow(dead_code)] // not every test binary scrapes

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

const DEADLINE: Duration = Duration::from_secs(30);

/// The last address a process logged for its metrics server (a restarted
/// process appends to the same log).
pub fn metrics_addr(log: &Path) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text.lines().rev().find_map(|line| {
            // Colour codes may surround the field name.
            let clean: String = line
                .split('\x1b')
                .map(|part| part.split_once('m').map_or(part, |(_, rest)| rest))
                .collect();
            let rest = clean.split("metrics_addr=").nth(1)?;
            rest.split_whitespace().next().map(str::to_string)
        });
        if let Some(addr) = found {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address in {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50)); // poll: the log is written by the process
    }
}

/// One scrape, parsed, from inside `ns` (the lab runs each enforcer in its
/// node's network namespace and the controller in the fabric's; None: this
/// process's own).
pub fn scrape(ns: Option<&str>, addr: &str) -> BTreeMap<String, f64> {
    match ns {
        Some(ns) => palisade_e2e::netns::NetNs::from_existing(ns)
            .run(|| scrape_here(addr))
            .expect("entering the process's namespace"),
        None => scrape_here(addr),
    }
}

fn scrape_here(addr: &str) -> BTreeMap<String, f64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let text = rt.block_on(async {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::get("/metrics")
            .header("host", addr)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    });
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            let v = if v == "+Inf" {
                f64::INFINITY
            } else {
                v.parse().unwrap()
            };
            (k.to_string(), v)
        })
        .collect()
}

/// One sample of a scrape; a missing one fails with what was scraped.
pub fn get(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("{key} not scraped: {m:#?}"))
}
