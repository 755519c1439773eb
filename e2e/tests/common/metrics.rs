//! Scraping a lab process's Prometheus endpoint with a real HTTP client,
//! from inside the network namespace the process runs in.
#![allow(dead_code)] // not every test binary scrapes

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

pub use palisade_test_support::metrics::get;
use palisade_test_support::metrics::scrape_blocking;

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
            .run(|| scrape_blocking(addr))
            .expect("entering the process's namespace"),
        None => scrape_blocking(addr),
    }
}
