//! What Palisade learns from a DNS answer (egress by domain name), as pure
//! logic with no I/O, so that every rule of it is tested here, fast:
//!
//! - [`name`]: DNS names as policies match them, label by label.
//! - [`pattern`]: a policy's `domainNames` entry (exact, or `*.` for every
//!   subdomain), its grammar, and whether a name matches it.
//! - [`wire`]: reading a DNS message (RFC 1035), refusing what is malformed
//!   with the byte offset it failed at; [`wire::Message::encode`] writes one
//!   (the lab's server, forged answers in tests, benchmarks).
//! - [`answer`]: which addresses an answer gives its question, following a
//!   CNAME chain within the answer, with the TTL each may be trusted for.
//! - [`pending`]: the queries each pod sent and no answer has matched yet;
//!   an answer teaches only when it matches one (id, ports, name, type).
//! - [`learned`]: the addresses each pod may reach by name, per domain rule,
//!   until their TTL; capped per pod and per name, evictions counted.
//! - [`limits`]: those caps and TTL bounds, with their defaults.
//!
//! Time is a `u64` of nanoseconds on a clock the caller chooses (the
//! enforcer uses the one the datapath reads, `CLOCK_BOOTTIME`), so the
//! expiries written here are the ones the kernel compares against.

pub mod answer;
pub mod learned;
pub mod limits;
pub mod name;
pub mod pattern;
pub mod pending;
pub mod wire;

pub use answer::{resolve, Resolution, Unlearnable};
pub use learned::{Learned, Learning};
pub use limits::Limits;
pub use name::Name;
pub use pattern::Pattern;
pub use pending::{Pending, QueryKey};
pub use wire::{Message, WireError};

/// Nanoseconds in one second, for TTLs (seconds) against the clock (ns).
pub const NS_PER_S: u64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    /// A deterministic generator (splitmix64) for the fuzz and property
    /// tests: any seed, the same sequence on every machine.
    pub struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform enough below `n` (0 when `n` is 0).
        pub fn below(&mut self, n: u64) -> u64 {
            if n == 0 {
                0
            } else {
                self.next() % n
            }
        }
    }
}
