//! A bounded view of the eBPF conntrack entries for the debug dump: the
//! first [`LISTED`] in a stable order (interface, hook, tuple), so the
//! same flows show from one cleanup to the next, whatever the hash order.
//! Pure: fed one entry at a time by the sweep.

use std::collections::BinaryHeap;

use palisade_ebpf::{CtKey, CtValue, HOOK_FROM_POD};

use super::Tuple;

/// Most entries one dump lists.
pub const LISTED: usize = 256;

/// One eBPF conntrack entry as a cleanup found it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryView {
    /// Host veth whose hook allowed the flow.
    pub ifindex: u32,
    /// Which hook: `from_pod` (the pod's egress policy) or `to_pod` (its
    /// ingress policy).
    pub hook: &'static str,
    /// The flow as that hook saw it (IPv6 or IPv4-mapped addresses, ports
    /// in host order).
    pub tuple: Tuple,
    /// The hook's epoch when policy last allowed the flow.
    pub epoch: u32,
    /// How long before the cleanup began its last packet was seen, in
    /// milliseconds (0: seen since).
    pub idle_ms: u64,
    /// Removed by this cleanup (nothing explains it, unused since it began).
    pub removed: bool,
}

/// One line per entry, as the debug dump prints it:
/// `ifindex=7 hook=from_pod proto=6 10.0.0.2:40000 -> 10.0.1.5:80 epoch=3 idle_ms=1200`
/// (plus ` removed` when this cleanup removed it).
impl std::fmt::Display for EntryView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ip = |a: [u8; 16]| palisade_ebpf::unmapped_addr(a);
        let ep = |a: [u8; 16], port: u16| match ip(a) {
            std::net::IpAddr::V4(v4) => format!("{v4}:{port}"),
            std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        };
        write!(
            f,
            "ifindex={} hook={} proto={} {} -> {} epoch={} idle_ms={}{}",
            self.ifindex,
            self.hook,
            self.tuple.proto,
            ep(self.tuple.src, self.tuple.sport),
            ep(self.tuple.dst, self.tuple.dport),
            self.epoch,
            self.idle_ms,
            if self.removed { " removed" } else { "" }
        )
    }
}

pub fn hook_name(hook: u8) -> &'static str {
    if hook == HOOK_FROM_POD {
        "from_pod"
    } else {
        "to_pod"
    }
}

/// The order entries are listed in.
type Rank = (u32, u8, Tuple);

fn rank(k: &CtKey, t: Tuple) -> Rank {
    (k.ifindex, k.hook, t)
}

/// Keeps the [`LISTED`] lowest-ranked entries offered.
#[derive(Default)]
pub struct Listing {
    /// Max-heap on rank: the top is the first to give way.
    kept: BinaryHeap<(Rank, EntryView)>,
}

impl Listing {
    /// `tuple` is `k`'s (`super::sweep::tuple_of`), which the caller has.
    pub fn offer(&mut self, k: &CtKey, tuple: Tuple, v: &CtValue, started_ns: u64, removed: bool) {
        let r = rank(k, tuple);
        if self.kept.len() >= LISTED {
            match self.kept.peek() {
                Some((top, _)) if r < *top => {
                    self.kept.pop();
                }
                _ => return,
            }
        }
        self.kept.push((
            r,
            EntryView {
                ifindex: k.ifindex,
                hook: hook_name(k.hook),
                tuple,
                epoch: v.epoch,
                idle_ms: started_ns.saturating_sub(v.last_seen_ns) / 1_000_000,
                removed,
            },
        ));
    }

    pub fn into_sorted(self) -> Vec<EntryView> {
        self.kept
            .into_sorted_vec()
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_ebpf::HOOK_TO_POD;

    fn key(ifindex: u32, hook: u8, sport: u16) -> CtKey {
        let mut src = [0u8; 16];
        src[10] = 0xff;
        src[11] = 0xff;
        src[12] = 10;
        CtKey {
            src,
            dst: src,
            sport: sport.to_be(),
            dport: 80u16.to_be(),
            ifindex,
            proto: 6,
            hook,
            pad: [0; 2],
        }
    }

    #[test]
    fn keeps_the_lowest_ranked_whatever_the_order_offered() {
        let mut keys: Vec<CtKey> = (0..LISTED as u16 * 3)
            .map(|i| key(u32::from(i % 5), (i % 2) as u8, i))
            .collect();
        let mut expected: Vec<Rank> = keys
            .iter()
            .map(|k| rank(k, super::super::sweep::tuple_of(k)))
            .collect();
        expected.sort();
        expected.truncate(LISTED);
        // Offer in a scrambled order.
        keys.reverse();
        keys.rotate_left(100);
        let mut l = Listing::default();
        let value = CtValue {
            last_seen_ns: 1_000_000,
            epoch: 3,
            pad: 0,
        };
        for k in &keys {
            l.offer(
                k,
                super::super::sweep::tuple_of(k),
                &value,
                5_000_000,
                false,
            );
        }
        let listed = l.into_sorted();
        assert_eq!(listed.len(), LISTED);
        let got: Vec<Rank> = listed
            .iter()
            .map(|e| (e.ifindex, u8::from(e.hook == "to_pod"), e.tuple))
            .collect();
        assert_eq!(got, expected);
        assert_eq!((listed[0].epoch, listed[0].idle_ms), (3, 4));
    }

    #[test]
    fn an_entry_seen_after_the_start_is_not_idle() {
        let mut l = Listing::default();
        let v = CtValue {
            last_seen_ns: 9_000_000,
            epoch: 1,
            pad: 0,
        };
        let k = key(7, HOOK_TO_POD, 1);
        l.offer(&k, super::super::sweep::tuple_of(&k), &v, 5_000_000, false);
        let e = &l.into_sorted()[0];
        assert_eq!((e.idle_ms, e.hook, e.ifindex), (0, "to_pod", 7));
        assert_eq!(e.tuple.sport, 1);
        assert_eq!(
            e.to_string(),
            "ifindex=7 hook=to_pod proto=6 10.0.0.0:1 -> 10.0.0.0:80 epoch=1 idle_ms=0"
        );
    }
}
