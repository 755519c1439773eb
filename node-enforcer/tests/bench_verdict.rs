//! The verdict benchmark's pure parts (what it measures, and how samples
//! become medians, ratios and targets): their unit tests, run with the
//! crate's tests. The benchmark itself (`benches/verdict`) needs root and
//! runs by `cargo bench` only.

// What only the benchmark's kernel side uses.
#![allow(dead_code)]

#[path = "../benches/verdict/report.rs"]
mod report;
#[path = "../benches/verdict/scenario.rs"]
mod scenario;
