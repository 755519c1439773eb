//! A bounded view of the eBPF conntrack entries for the debug dump: the
//! first [`LISTED`] in a stable order (interface, hook, tuple), so the
//! same flows show from one cleanup to the next, whatever the hash order.
//! Pure: fed one entry at a time by the sweep.

use std::collections::BinaryHeap;

use palisade_ebpf::{CtKey, CtValue, OWNER_FROM_POD};

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

pub fn hook_name(owner: u8) -> &'static str {
    if owner == OWNER_FROM_POD {
        "from_pod"
    } else {
        "to_pod"
    }
}

/// The order entries are listed in.
type Rank = (u32, u8, Tuple);

fn rank(k: &CtKey, t: Tuple) -> Rank {
    (k.ifindex, k.owner, t)
}

/// Keeps the [`LISTED`] lowest-ranked entries offered.
#[derive(Default)]
pub struct Listing {
    /// Max-heap on rank: the top is the first to give way.
    kept: BinaryHeap<(Rank, EntryView)>,
}

impl Listing {
    pub fn offer(&mut self, k: &CtKey, v: &CtValue, started_ns: u64, removed: bool) {
        let tuple = super::sweep::tuple_of(k);
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
                hook: hook_name(k.owner),
                tuple,
                epoch: v.epoch,
                idle_ms: started_ns.saturating_sub(v.last_seen_ns) / 1_000_000,
                removed,
            },
        ));
    }

    pub fn into_sorted(self) -> Vec<EntryView> {
        self.kept.into_sorted_vec().into_iter().map(|(_, e)| e).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_ebpf::OWNER_TO_POD;

    fn key(ifindex: u32, owner: u8, sport: u16) -> CtKey {
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
            owner,
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
            l.offer(k, &value, 5_000_000, false);
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
        l.offer(&key(7, OWNER_TO_POD, 1), &v, 5_000_000, false);
        let e = &l.into_sorted()[0];
        assert_eq!((e.idle_ms, e.hook, e.ifindex), (0, "to_pod", 7));
        assert_eq!(e.tuple.sport, 1);
    }
}
