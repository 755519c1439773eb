//! The id of this enforcer process, as the controller and the dumps see it.
//!
//! The node name and the pid alone are not enough: in a container the
//! enforcer is PID 1 every time, so a restart or a rollout's new pod would
//! look like the old process reconnecting (and a report of the old one
//! like the new one's). A random part makes each process its own.

use std::hash::BuildHasher;

/// `<node>-<pid>-<8 hex digits, random per process>`.
pub fn enforcer_id(node: &str) -> String {
    format!("{node}-{}-{:08x}", std::process::id(), nonce() as u32)
}

/// 64 random bits: std's hasher keys are seeded from the OS's randomness.
fn nonce() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_node_and_the_pid_and_differs_per_process() {
        let id = enforcer_id("node-1");
        let pid = std::process::id().to_string();
        let (head, random) = id.rsplit_once('-').unwrap();
        assert_eq!(head, format!("node-1-{pid}"));
        assert_eq!(random.len(), 8);
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        // The random part is drawn per call (std seeds its hasher keys
        // from the OS once per thread, then steps them per RandomState).
        assert_ne!(enforcer_id("node-1"), enforcer_id("node-1"));
    }
}
