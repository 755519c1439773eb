//! eBPF conntrack cleanup against the kernel's conntrack (DESIGN invariant
//! 7; the AWS agent's seed 001).
//!
//! An eBPF entry records a flow as one hook of one pod saw it. Through a
//! Service, the kernel's entry holds the VIP in its original tuple and the
//! backend in its reply tuple, so the client's hook saw the original tuple
//! and the backend's hook saw the reply tuple reversed. An eBPF entry is
//! therefore explained by a kernel entry when its tuple equals the original
//! tuple or the reverse of the reply tuple (and, for symmetry, the reply
//! tuple or the reverse of the original). It is stale only when nothing
//! explains it AND it was not seen since the cleanup began: a 5-tuple reused
//! while the kernel table was being read must survive.
//!
//! `lookup` asks the kernel about single flows (a kfunc, per idle entry;
//! `btf` finds the kfunc);
//! `kernel` reads its whole table (netlink dump); `stale` is the pure rule;
//! `batch` reads and deletes eBPF map entries in bulk; `listing` keeps the
//! bounded list of entries the debug dump shows; `sweep` runs a pass;
//! `share` keeps each endpoint hook's count of its entries right.

pub mod batch;
pub mod btf;
pub mod digest_set;
pub mod kernel;
pub mod listing;
pub mod lookup;
pub mod share;
pub mod sweep;

use digest_set::DigestSet;

/// Why the conntrack maps could not be opened, or a cleanup pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// A pinned map could not be opened as the map it should be.
    #[error("{}: {source}", path.display())]
    Pin {
        path: std::path::PathBuf,
        #[source]
        source: aya::maps::MapError,
    },
    /// An endpoint map could not be memory-mapped.
    #[error("memory-mapping {map}: {source}")]
    Mmap {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Writing one entry (tests, benchmarks).
    #[error("writing a conntrack entry: {0}")]
    Write(#[source] aya::maps::MapError),
    /// Reading or deleting the eBPF maps' entries.
    #[error(transparent)]
    Batch(#[from] batch::BatchError),
    /// Reading the kernel's table.
    #[error(transparent)]
    Kernel(#[from] kernel::NetlinkError),
    /// Asking the kernel about single flows.
    #[error(transparent)]
    Lookup(#[from] lookup::LookupError),
}

impl ConntrackError {
    fn pin(path: &std::path::Path) -> impl Fn(aya::maps::MapError) -> Self + '_ {
        move |source| ConntrackError::Pin {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A flow's 5-tuple; addresses IPv6 or IPv4-mapped, ports host order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

impl Tuple {
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

/// Hashes of every tuple the kernel's entries explain. Only 8 bytes per
/// tuple are kept: a collision can only keep a stale entry (until the next
/// cleanup), never remove a live one.
#[derive(Default)]
pub struct Explained {
    seen: DigestSet,
}

/// Multiply-rotate mixing of the tuple's words (no per-process randomness:
/// the set never leaves the process).
struct Mix(u64);

impl Mix {
    fn word(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// One hash for a flow in either direction: the tuple's two ends are put
/// in a fixed order first, so `t` and `t.reversed()` hash alike and one
/// probe answers for both. Mixes the tuple's words directly (no `Hash`
/// plumbing): this runs twice per flow at a million flows.
fn digest(t: &Tuple) -> u64 {
    let (a, b) = if (t.src, t.sport) <= (t.dst, t.dport) {
        ((t.src, t.sport), (t.dst, t.dport))
    } else {
        ((t.dst, t.dport), (t.src, t.sport))
    };
    let word = |addr: [u8; 16], half: usize| {
        u64::from_le_bytes(addr[half * 8..half * 8 + 8].try_into().expect("8 bytes"))
    };
    let mut h = Mix(0x9e37_79b9_7f4a_7c15);
    h.word(word(a.0, 0));
    h.word(word(a.0, 1));
    h.word(word(b.0, 0));
    h.word(word(b.0, 1));
    h.word(u64::from(a.1) | u64::from(b.1) << 16 | u64::from(t.proto) << 32);
    // Finalise so that nearby tuples spread over the table.
    let mut x = h.0;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 33)
}

impl Explained {
    /// Room for `n` kernel entries without a rehash (each takes one slot,
    /// two when NAT makes its directions differ).
    pub fn with_capacity(n: usize) -> Self {
        Explained {
            seen: DigestSet::with_capacity(n),
        }
    }

    /// Collects a kernel table entry by entry (see [`Collecting`]); `n`
    /// is how many entries to expect.
    pub fn collect(n: usize) -> Collecting {
        Collecting {
            digests: Vec::with_capacity(n),
        }
    }

    /// Records one kernel entry: its original tuple and its reply tuple
    /// reversed (the same flow unless NAT rewrote it), each in both
    /// directions.
    pub fn add(&mut self, original: &Tuple, reply: &Tuple) {
        self.seen.insert_all(&digests_of(original, reply));
    }

    /// Does a kernel entry explain `t`, recorded in either direction?
    pub fn explains(&self, t: &Tuple) -> bool {
        self.seen.contains(digest(t))
    }

    /// [`Self::explains`] for each of `tuples`, in order, into `out`
    /// (cleared first): one pass that overlaps the memory misses.
    pub fn explains_each(&self, tuples: &[Tuple], out: &mut Vec<bool>) {
        let digests: Vec<u64> = tuples.iter().map(digest).collect();
        out.clear();
        self.seen.contains_each(&digests, out);
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// The digests one kernel entry contributes (the same one twice when no
/// NAT rewrote it; a second insert is a no-op).
fn digests_of(original: &Tuple, reply: &Tuple) -> [u64; 2] {
    [digest(original), digest(reply)]
}

/// An [`Explained`] being filled from the kernel's table. Entries arrive
/// one at a time while the kernel walks its own table, which evicts ours
/// from the cache between two entries; so the digests are only written
/// down in order here, and [`Collecting::done`] inserts them in one pass
/// whose cache misses overlap (less than half the cost at a million entries,
/// for 8 bytes per kernel entry until then).
pub struct Collecting {
    digests: Vec<u64>,
}

impl Collecting {
    /// As [`Explained::add`].
    pub fn add(&mut self, original: &Tuple, reply: &Tuple) {
        let [orig, rev] = digests_of(original, reply);
        self.digests.push(orig);
        if rev != orig {
            self.digests.push(rev);
        }
    }

    pub fn done(self) -> Explained {
        let mut set = Explained::with_capacity(self.digests.len());
        set.seen.insert_all(&self.digests);
        set
    }
}

/// Is an eBPF entry stale? `last_seen` and `started` are CLOCK_MONOTONIC
/// nanoseconds (what bpf_ktime_get_ns returns); `started` is taken before
/// the kernel's table is read.
pub fn stale(t: &Tuple, last_seen: u64, started: u64, explained: &Explained) -> bool {
    idle_and_unexplained(last_seen, started, explained.explains(t))
}

/// The same rule once the kernel's answer for the tuple is known (the
/// sweep asks for a whole chunk at once).
pub fn idle_and_unexplained(last_seen: u64, started: u64, explained: bool) -> bool {
    last_seen < started && !explained
}

/// CLOCK_MONOTONIC now, in nanoseconds, as the eBPF programs see it.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_pin_is_named_with_aya_s_error_as_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let asking = sweep::Asking::Dump { why: "test".into() };
        let e = sweep::open(dir.path(), asking)
            .err()
            .expect("nothing pinned");
        let ConntrackError::Pin { path, source } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(path, &dir.path().join(palisade_ebpf::MAP_CT4));
        assert_eq!(e.to_string(), format!("{}: {source}", path.display()));
        let batch = ConntrackError::from(batch::BatchError {
            what: "reading a conntrack map",
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        assert_eq!(
            batch.to_string(),
            format!(
                "reading a conntrack map: {}",
                std::io::Error::from_raw_os_error(libc::EPERM)
            )
        );
    }

    /// An IPv4 address as the maps hold it (IPv4-mapped).
    pub(crate) fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut o = [0u8; 16];
        o[10] = 0xff;
        o[11] = 0xff;
        o[12..].copy_from_slice(&a);
        o
    }

    fn t(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Tuple {
        Tuple {
            src: v4(src),
            dst: v4(dst),
            sport,
            dport,
            proto: 6,
        }
    }

    /// Seed 001: client and backend on one node, through a ClusterIP.
    #[test]
    fn a_flow_through_a_service_is_explained_on_both_pods() {
        let (client, vip, backend) = ([192, 168, 17, 118], [10, 100, 58, 78], [192, 168, 7, 235]);
        let mut k = Explained::default();
        k.add(&t(client, 57292, vip, 80), &t(backend, 8080, client, 57292));
        // The client's egress hook saw the VIP; the backend's ingress hook
        // saw the backend after DNAT.
        assert!(!stale(&t(client, 57292, vip, 80), 0, 10, &k));
        assert!(!stale(&t(client, 57292, backend, 8080), 0, 10, &k));
        // A flow the kernel no longer has is stale...
        assert!(stale(&t(client, 57293, backend, 8080), 0, 10, &k));
        // ...unless it was seen since the cleanup began (a reused tuple).
        assert!(!stale(&t(client, 57293, backend, 8080), 10, 10, &k));
    }

    /// The bulk paths the sweep uses answer as the single ones do.
    #[test]
    fn collected_in_bulk_explains_the_same_flows() {
        let flow = |i: u32| {
            t(
                [10, 0, (i >> 8) as u8, i as u8],
                1000 + i as u16,
                [10, 1, 0, 1],
                80,
            )
        };
        let mut one = Explained::default();
        let mut bulk = Explained::collect(0);
        for i in 0..1000u32 {
            // Every third flow through a VIP: its reply names the backend.
            let reply = if i % 3 == 0 {
                t(
                    [10, 2, 0, 9],
                    8080,
                    [10, 0, (i >> 8) as u8, i as u8],
                    1000 + i as u16,
                )
            } else {
                flow(i).reversed()
            };
            one.add(&flow(i), &reply);
            bulk.add(&flow(i), &reply);
        }
        let bulk = bulk.done();
        assert_eq!(bulk.len(), one.len());
        let asked: Vec<Tuple> = (0..2000u32)
            .flat_map(|i| [flow(i), flow(i).reversed()])
            .collect();
        let mut got = Vec::new();
        bulk.explains_each(&asked, &mut got);
        let want: Vec<bool> = asked.iter().map(|x| one.explains(x)).collect();
        assert_eq!(got, want);
        assert_eq!(got.iter().filter(|&&b| b).count(), 2000);
    }

    #[test]
    fn snat_is_explained_too() {
        let (pod, ext, node) = ([10, 244, 0, 5], [1, 1, 1, 1], [172, 18, 0, 2]);
        let mut k = Explained::default();
        k.add(&t(pod, 4000, ext, 443), &t(ext, 443, node, 61000));
        assert!(!stale(&t(pod, 4000, ext, 443), 0, 1, &k));
        // Recorded the other way round (a reply-direction entry).
        assert!(!stale(&t(ext, 443, pod, 4000), 0, 1, &k));
    }
}
