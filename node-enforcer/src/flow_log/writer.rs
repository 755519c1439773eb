//! The flow log's output: a task that writes lines from a bounded queue.
//! The reader only ever tries to queue a line; when the output is slower
//! than the events (a blocked stdout pipe, a slow disk) the line is dropped
//! and counted, and the datapath and reader carry on.

use std::sync::atomic::AtomicU64;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use super::counters;

/// Lines queued for the writer at most: a few seconds at the default rate.
pub const QUEUE: usize = 8192;

pub type Output = Box<dyn AsyncWrite + Unpin + Send>;

/// `-`: stdout (the enforcer's own logs go to stderr); else the file,
/// created 0600 if missing (its lines name pods, addresses and policies)
/// and appended to; an existing file readable by others is tightened.
pub async fn open(path: &str) -> Result<Output, super::FlowLogError> {
    if path == "-" {
        return Ok(Box::new(tokio::io::stdout()));
    }
    let failed = |source| super::FlowLogError::Output {
        path: path.to_string(),
        source,
    };
    let file = crate::private::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(failed)?;
    let had = crate::private::tighten_file(std::path::Path::new(path)).map_err(failed)?;
    crate::private::log_tightened("the flow log", std::path::Path::new(path), had);
    Ok(Box::new(tokio::fs::File::from_std(file)))
}

#[derive(Clone)]
pub struct Lines {
    tx: mpsc::Sender<String>,
    dropped: &'static AtomicU64,
}

impl Lines {
    /// Queues a line, or drops and counts it when the queue is full.
    pub fn send(&self, line: String) {
        if self.tx.try_send(line).is_err() {
            counters::add(self.dropped, 1);
        }
    }
}

pub fn spawn(output: Output, queue: usize) -> Lines {
    spawn_counting(
        output,
        queue,
        &counters::LINES_WRITTEN,
        &counters::WRITE_DROPPED,
    )
}

/// The same with counters of the caller's (tests count on their own).
pub fn spawn_counting(
    output: Output,
    queue: usize,
    written: &'static AtomicU64,
    dropped: &'static AtomicU64,
) -> Lines {
    let (tx, rx) = mpsc::channel(queue);
    tokio::spawn(write(output, rx, written, dropped));
    Lines { tx, dropped }
}

async fn write(
    output: Output,
    mut rx: mpsc::Receiver<String>,
    written: &'static AtomicU64,
    dropped: &'static AtomicU64,
) {
    let mut out = BufWriter::new(output);
    let mut failing = false;
    while let Some(line) = rx.recv().await {
        let mut pending = vec![line];
        // Whatever else is queued goes in the same flush.
        while pending.len() < 1024 {
            match rx.try_recv() {
                Ok(l) => pending.push(l),
                Err(_) => break,
            }
        }
        let n = pending.len() as u64;
        let mut result = Ok(());
        for l in &pending {
            result = out.write_all(l.as_bytes()).await;
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = out.flush().await;
        }
        match result {
            Ok(()) => {
                counters::add(written, n);
                if failing {
                    tracing::info!("flow log: writing again");
                    failing = false;
                }
            }
            Err(e) => {
                counters::add(dropped, n);
                if !failing {
                    tracing::warn!("flow log: writing lines failed: {e}; dropping them (counted)");
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn lines_are_written_in_order() {
        static WRITTEN: AtomicU64 = AtomicU64::new(0);
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let (near, mut far) = tokio::io::duplex(1 << 16);
        let lines = spawn_counting(Box::new(near), 16, &WRITTEN, &DROPPED);
        for i in 0..10 {
            lines.send(format!("{i}\n"));
        }
        drop(lines);
        let mut text = String::new();
        far.read_to_string(&mut text).await.unwrap();
        assert_eq!(text, "0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n");
        assert_eq!(WRITTEN.load(Ordering::Relaxed), 10);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_stuck_output_drops_and_counts_lines_without_blocking_the_sender() {
        static WRITTEN: AtomicU64 = AtomicU64::new(0);
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        // Nobody reads `_far`: the writer blocks once 64 bytes are in it.
        let (near, _far) = tokio::io::duplex(64);
        let lines = spawn_counting(Box::new(near), 8, &WRITTEN, &DROPPED);
        let started = std::time::Instant::now();
        for i in 0..1000 {
            lines.send(format!("line {i:04} of a flow log that nobody reads\n"));
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "send never waits"
        );
        let dropped = DROPPED.load(Ordering::Relaxed);
        // The queue holds 8 and the writer took at most one batch.
        assert!(dropped > 900, "{dropped} of 1000 dropped");
        assert_eq!(WRITTEN.load(Ordering::Relaxed), 0, "nothing got through");
    }
}
