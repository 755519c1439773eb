//! A node's plan-stream connection over time, for the debug service: when
//! its current connection began, when it last connected or disconnected,
//! and how often it came back. An operator tells a flapping enforcer from
//! one that has been steady for days by these, not by `connected` alone.
//!
//! Pure bookkeeping: the hub calls it on the node's first subscriber
//! arriving and its last one leaving, with the time it happened.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionHistory {
    /// When the current connection began; None while disconnected.
    pub connected_since: Option<SystemTime>,
    /// When the node last connected or disconnected; None before its first
    /// connection.
    pub changed_at: Option<SystemTime>,
    /// Connections after the node's first one.
    pub reconnects: u64,
}

impl ConnectionHistory {
    /// The node's first stream opened (it had none).
    pub fn connected(&mut self, at: SystemTime) {
        if self.changed_at.is_some() {
            self.reconnects += 1;
        }
        self.connected_since = Some(at);
        self.changed_at = Some(at);
    }

    /// The node's last stream ended.
    pub fn disconnected(&mut self, at: SystemTime) {
        self.connected_since = None;
        self.changed_at = Some(at);
    }

    /// How long the current connection has lasted at `now`; None while
    /// disconnected. A clock stepped back reads as zero, not as an error.
    pub fn connected_for(&self, now: SystemTime) -> Option<Duration> {
        self.connected_since
            .map(|since| now.duration_since(since).unwrap_or_default())
    }
}

/// Unix milliseconds of `t`, 0 for None (proto3's "unset").
pub fn unix_ms(t: Option<SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_first_connection_is_not_a_reconnect() {
        let mut h = ConnectionHistory::default();
        assert_eq!(h.connected_for(at(5)), None);
        assert_eq!(unix_ms(h.changed_at), 0, "never connected");
        h.connected(at(1_000));
        assert_eq!(h.reconnects, 0);
        assert_eq!(unix_ms(h.connected_since), 1_000);
        assert_eq!(
            h.connected_for(at(4_500)),
            Some(Duration::from_millis(3_500))
        );
    }

    #[test]
    fn each_return_after_a_disconnect_counts_once() {
        let mut h = ConnectionHistory::default();
        h.connected(at(1_000));
        h.disconnected(at(2_000));
        assert_eq!((h.connected_since, unix_ms(h.changed_at)), (None, 2_000));
        assert_eq!(h.connected_for(at(3_000)), None);
        h.connected(at(3_000));
        h.disconnected(at(4_000));
        h.connected(at(5_000));
        assert_eq!(h.reconnects, 2);
        assert_eq!(unix_ms(h.connected_since), 5_000);
        assert_eq!(unix_ms(h.changed_at), 5_000);
    }

    #[test]
    fn a_clock_stepped_back_reads_as_just_connected() {
        let mut h = ConnectionHistory::default();
        h.connected(at(10_000));
        assert_eq!(h.connected_for(at(9_000)), Some(Duration::ZERO));
    }
}
