//! Prometheus metrics of the controller, served on `--metrics-addr` at
//! `/metrics` in the text exposition format (version 0.0.4). Values are
//! read from the hub at scrape time; only the resolution histogram is
//! accumulated as resolutions happen.

pub mod controller;
