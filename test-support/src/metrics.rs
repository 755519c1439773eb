//! Scraping a process's Prometheus endpoint as Prometheus does, for the
//! tests of every process that serves one: one HTTP GET of `/metrics`, and a
//! parse that fails the test on anything Prometheus would refuse.

use std::collections::{BTreeMap, BTreeSet};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Samples of one scrape: `name{labels}` -> value.
pub type Samples = BTreeMap<String, f64>;

/// The content type of the text exposition format the servers announce.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One scrape of `http://{addr}/metrics`, parsed by [`parse`].
pub async fn scrape(addr: &str) -> Samples {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to the metrics server at {addr}: {e}"));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap_or_else(|e| panic!("HTTP handshake with {addr}: {e}"));
    tokio::spawn(conn);
    let req = hyper::Request::get("/metrics")
        .header("host", addr)
        .body(Empty::<Bytes>::new())
        .expect("a GET of /metrics is a valid request");
    let resp = sender
        .send_request(req)
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}/metrics: {e}"));
    assert_eq!(resp.status(), 200, "GET http://{addr}/metrics");
    assert_eq!(
        resp.headers()["content-type"],
        CONTENT_TYPE,
        "GET http://{addr}/metrics"
    );
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| panic!("reading http://{addr}/metrics: {e}"))
        .to_bytes();
    parse(std::str::from_utf8(&body).expect("the exposition is UTF-8"))
}

/// [`scrape`] from a thread without a runtime (the lab's tests scrape from
/// inside a network namespace, on a thread of their own).
pub fn scrape_blocking(addr: &str) -> Samples {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(scrape(addr))
}

/// Parses the text exposition format, failing on any line that is neither
/// a `# HELP`/`# TYPE` comment nor a sample, on a family typed twice, on a
/// sample before its family's `# TYPE`, and on a sample given twice.
pub fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    let mut typed = BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .unwrap_or_else(|| panic!("TYPE without a kind: {line:?}"));
            assert!(
                ["gauge", "counter", "histogram"].contains(&kind),
                "unknown kind: {line:?}"
            );
            assert!(typed.insert(name.to_string()), "family {name} typed twice");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line:?}"));
        let family = key.split('{').next().unwrap_or(key);
        let base = family
            .strip_suffix("_bucket")
            .or_else(|| family.strip_suffix("_sum"))
            .or_else(|| family.strip_suffix("_count"))
            .filter(|b| typed.contains(*b))
            .unwrap_or(family);
        assert!(typed.contains(base), "sample before its TYPE: {line:?}");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {line:?}")),
        };
        assert!(
            samples.insert(key.to_string(), value).is_none(),
            "sample {key} twice"
        );
    }
    samples
}

/// One sample of a scrape; a missing one fails with what was scraped.
#[track_caller]
pub fn get(m: &Samples, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("{key} not scraped: {m:#?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_histograms_parse() {
        let m = parse(
            "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n\
             # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n",
        );
        assert_eq!(get(&m, "a_total{x=\"1\"}"), 3.0);
        assert_eq!(get(&m, "h_bucket{le=\"+Inf\"}"), 2.0);
        assert_eq!(get(&m, "h_count"), 2.0);
        assert_eq!(m.len(), 4);
    }

    #[test]
    #[should_panic(expected = "sample before its TYPE")]
    fn a_sample_without_its_type_fails() {
        parse("a 1\n");
    }

    #[test]
    #[should_panic(expected = "sample a twice")]
    fn a_sample_twice_fails() {
        parse("# TYPE a gauge\na 1\na 2\n");
    }

    #[test]
    #[should_panic(expected = "typed twice")]
    fn a_family_typed_twice_fails() {
        parse("# TYPE a gauge\n# TYPE a gauge\n");
    }

    #[test]
    #[should_panic(expected = "not a number")]
    fn a_value_that_is_not_a_number_fails() {
        parse("# TYPE a gauge\na one\n");
    }
}
