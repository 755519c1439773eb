//! A set of 64-bit flow digests in one flat open-addressed table: each
//! probe touches one cache line (a general hash set touches its control
//! bytes and then its slots), which is most of the cost of a million
//! inserts and lookups. At a million flows the table (16 MB) misses the
//! cache on nearly every probe, so the bulk operations ask for the slots of
//! digests a few places ahead before probing: the misses overlap instead of
//! queueing. Pure.

/// How far ahead the bulk operations prefetch: enough misses in flight to
/// hide memory latency, few enough that the lines are still there.
const AHEAD: usize = 16;

/// Hints the CPU to bring `slot`'s cache line in; nothing else.
#[inline(always)]
fn prefetch(slot: &u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint and never faults; the pointer is a live
    // reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (slot as *const u64).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// The digests are already well mixed, so their low bits pick the slot.
#[derive(Clone, Debug)]
pub struct DigestSet {
    /// 0 marks an empty slot; digest 0 is stored as 1 (a collision, which
    /// can only keep a stale entry, as every digest collision can).
    slots: Vec<u64>,
    len: usize,
}

impl Default for DigestSet {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl DigestSet {
    /// Room for `n` digests at a load of at most 3/4.
    pub fn with_capacity(n: usize) -> Self {
        let slots = (n + n / 3 + 1).next_power_of_two().max(64);
        DigestSet {
            slots: vec![0; slots],
            len: 0,
        }
    }

    fn home(&self, d: u64) -> &u64 {
        &self.slots[d.max(1) as usize & (self.slots.len() - 1)]
    }

    fn slot_of(&self, d: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = d as usize & mask;
        while self.slots[i] != 0 && self.slots[i] != d {
            i = (i + 1) & mask;
        }
        i
    }

    pub fn insert(&mut self, d: u64) {
        let d = d.max(1);
        let i = self.slot_of(d);
        if self.slots[i] == 0 {
            self.slots[i] = d;
            self.len += 1;
            if self.len * 4 > self.slots.len() * 3 {
                self.grow();
            }
        }
    }

    pub fn contains(&self, d: u64) -> bool {
        self.slots[self.slot_of(d.max(1))] != 0
    }

    /// Inserts every digest of `ds`.
    pub fn insert_all(&mut self, ds: &[u64]) {
        for (i, &d) in ds.iter().enumerate() {
            if let Some(&next) = ds.get(i + AHEAD) {
                prefetch(self.home(next));
            }
            self.insert(d);
        }
    }

    /// Whether each digest of `ds` is in the set, in order, appended to `out`.
    pub fn contains_each(&self, ds: &[u64], out: &mut Vec<bool>) {
        out.reserve(ds.len());
        for (i, &d) in ds.iter().enumerate() {
            if let Some(&next) = ds.get(i + AHEAD) {
                prefetch(self.home(next));
            }
            out.push(self.contains(d));
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn grow(&mut self) {
        let bigger = vec![0; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, bigger);
        for d in old.into_iter().filter(|&d| d != 0) {
            let i = self.slot_of(d);
            self.slots[i] = d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_was_inserted_and_nothing_else_through_growth() {
        let mut s = DigestSet::with_capacity(0);
        let mix = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 7);
        for i in 0..10_000u64 {
            s.insert(mix(i));
            s.insert(mix(i));
        }
        assert_eq!(s.len(), 10_000);
        assert!((0..10_000u64).all(|i| s.contains(mix(i))));
        assert!((10_000..20_000u64).all(|i| !s.contains(mix(i))));
        // Colliding low bits probe on.
        let mut t = DigestSet::with_capacity(4);
        for k in 1..=20u64 {
            t.insert(k << 40);
        }
        assert!((1..=20u64).all(|k| t.contains(k << 40)));
        assert!(!t.contains(21 << 40));
        // Zero is a digest like any other.
        t.insert(0);
        assert!(t.contains(0));
    }

    #[test]
    fn bulk_operations_agree_with_single_ones_through_growth() {
        let mix = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 7);
        let inserted: Vec<u64> = (0..5_000u64).map(mix).chain([0, 1 << 40]).collect();
        let mut bulk = DigestSet::with_capacity(10);
        bulk.insert_all(&inserted);
        let mut one = DigestSet::with_capacity(10);
        inserted.iter().for_each(|&d| one.insert(d));
        assert_eq!(bulk.len(), one.len());
        let asked: Vec<u64> = (0..10_000u64).map(mix).chain([0, 2 << 40]).collect();
        let mut got = Vec::new();
        bulk.contains_each(&asked, &mut got);
        let want: Vec<bool> = asked.iter().map(|&d| one.contains(d)).collect();
        assert_eq!(got, want);
        assert_eq!(got.iter().filter(|&&b| b).count(), 5_001);
    }
}
