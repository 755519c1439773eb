//! One load of the object into a pin directory of its own, with the map
//! writes and reads a test or benchmark needs.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions, TestRunResult};
use aya::{Ebpf, EbpfLoader};

use crate::policy_lens::{LensUpdate, PolicyLenCounts};
use crate::*;

/// What the programs return for an allowed packet (TCX_NEXT, -1) and a
/// denied one (DROP), as BPF_PROG_TEST_RUN reports them.
pub const ALLOW: u32 = VERDICT_NEXT as u32;
pub const DROP: u32 = VERDICT_DROP as u32;
/// What they return for a DNS answer they hold.
pub const HOLD: u32 = VERDICT_HOLD as u32;

/// BPF_PROG_TEST_RUN resolves `__sk_buff.ifindex` to a device in the caller's
/// netns; loopback is 1 everywhere.
pub const LO: u32 = 1;

/// The addresses of the pod [`Harness::endpoint`] puts on [`LO`].
pub const POD4: &str = "10.0.0.2";
pub const POD6: &str = "fd00::2";

/// A pin directory under /sys/fs/bpf that disappears with its owner, even
/// when a test panics.
pub struct PinDir(PathBuf);

impl PinDir {
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = Path::new("/sys/fs/bpf").join(format!(
            "palisade-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("create {} (root and bpffs needed): {e}", path.display()));
        PinDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for PinDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// [`OBJECT`] loaded (both programs through the verifier) with its maps
/// pinned in a fresh [`PinDir`], so no two harnesses see each other's maps.
pub struct Harness {
    ebpf: Ebpf,
    lens: PolicyLenCounts,
    home: bool,
    /// The slot of [`MAP_LEARNED`] each learned entry holds, as the
    /// enforcer's learner would keep it; slots are never reused.
    learned_slots: BTreeMap<LearnedKey, u32>,
    next_learned_slot: u32,
    // Declared last so it is removed after the maps are closed.
    pins: PinDir,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self::with_object(OBJECT)
    }

    /// The same with another build of the programs (see
    /// [`super::HEADERS_BY_COPY_OBJECT`]).
    pub fn with_object(object: &[u8]) -> Self {
        Self::load(object, None)
    }

    /// [`OBJECT`] with policy maps ([`MAP_POLICY`], [`MAP_POLICY_EXACT`])
    /// of `entries` entries instead of [`MAX_POLICY_ENTRIES`]: for a
    /// benchmark that keeps more tables at once than a node may hold.
    /// Objects loaded later on [`Harness::pins`] share these maps.
    pub fn with_policy_entries(entries: u32) -> Self {
        Self::load(OBJECT, Some(entries))
    }

    fn load(object: &[u8], policy_entries: Option<u32>) -> Self {
        let pins = PinDir::new();
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(pins.path());
        if let Some(n) = policy_entries {
            loader.map_max_entries(MAP_POLICY, n);
            loader.map_max_entries(MAP_POLICY_EXACT, n);
        }
        let mut ebpf = loader
            .load(object)
            .unwrap_or_else(|e| panic!("load object: {e:?}"));
        for name in [PROG_FROM_POD, PROG_TO_POD] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("program {name} missing"))
                .try_into()
                .unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e:?}"));
        }
        let mut h = Harness {
            ebpf,
            lens: PolicyLenCounts::default(),
            home: true,
            learned_slots: BTreeMap::new(),
            next_learned_slot: 0,
            pins,
        };
        // As the enforcer does at start: a share no test meets unless it
        // sets one (set_ct_share).
        h.set_ct_share(MAX_CONNTRACK_ENTRIES);
        h
    }

    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub fn pins(&self) -> &Path {
        self.pins.path()
    }

    pub fn program(&self, name: &str) -> &SchedClassifier {
        self.ebpf
            .program(name)
            .unwrap_or_else(|| panic!("program {name} missing"))
            .try_into()
            .unwrap()
    }

    /// Isolates the pod on `LO`, whose addresses are [`POD4`] and
    /// [`POD6`]; a policy id of 0 leaves that direction open.
    pub fn endpoint(&mut self, ingress_policy: u32, egress_policy: u32) {
        self.endpoint_at(LO, ingress_policy, egress_policy, &[POD4, POD6]);
    }

    /// What the enforcer does to change a pod's policy: new ids, each
    /// changed direction with an epoch it never used before.
    pub fn switch(&mut self, ingress: u32, egress: u32, ingress_epoch: u32, egress_epoch: u32) {
        let addrs = [mapped_addr(ip(POD4)), mapped_addr(ip(POD6))];
        let dir = |policy, epoch| Direction { policy, epoch };
        let slot = EpSlot::new(
            LO,
            dir(ingress, ingress_epoch),
            dir(egress, egress_epoch),
            &addrs,
        )
        .unwrap();
        self.set_endpoint(slot);
    }

    pub fn endpoint_at(&mut self, ifindex: u32, ingress: u32, egress: u32, addrs: &[&str]) {
        let addrs: Vec<[u8; 16]> = addrs.iter().map(|a| mapped_addr(ip(a))).collect();
        let dir = |policy| Direction { policy, epoch: 0 };
        let slot =
            EpSlot::new(ifindex, dir(ingress), dir(egress), &addrs).expect("at most MAX_POD_ADDRS");
        self.set_endpoint(slot);
    }

    /// Writes an endpoint (`slot.ifindex`'s) as the enforcer does once the
    /// grace periods are behind it: at its home slot, trusted there, and in
    /// [`MAP_EP_INDEX`]; or (see [`Harness::off_home`]) at a slot away from
    /// home that only the index names. No packet runs meanwhile, so the
    /// writes need no order here. Keeps the staged (audit) word and the
    /// flags the slot had.
    pub fn set_endpoint(&mut self, mut slot: EpSlot) {
        let ifindex = slot.ifindex;
        let at = self.slot_of(ifindex);
        let old = self.ep_slots().get(&at, 0).unwrap();
        if old.ifindex == ifindex {
            slot.audit = old.audit;
            slot.flags = old.flags;
        }
        slot.home = if self.home { ifindex } else { 0 };
        self.ep_slots().set(at, slot, 0).unwrap();
        self.ep_index().insert(ifindex, at, 0).unwrap();
    }

    /// Where [`Harness::set_endpoint`] puts the endpoint of `ifindex`.
    pub fn slot_of(&self, ifindex: u32) -> u32 {
        if self.home {
            ep_home(ifindex)
        } else {
            ep_home(ifindex ^ (EP_SLOTS / 2))
        }
    }

    /// Points the staged (audit) policies of an endpoint already written
    /// at these tables (0: none), as one word.
    pub fn set_audit(&mut self, ifindex: u32, ingress: u32, egress: u32) {
        let at = self.slot_of(ifindex);
        let mut slot = self.ep_slots().get(&at, 0).unwrap();
        assert_eq!(slot.ifindex, ifindex, "audit for an endpoint not written");
        slot.audit = audit_word(ingress, egress);
        self.ep_slots().set(at, slot, 0).unwrap();
    }

    /// Sets or clears [`EP_FLAG_LEARNS`] of an endpoint already written:
    /// whether its egress consults its entries in [`MAP_LEARNED`].
    pub fn set_learns(&mut self, ifindex: u32, learns: bool) {
        let at = self.slot_of(ifindex);
        let mut slot = self.ep_slots().get(&at, 0).unwrap();
        assert_eq!(slot.ifindex, ifindex, "flags for an endpoint not written");
        if learns {
            slot.flags |= EP_FLAG_LEARNS;
        } else {
            slot.flags &= !EP_FLAG_LEARNS;
        }
        self.ep_slots().set(at, slot, 0).unwrap();
    }

    /// The slots of the pods' learned overlays ([`MAP_LEARNED`]).
    pub fn learned(&mut self) -> Array<&mut MapData, LearnedSlot> {
        Array::try_from(self.ebpf.map_mut(MAP_LEARNED).unwrap()).unwrap()
    }

    /// Their index ([`MAP_LEARNED_INDEX`]): key to slot number.
    pub fn learned_index(&mut self) -> HashMap<&mut MapData, LearnedKey, u32> {
        HashMap::try_from(self.ebpf.map_mut(MAP_LEARNED_INDEX).unwrap()).unwrap()
    }

    /// Writes the learned entry of the pod behind `ifindex` for `peer`:
    /// live until `expires_ns` (`CLOCK_BOOTTIME`), judged by `portset_id`.
    /// As the enforcer does (see [`LearnedSlot`]): a new entry takes a
    /// fresh slot, written before its index entry; an entry the pod
    /// already has is rewritten in place, its addr and ifindex untouched.
    /// No packet runs meanwhile, so each write is one update here.
    pub fn learn_at(&mut self, ifindex: u32, peer: &str, expires_ns: u64, portset_id: u32) {
        self.learn_staged_at(ifindex, peer, expires_ns, portset_id, 0)
    }

    /// [`Harness::learn_at`] with the staged (audit) egress's port set for
    /// the peer too (0: none, the staged table decides).
    pub fn learn_staged_at(
        &mut self,
        ifindex: u32,
        peer: &str,
        expires_ns: u64,
        portset_id: u32,
        audit_portset_id: u32,
    ) {
        let key = LearnedKey::new(ifindex, ip(peer));
        if let Some(&at) = self.learned_slots.get(&key) {
            let mut slot = self.learned().get(&at, 0).unwrap();
            assert_eq!(
                (slot.ifindex, slot.addr),
                (key.ifindex, key.addr),
                "slot {at} is not the entry's"
            );
            slot.portset_id = portset_id;
            slot.audit_portset_id = audit_portset_id;
            slot.expires_ns = expires_ns;
            self.learned().set(at, slot, 0).unwrap();
            return;
        }
        let at = self.next_learned_slot;
        self.next_learned_slot += 1;
        let slot = LearnedSlot::new(&key, portset_id, audit_portset_id, expires_ns);
        self.learned().set(at, slot, 0).unwrap();
        self.learned_index().insert(key, at, 0).unwrap();
        self.learned_slots.insert(key, at);
    }

    /// The slot of [`MAP_LEARNED`] that [`Harness::learn_at`] gave the
    /// entry of the pod behind `ifindex` for `peer`, if it has one.
    pub fn learned_slot_of(&self, ifindex: u32, peer: &str) -> Option<u32> {
        self.learned_slots
            .get(&LearnedKey::new(ifindex, ip(peer)))
            .copied()
    }

    /// Points the index entry of the pod behind `ifindex` for `peer` at
    /// slot `at` of [`MAP_LEARNED`], whatever that slot holds (or a number
    /// past its end): what a reused index element may yield. The
    /// harness's own record of the entries is left as it was.
    pub fn set_learned_hint(&mut self, ifindex: u32, peer: &str, at: u32) {
        self.learned_index()
            .insert(LearnedKey::new(ifindex, ip(peer)), at, 0)
            .unwrap();
    }

    /// Removes the learned entry of the pod behind `ifindex` for `peer`,
    /// as the enforcer retires a slot: its index entry, then its ifindex.
    /// The slot is not used again.
    pub fn forget_at(&mut self, ifindex: u32, peer: &str) {
        let key = LearnedKey::new(ifindex, ip(peer));
        let at = self
            .learned_slots
            .remove(&key)
            .expect("forget an entry not learned");
        self.learned_index().remove(&key).unwrap();
        let mut slot = self.learned().get(&at, 0).unwrap();
        slot.ifindex = 0;
        self.learned().set(at, slot, 0).unwrap();
    }

    /// A port set's entry that matches and denies (a tiered set's Deny).
    pub fn deny_port_keys(&mut self, key: Key<PortKey>) {
        let mut map: LpmTrie<_, PortKey, PortValue> =
            LpmTrie::try_from(self.ebpf.map_mut(MAP_PORTS).unwrap()).unwrap();
        map.insert(&key, PortValue::DENY, 0).unwrap();
    }

    /// From now on endpoints are written away from their home slot, found
    /// through [`MAP_EP_INDEX`] only (an interface whose home slot another
    /// holds, or not yet trusted): the programs must judge alike.
    pub fn off_home(mut self) -> Self {
        self.home = false;
        self
    }

    pub fn ep_slots(&mut self) -> Array<&mut MapData, EpSlot> {
        Array::try_from(self.ebpf.map_mut(MAP_EP_SLOTS).unwrap()).unwrap()
    }

    pub fn ep_index(&mut self) -> HashMap<&mut MapData, u32, u32> {
        HashMap::try_from(self.ebpf.map_mut(MAP_EP_INDEX).unwrap()).unwrap()
    }

    /// The most conntrack entries each endpoint hook may hold.
    pub fn set_ct_share(&mut self, share: u32) {
        let mut map: Array<_, CtConfig> =
            Array::try_from(self.ebpf.map_mut(MAP_CT_CONFIG).unwrap()).unwrap();
        map.set(0, CtConfig { share, pad: 0 }, 0).unwrap();
    }

    /// The conntrack entries counted for the endpoint in `slot`.
    pub fn ct_share(&mut self, slot: u32) -> CtShare {
        let map: Array<_, CtShare> =
            Array::try_from(self.ebpf.map_mut(MAP_CT_SHARE).unwrap()).unwrap();
        map.get(&slot, 0).unwrap()
    }

    /// The trie alone: what an older version wrote, or a test that wants
    /// the trie lookup (no [`MAP_POLICY_LENS`] entry) for its policy.
    pub fn policies(&mut self) -> LpmTrie<&mut MapData, PolicyKey, PolicyValue> {
        LpmTrie::try_from(self.ebpf.map_mut(MAP_POLICY).unwrap()).unwrap()
    }

    pub fn policy_exact(&mut self) -> HashMap<&mut MapData, PolicyExactKey, PolicyValue> {
        HashMap::try_from(self.ebpf.map_mut(MAP_POLICY_EXACT).unwrap()).unwrap()
    }

    pub fn policy_lens(&mut self) -> HashMap<&mut MapData, u32, PolicyLens> {
        HashMap::try_from(self.ebpf.map_mut(MAP_POLICY_LENS).unwrap()).unwrap()
    }

    fn apply_lens(&mut self, policy_id: u32, update: LensUpdate) {
        match update {
            LensUpdate::Unchanged => {}
            LensUpdate::Write(v) => self.policy_lens().insert(policy_id, v, 0).unwrap(),
            LensUpdate::Delete => {
                let _ = self.policy_lens().remove(&policy_id);
            }
        }
    }

    /// Writes a rule as the enforcer does: its length listed first, then
    /// the trie, then the exact map.
    pub fn rule(&mut self, key: &Key<PolicyKey>, portset_id: u32) {
        let policy_id = key.data().policy_id;
        let update = self.lens.adding(policy_id, [key.prefix_len()]);
        self.apply_lens(policy_id, update);
        let value = PolicyValue { portset_id };
        self.policies().insert(key, value, 0).unwrap();
        self.policy_exact()
            .insert(PolicyExactKey::of(key), value, 0)
            .unwrap();
    }

    /// Removes a rule as the enforcer does: exact map, trie, then lengths.
    pub fn remove_rule(&mut self, key: &Key<PolicyKey>) {
        let policy_id = key.data().policy_id;
        self.policy_exact()
            .remove(&PolicyExactKey::of(key))
            .unwrap();
        self.policies().remove(key).unwrap();
        let update = self.lens.removing(policy_id, [key.prefix_len()]);
        self.apply_lens(policy_id, update);
    }

    /// `peers` is a CIDR such as "10.0.1.0/24".
    pub fn cidr(&mut self, policy_id: u32, peers: &str, portset_id: u32) {
        self.rule(&cidr_key(policy_id, peers), portset_id);
    }

    pub fn remove_cidr(&mut self, policy_id: u32, peers: &str) {
        self.remove_rule(&cidr_key(policy_id, peers));
    }

    pub fn port_keys(&mut self, key: Key<PortKey>) {
        let mut map: LpmTrie<_, PortKey, PortValue> =
            LpmTrie::try_from(self.ebpf.map_mut(MAP_PORTS).unwrap()).unwrap();
        map.insert(&key, PortValue::ALLOW, 0).unwrap();
    }

    pub fn ports(&mut self, portset_id: u32, proto: u8, start: u16, end: u16) {
        for (port, bits) in port_prefixes(start, end) {
            self.port_keys(PortKey::lpm(portset_id, proto, port, bits));
        }
    }

    pub fn run(&self, prog: &str, frame: &[u8]) -> u32 {
        self.run_at(LO, prog, frame)
    }

    pub fn run_at(&self, ifindex: u32, prog: &str, frame: &[u8]) -> u32 {
        test_run(self.program(prog), ifindex, frame, 1).return_value
    }

    pub fn pod_sends(&self, frame: &[u8]) -> u32 {
        self.run(PROG_FROM_POD, frame)
    }

    pub fn pod_receives(&self, frame: &[u8]) -> u32 {
        self.run(PROG_TO_POD, frame)
    }

    /// What the hook for packets the pod behind `ifindex` sends decides.
    pub fn sends_at(&self, ifindex: u32, frame: &[u8]) -> u32 {
        self.run_at(ifindex, PROG_FROM_POD, frame)
    }

    /// What the hook for packets to the pod behind `ifindex` decides.
    pub fn receives_at(&self, ifindex: u32, frame: &[u8]) -> u32 {
        self.run_at(ifindex, PROG_TO_POD, frame)
    }

    /// Packets of kind `stat` (a `STAT_*`), both directions.
    pub fn stat(&self, stat: u32) -> u64 {
        self.stat_dir(HOOK_FROM_POD, stat) + self.stat_dir(HOOK_TO_POD, stat)
    }

    /// Packets of kind `stat` judged by `hook` ([`HOOK_FROM_POD`]:
    /// the pod's egress; [`HOOK_TO_POD`]: its ingress).
    pub fn stat_dir(&self, hook: u8, stat: u32) -> u64 {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map(MAP_STATS).unwrap()).unwrap();
        map.get(&stat_slot(hook, stat), 0).unwrap().iter().sum()
    }

    /// Packets per `STAT_*` kind, both directions.
    pub fn stats(&self) -> [u64; STAT_COUNT as usize] {
        std::array::from_fn(|i| self.stat(i as u32))
    }

    /// The IPv6 flows' map ([`MAP_CONNTRACK`]).
    pub fn conntrack(&mut self) -> HashMap<&mut MapData, CtKey, CtValue> {
        HashMap::try_from(self.ebpf.map_mut(MAP_CONNTRACK).unwrap()).unwrap()
    }

    /// The IPv4 flows' map ([`MAP_CT4`]).
    pub fn conntrack4(&mut self) -> HashMap<&mut MapData, Ct4Key, CtValue> {
        HashMap::try_from(self.ebpf.map_mut(MAP_CT4).unwrap()).unwrap()
    }

    /// The entry under `key`, from the map of its family.
    pub fn ct_get(&mut self, key: &CtKey) -> Option<CtValue> {
        match Ct4Key::of(key) {
            Some(k4) => self.conntrack4().get(&k4, 0).ok(),
            None => self.conntrack().get(key, 0).ok(),
        }
    }

    /// Writes an entry into the map of its family.
    pub fn ct_insert(&mut self, key: CtKey, value: CtValue) {
        match Ct4Key::of(&key) {
            Some(k4) => self.conntrack4().insert(k4, value, 0).unwrap(),
            None => self.conntrack().insert(key, value, 0).unwrap(),
        }
    }

    pub fn ct_remove(&mut self, key: &CtKey) {
        // An LRU map may have evicted it meanwhile; gone is gone.
        let _ = match Ct4Key::of(key) {
            Some(k4) => self.conntrack4().remove(&k4),
            None => self.conntrack().remove(key),
        };
    }

    pub fn ct_has(&mut self, key: &CtKey) -> bool {
        self.ct_get(key).is_some()
    }

    pub fn ct_len(&mut self) -> usize {
        self.ct_keys().len()
    }

    /// Every entry of both maps, IPv4 ones widened to [`CtKey`].
    pub fn ct_keys(&mut self) -> Vec<CtKey> {
        let mut keys: Vec<CtKey> = self.conntrack().keys().map(|k| k.unwrap()).collect();
        keys.extend(self.conntrack4().keys().map(|k| k.unwrap().widen()));
        keys
    }

    /// The records IPv4 first fragments left ([`MAP_FRAGS4`]), sorted.
    pub fn frags4(&mut self) -> Vec<(Frag4Key, FragValue)> {
        let map: HashMap<_, Frag4Key, FragValue> =
            HashMap::try_from(self.ebpf.map_mut(MAP_FRAGS4).unwrap()).unwrap();
        let mut all: Vec<_> = map.iter().map(|r| r.unwrap()).collect();
        all.sort();
        all
    }

    /// The records IPv6 first fragments left ([`MAP_FRAGS6`]), sorted.
    pub fn frags6(&mut self) -> Vec<(Frag6Key, FragValue)> {
        let map: HashMap<_, Frag6Key, FragValue> =
            HashMap::try_from(self.ebpf.map_mut(MAP_FRAGS6).unwrap()).unwrap();
        let mut all: Vec<_> = map.iter().map(|r| r.unwrap()).collect();
        all.sort();
        all
    }

    /// What every record of both families says.
    pub fn frag_values(&mut self) -> Vec<FragValue> {
        let mut all: Vec<FragValue> = self.frags4().into_iter().map(|(_, v)| v).collect();
        all.extend(self.frags6().into_iter().map(|(_, v)| v));
        all
    }

    /// Forgets every conntrack entry, and checks that none is left.
    pub fn ct_clear(&mut self) {
        for key in self.ct_keys() {
            self.ct_remove(&key);
        }
        let left = self.ct_len();
        assert_eq!(left, 0, "{left} conntrack entries survived clearing");
    }
}

/// Runs `prog` `repeat` times on `frame` as if it arrived on `ifindex`.
/// The result's duration is the kernel's mean per run.
pub fn test_run(prog: &SchedClassifier, ifindex: u32, frame: &[u8], repeat: u32) -> TestRunResult {
    let ctx = skb_ctx(ifindex);
    let mut out = vec![0u8; frame.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        ctx_in: Some(&ctx),
        repeat,
        ..TestRunOptions::default()
    };
    prog.test_run(opts)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN: {e:?}"))
}

/// A `struct __sk_buff` up to and including `ifindex` (offset 40); the
/// kernel treats a shorter ctx_in as zero-filled.
pub fn skb_ctx(ifindex: u32) -> [u8; 44] {
    let mut ctx = [0u8; 44];
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    ctx
}

/// `cidr` such as "10.0.1.0/24" as the key of a rule of `policy_id`.
pub fn cidr_key(policy_id: u32, cidr: &str) -> Key<PolicyKey> {
    let (addr, len) = cidr.split_once('/').expect("CIDR");
    PolicyKey::lpm(policy_id, ip(addr), len.parse().unwrap())
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The entry the `hook` of `LO` writes when it allows the flow.
pub fn ct(src: &str, sport: u16, dst: &str, dport: u16, proto: u8, hook: u8) -> CtKey {
    ct_at(LO, src, sport, dst, dport, proto, hook)
}

pub fn ct_at(
    ifindex: u32,
    src: &str,
    sport: u16,
    dst: &str,
    dport: u16,
    proto: u8,
    hook: u8,
) -> CtKey {
    let flow = Tuple {
        src: ip(src),
        sport,
        dst: ip(dst),
        dport,
        proto,
    };
    CtKey::new(flow, ifindex, hook)
}
