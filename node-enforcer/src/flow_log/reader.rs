//! Reads `pal_flow_events` as the kernel signals new records (epoll on the
//! ring buffer's fd through tokio's AsyncFd), annotates them and hands the
//! lines to the writer, which never blocks the reader.

use std::path::Path;
use std::time::Instant;

use aya::maps::{Map, MapData, RingBuf};
use palisade_ebpf::{FlowEvent, MAP_FLOW_EVENTS};
use tokio::io::unix::AsyncFd;

use super::annotate::annotate;
use super::counters;
use super::knowledge::Source;
use super::writer::Lines;

/// Most events annotated per refresh of what the enforcer knows.
const BATCH: usize = 4096;

pub type Ring = AsyncFd<RingBuf<MapData>>;

pub fn open(pin_root: &Path) -> Result<Ring, super::FlowLogError> {
    let path = super::pin(pin_root, MAP_FLOW_EVENTS);
    let what = super::FlowLogError::map("flow events ", &path);
    let data = MapData::from_pin(&path).map_err(&what)?;
    let map = Map::from_map_data(data).map_err(&what)?;
    let ring = RingBuf::try_from(map).map_err(&what)?;
    // SAFETY: the RingBuf owns its map fd and keeps it open, unreplaced,
    // for as long as the AsyncFd holds it. Its io::Error is carried as
    // aya's MapError::IoError, whose text is the io::Error's.
    unsafe { AsyncFd::register(ring) }.map_err(|e| what(aya::maps::MapError::IoError(e.into())))
}

/// A record as the datapath wrote it; None for a record of another size
/// (another version's datapath).
pub fn parse(record: &[u8]) -> Option<FlowEvent> {
    if record.len() != std::mem::size_of::<FlowEvent>() {
        return None;
    }
    // SAFETY: FlowEvent is repr(C) of integers and byte arrays (every bit
    // pattern valid), the length matches, read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<FlowEvent>()) })
}

/// Takes up to BATCH records; true when the buffer was left empty.
fn take(ring: &mut RingBuf<MapData>, batch: &mut Vec<FlowEvent>) -> bool {
    while batch.len() < BATCH {
        let Some(record) = ring.next() else {
            return true;
        };
        match parse(&record) {
            Some(e) => batch.push(e),
            None => counters::add(&counters::MALFORMED, 1),
        }
    }
    false
}

pub async fn run(mut ring: Ring, mut source: Source, lines: Lines) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let mut guard = match ring.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::error!("flow log: waiting for events: {e}; flow logging stops");
                return;
            }
        };
        // Readiness is cleared only once the buffer is empty: the kernel
        // signals a new record only when the reader has caught up.
        if take(guard.get_inner_mut(), &mut batch) {
            guard.clear_ready();
        }
        drop(guard);
        if batch.is_empty() {
            continue;
        }
        let now = Instant::now();
        if source.wants_refresh(batch.iter().map(|e| e.ifindex), now) {
            source.refresh().await;
        } else if let Some(wait) = source.names_wait(&batch, now) {
            // At most NAMES_MIN_REFRESH: a learned allow's line waits for
            // the name that allowed it.
            tokio::time::sleep(wait).await;
            source.refresh_names().await;
        }
        let offset = super::rfc3339::realtime_offset_ns();
        for e in batch.drain(..) {
            lines.send(annotate(&e, source.knowledge(), offset).to_line());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_the_wrong_size_are_refused() {
        let e = FlowEvent {
            ts_ns: 42,
            ifindex: 7,
            kind: 1,
            ..Default::default()
        };
        // SAFETY: viewing a plain repr(C) value as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const FlowEvent).cast::<u8>(),
                std::mem::size_of::<FlowEvent>(),
            )
        };
        assert_eq!(parse(bytes), Some(e));
        assert_eq!(parse(&bytes[..40]), None);
        let mut longer = bytes.to_vec();
        longer.extend([0; 8]);
        assert_eq!(parse(&longer), None);
    }
}
