/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layout of every map Palisade shares with user space.  The Rust mirrors in
 * ebpf/src/lib.rs assert the same sizes at compile time; change both or
 * neither.  The sizes (PAL_*) are in lib/sizes.h, which Rust's constants
 * are generated from.
 */
#ifndef PALISADE_H
#define PALISADE_H

#include <linux/types.h>

#include "lib/sizes.h"
#include "lib/reasons.h"

/* Which hook wrote a conntrack entry.  A reply is only trusted when the
 * forward packet was allowed by the *other* hook of the same pod. */
#define HOOK_FROM_POD 0 /* the pod's egress policy (TC ingress of host veth) */
#define HOOK_TO_POD 1   /* the pod's ingress policy (TC egress of host veth) */

/* Verdict kinds (STAT_*, STAT_SLOT) are in lib/reasons.h. */

/* LPM prefix lengths of a full (host) lookup. */
#define POLICY_ID_BITS 32
#define POLICY_FULL_PREFIX (POLICY_ID_BITS + 128)
#define PORT_FULL_PREFIX (32 + 8 + 16)

/* Endpoints.  Each endpoint (a pod's host veth) has a slot of pal_ep_slots,
 * a memory-mapped array the enforcer writes in place, found either at its
 * home (slot ifindex % PAL_EP_SLOTS) or through pal_ep_index (ifindex -> slot
 * number, a hash written only when an endpoint comes, goes or moves).
 * A hash element may be reused under a reader (the kernel hands a deleted
 * or replaced element to the next insert without waiting), so the slot
 * number it yields is only a hint: the slot must name the interface.
 *
 * The rules that let a packet trust what it reads (docs/DESIGN.md
 * invariant 14; node-enforcer/src/datapath/bpf/endpoint_slots.rs):
 *  - ifindex, the addresses and v4 are written before the slot is
 *    published (by pal_ep_index, whose insert orders them), and never
 *    change while ifindex names the interface;
 *  - home is set to the ifindex only a grace period after that, so a
 *    packet that finds its home slot by position sees it whole;
 *  - a retired slot has home and ifindex cleared, and is written again
 *    only a grace period later (no packet still reads it);
 *  - what changes in place is one 8-byte word per direction (policy id
 *    in the low half, epoch in the high half) and the audit word, each
 *    written with one atomic store and read with one load, so a packet
 *    sees a direction's old or new pair, never a mix;
 *  - flags (EP_FLAG_*) also change in place, with one atomic 4-byte store,
 *    and a packet reads them once (ep_find). */
#define EP_WORD_POLICY(w) ((__u32)(w))
#define EP_WORD_EPOCH(w) ((__u32)((w) >> 32))

/* struct ep_slot.flags.  EP_FLAG_LEARNS: the pod's egress has rules by
 * domain name, so its flows consult its learned overlay (pal_learned,
 * struct learned_slot) before the egress table. */
#define EP_FLAG_LEARNS (1U << 0)

struct ep_slot {
	__u32 ifindex; /* the host veth this slot holds; 0: none */
	__u32 home;    /* == ifindex once trusted at its home position */
	/* Policy id (0: not isolated) and epoch of each direction.  The epoch
	 * changes whenever the direction's policy does (and never comes back
	 * to an old value): conntrack entries of another epoch are re-judged. */
	__u64 ingress;
	__u64 egress;
	__u64 audit; /* staged ingress policy id (low half), egress (high); 0: none */
	__u32 v4_count;   /* the pod's IPv4 addresses in v4, for the fast path */
	__u32 addr_count; /* the pod's own addresses in addrs, at most PAL_MAX_POD_ADDRS */
	__be32 v4[PAL_MAX_POD_ADDRS];
	__u32 flags; /* EP_FLAG_* */
	__u32 pad;
	/* The pod's own addresses (IPv6 or IPv4-mapped), the only sources it
	 * may send from.  0 addresses: every IP packet from the pod drops. */
	__u8 addrs[PAL_MAX_POD_ADDRS][16];
};

/* Value of pal_ct_share, by endpoint slot: the conntrack entries each hook
 * of the endpoint created and removed (monotonic; the difference is what
 * it holds).  A hook holding its share (pal_ct_config) creates no more: a
 * pod opening flows as fast as it can fills its own share, not the node's
 * table, so it cannot evict other pods' flows.  The table's LRU eviction
 * removes entries no one counts; the enforcer's conntrack pass recounts
 * them (node-enforcer/src/conntrack/share.rs). */
struct ct_share {
	__u64 created[PAL_STAT_DIRECTIONS]; /* by HOOK_* */
	__u64 removed[PAL_STAT_DIRECTIONS];
};

/* Value of pal_ct_config (key 0), written by the enforcer at start. */
struct ct_config {
	__u32 share; /* most entries one hook of one endpoint may hold */
	__u32 pad;
};

/* Peer address as IPv6; IPv4 is stored IPv4-mapped (::ffff:a.b.c.d) so one
 * trie serves both families. */
struct policy_key {
	__u32 prefixlen;
	__u32 policy_id;
	__u8 addr[16];
};

struct policy_value {
	__u32 portset_id;
};

/* Value of pal_policy_lens (key: policy id): the trie prefix lengths
 * (struct policy_key.prefixlen) of the policy's entries, longest first.
 * May list lengths no entry has (a wasted lookup), never miss one. */
struct policy_lens {
	__u32 count;
	__u32 prefixlen[PAL_MAX_POLICY_LENS];
};

/* Port in network order so that an aligned port range is a bit prefix. */
struct port_key {
	__u32 prefixlen;
	__u32 portset_id;
	__u8 proto;
	__u8 port[2];
	__u8 pad;
};

struct port_value {
	__u32 allow;
};

/* ---- egress by domain name (pal_learned, pal_learned_index) ----
 * The addresses a pod with domain-name rules (EP_FLAG_LEARNS) learned from
 * the DNS answers it received: a per-pod overlay on its egress table,
 * written by the enforcer's learner, read by the programs only.  For a
 * peer it has an entry for, the entry decides the pod's egress alone:
 *  - a new flow: an entry not yet expired decides; an expired one is
 *    ignored (the table decides, as with no entry), so expiry never waits
 *    for a sweep;
 *  - an established flow re-judged under a newer epoch: an entry decides
 *    whether or not it has expired, as its conntrack entry proves the
 *    flow opened while the name was allowed, and connections opened then
 *    keep working past the TTL.  The enforcer deletes or rewrites the
 *    entries of a name the policy no longer grants.
 * The pod's ingress never consults it (names are egress-only); its staged
 * (audit) egress does, by the entry's audit_portset_id (lib/audit.h).
 *
 * Stored as endpoints are (struct ep_slot, docs/DESIGN.md invariant 14):
 * each entry is a slot of pal_learned, a memory-mapped array, found
 * through pal_learned_index (struct learned_key -> slot number), a hash
 * whose element may be reused under a reader, so the number it yields is
 * only a hint.  A packet uses a slot only when its ifindex and addr are
 * the packet's pod and peer (learned_entry, policy.h); any other slot is
 * no entry, and the table decides.  That fails closed: names are
 * Accept-only, so an entry's port set (the pod's chain with Accept rules
 * added) allows whatever the table allows that host, and maybe more; a
 * missed entry can only deny what it would have allowed.
 *
 * The writer's rules (the enforcer's learner follows them):
 *  - a free slot (ifindex 0) is filled by writing addr, portset_id and
 *    expires_ns, then ifindex, last, with one store ordered after them;
 *    then its index entry is inserted (the kernel publishes the insert
 *    after the slot's bytes);
 *  - addr and ifindex never change while ifindex is non-zero: another
 *    peer, or another pod, takes another slot;
 *  - portset_id and expires_ns of a live slot may be rewritten in place,
 *    each with one atomic store; a packet reads each once and may see the
 *    old or the new value of each, both of them this key's;
 *  - a slot is retired by deleting its index entry, then clearing ifindex
 *    (one store), and is written again only a grace period later, when no
 *    packet that saw it is still running (node-enforcer's grace.rs; on a
 *    kernel without grace periods, never). */

/* Key of pal_learned_index: the pod (its host veth, as conntrack keys name
 * it) and the peer (IPv6, or IPv4-mapped as in struct policy_key). */
struct learned_key {
	__u32 ifindex;
	__u32 pad;
	__u8 addr[16];
};

/* Value of pal_learned, by slot number (see the rules above). */
struct learned_slot {
	/* The peer (as struct learned_key.addr); fixed while ifindex is set. */
	__u8 addr[16];
	/* The pod's host veth; 0: a free slot.  Written last, cleared first. */
	__u32 ifindex;
	/* A port set of pal_ports: the pod's WHOLE egress verdict for this one
	 * host, compiled with the learned name rules included (so tier order,
	 * an Admin Deny above an Accept by name, is resolved in it). */
	__u32 portset_id;
	/* The same for the pod's staged (audit) egress table, with its staged
	 * rules by name: what a staged policy would decide for this host.
	 * 0: none (the pod has no staged rule by name; the staged table
	 * decides).  Written and read as portset_id is. */
	__u32 audit_portset_id;
	__u32 pad;
	/* CLOCK_BOOTTIME (bpf_ktime_get_boot_ns): a suspend or a restart of
	 * the enforcer does not reset it.  Live while later than now. */
	__u64 expires_ns;
};

/* A flow as seen by the hook that allowed it: (ifindex, hook) name that
 * hook, so an entry vouches for one direction of one pod and nothing else.
 * IPv6 flows only (pal_conntrack); IPv4 flows use struct ct4_key. */
struct ct_key {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;   /* network order */
	__u16 dport;   /* network order */
	__u32 ifindex; /* host veth whose hook allowed the forward packet */
	__u8 proto;
	__u8 hook; /* HOOK_FROM_POD or HOOK_TO_POD */
	__u8 pad[2];
};

/* The same for IPv4 flows, in their own smaller map: a key of 20 bytes
 * hashes and compares in less than half the time of 44. */
struct ct4_key {
	__be32 src;
	__be32 dst;
	__u16 sport;   /* network order */
	__u16 dport;   /* network order */
	__u32 ifindex;
	__u8 proto;
	__u8 hook;
	__u8 pad[2];
};

struct ct_value {
	/* CLOCK_MONOTONIC of the last packet, from the coarse clock rounded up:
	 * never earlier than the packet, at most 20 ms later. */
	__u64 last_seen_ns;
	__u32 epoch;        /* the writing direction's epoch when policy last allowed the flow */
	__u32 pad;
};

/* ---- IP fragments (pal_frags4, pal_frags6) ----
 * A later fragment carries no L4 header: it is judged by the record its
 * datagram's first fragment left (see lib/fragments.h). */

/* One IPv4 datagram as one hook of one pod sees its fragments: what the
 * receiver reassembles by (addresses, protocol, identification), and the
 * hook, so that one hook's verdict never stands for another's.  16 bytes:
 * a short key hashes and compares faster, as pal_ct4's does. */
struct frag4_key {
	__be32 src;
	__be32 dst;
	__u32 ifindex;
	__be16 id;
	__u8 proto;
	__u8 hook;
};

/* The same for IPv6, which reassembles by addresses and identification
 * alone (a later fragment's next header counts for nothing, RFC 8200). */
struct frag6_key {
	__u8 src[16];
	__u8 dst[16];
	__be32 id; /* the fragment header's */
	__u32 ifindex;
	__u8 hook;
	__u8 pad[3];
};

/* What the first fragment was judged as, and by what. */
struct frag_value {
	__u16 sport; /* network order */
	__u16 dport;
	/* Bytes of the fragmentable part up to the end of the L4 header the
	 * verdict read: a later fragment starting before it would rewrite it. */
	__u16 l4_end;
	__u8 proto;   /* the L4 protocol it was judged as */
	__u8 allowed; /* 1: passed; 0: dropped, and so are its later fragments */
	/* The endpoint's epochs then: a later fragment under other epochs is
	 * judged again, by the first fragment's ports. */
	__u32 ingress_epoch;
	__u32 egress_epoch;
};

/* ---- flow events (pal_flow_events ring buffer) ----
 * New flows and dropped packets, for flow logs and staged (audit) policies.
 * The enforcer reads them and writes JSON lines; see node-enforcer's
 * flow log module. */
/* flow_event.kind; build.rs turns these into palisade_ebpf's FLOW_* (u8). */
enum pal_flow_kind {
	FLOW_ALLOWED = 0,     /* a new flow policy let through (or not isolated) */
	FLOW_DENIED = 1,      /* a packet dropped (stat says why) */
	FLOW_WOULD_DENY = 2,  /* allowed, but staged policies would deny it */
	FLOW_WOULD_ALLOW = 3, /* denied, but staged policies would allow it */
};

struct flow_event {
	__u64 ts_ns;     /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u32 ifindex;   /* the pod's host veth */
	__u32 policy_id; /* table that judged: the enforced one; the audit one for FLOW_WOULD_* */
	__u8 src[16];    /* IPv6 or IPv4-mapped */
	__u8 dst[16];
	__u16 sport; /* network order, 0 without ports */
	__u16 dport;
	__u8 proto;
	__u8 hook; /* HOOK_*: the pod's egress (from pod) or ingress (to pod) */
	__u8 kind;  /* FLOW_* */
	__u8 stat;  /* the STAT_* slot the packet was counted under */
};

/* flow_config.mode: which events besides FLOW_WOULD_* are sent; build.rs
 * turns these into palisade_ebpf's FLOW_LOG_* (u32). */
enum pal_flow_log_mode {
	FLOW_LOG_OFF = 0,  /* only FLOW_WOULD_* (staged policies) */
	FLOW_LOG_DENY = 1, /* and FLOW_DENIED */
	FLOW_LOG_ALL = 2,  /* and FLOW_ALLOWED */
};

/* Value of pal_flow_config (array, key 0), written by the enforcer. */
struct flow_config {
	__u32 mode;         /* FLOW_LOG_* */
	__u32 rate_per_sec; /* events per second per node; 0: no events at all */
	__u32 burst;        /* events allowed at once above the rate */
	__u32 pad;
};

/* Indices into pal_flow_stats (per-CPU counters).  build.rs turns each
 * into palisade_ebpf's FLOW_STAT_* (as lib/reasons.h's kinds), so the
 * enforcer reads these numbers, not copies. */
enum pal_flow_stat {
	FLOW_STAT_EMITTED = 0,             /* events written to the ring buffer */
	FLOW_STAT_RATE_LIMITED = 1,        /* events dropped by the per-node rate limit */
	FLOW_STAT_OVERFLOW = 2,            /* events dropped because the ring buffer was full */
	FLOW_STAT_WOULD_DENY_EGRESS = 3,   /* FLOW_WOULD_DENY of the pod's egress */
	FLOW_STAT_WOULD_DENY_INGRESS = 4,  /* FLOW_WOULD_DENY of the pod's ingress */
	FLOW_STAT_WOULD_ALLOW_EGRESS = 5,  /* FLOW_WOULD_ALLOW of the pod's egress */
	FLOW_STAT_WOULD_ALLOW_INGRESS = 6, /* FLOW_WOULD_ALLOW of the pod's ingress */
	FLOW_STAT_COUNT                    /* entries of pal_flow_stats (not a counter) */
};

/* ---- DNS capture for the learner (lib/dns_capture.h) ----
 * A learning pod's (EP_FLAG_LEARNS) DNS traffic with the trusted servers
 * (pal_dns_servers: key an address, IPv6 or IPv4-mapped; value 1), after
 * the verdict allowed it: its queries are copied to pal_dns_frames, its
 * answers copied there and held (dropped) while the learner is alive, for
 * the enforcer to learn from and re-inject (docs/DESIGN.md, "Egress by
 * domain name"). */

/* Value of pal_dns_config (array, key 0), written by the enforcer. */
struct dns_config {
	/* CLOCK_BOOTTIME (bpf_ktime_get_boot_ns) until which the learner is
	 * alive; the enforcer keeps moving it forward.  0 or past: no learner,
	 * nothing is copied or held. */
	__u64 learner_deadline_ns;
	__u64 pad;
};

/* dns_frame_hdr.kind; build.rs turns these into palisade_ebpf's
 * DNS_FRAME_* (u8). */
enum pal_dns_frame_kind {
	DNS_FRAME_QUERY = 0,  /* a query the pod sent: copied, not held */
	DNS_FRAME_ANSWER = 1, /* an answer to the pod, held: the enforcer must re-inject it */
};

/* A record of pal_dns_frames: this header, then `len` bytes of the frame
 * from its Ethernet header on, as the hook saw it. */
struct dns_frame_hdr {
	__u64 ts_ns;   /* CLOCK_BOOTTIME (bpf_ktime_get_boot_ns) */
	__u32 ifindex; /* the pod's host veth */
	__u16 len;     /* bytes of the frame that follow */
	__u8 kind;     /* DNS_FRAME_* */
	__u8 pad;
};

/* Indices into pal_dns_stats (per-CPU counters); build.rs turns each into
 * palisade_ebpf's DNS_STAT_*. */
enum pal_dns_stat {
	DNS_STAT_QUERY_COPIED = 0,       /* queries copied to the ring buffer */
	DNS_STAT_ANSWER_HELD = 1,        /* answers (or first fragments) copied and held */
	DNS_STAT_PASSED_NO_LEARNER = 2,  /* answers passed: the learner's deadline is past */
	DNS_STAT_PASSED_RING_FULL = 3,   /* answers passed (queries not copied): ring buffer full */
	DNS_STAT_PASSED_TOO_BIG = 4,     /* answers passed (queries not copied): above PAL_DNS_FRAME_MAX */
	DNS_STAT_FRAGMENT_HELD = 5,      /* later fragments of a held answer, copied and held */
	DNS_STAT_FRAGMENT_PASSED = 6,    /* later fragments of an answer not held, or not copied */
	DNS_STAT_COUNT                   /* entries of pal_dns_stats (not a counter) */
};

/* Key of pal_dns_frags: one datagram (as struct frag4_key and frag6_key
 * name it, both families in one map) to one pod.  Value: __u32, 1 when its
 * first fragment was held, 0 when it passed. */
struct dns_frag_key {
	__u8 src[16]; /* IPv6 or IPv4-mapped */
	__u8 dst[16];
	__u32 id;      /* IPv6's identification; IPv4's in the low 16 bits, network order */
	__u32 ifindex; /* the pod's host veth */
	__u8 proto;    /* IPv4's protocol; 0 for IPv6 */
	__u8 pad[3];
};

_Static_assert(sizeof(struct dns_config) == 16, "dns_config layout");
_Static_assert(sizeof(struct dns_frame_hdr) == 16, "dns_frame_hdr layout");
_Static_assert(sizeof(struct dns_frag_key) == 44, "dns_frag_key layout");
_Static_assert(PAL_DNS_FRAME_MAX < 65536, "dns_frame_hdr.len holds any frame length");
_Static_assert(sizeof(struct flow_event) == 56, "flow_event layout");
_Static_assert(sizeof(struct flow_config) == 16, "flow_config layout");
_Static_assert(sizeof(struct ep_slot) == 128, "ep_slot layout");
_Static_assert(sizeof(struct ct_share) == 32, "ct_share layout");
_Static_assert(sizeof(struct ct_config) == 8, "ct_config layout");
_Static_assert(sizeof(struct policy_key) == 24, "policy_key layout");
_Static_assert(sizeof(struct port_key) == 12, "port_key layout");
_Static_assert(sizeof(struct ct_key) == 44, "ct_key layout");
_Static_assert(sizeof(struct ct_value) == 16, "ct_value layout");
_Static_assert(sizeof(struct ct4_key) == 20, "ct4_key layout");
_Static_assert(sizeof(struct policy_lens) == 4 + PAL_MAX_POLICY_LENS * 4, "policy_lens layout");
_Static_assert(sizeof(struct frag4_key) == 16, "frag4_key layout");
_Static_assert(sizeof(struct frag6_key) == 44, "frag6_key layout");
_Static_assert(sizeof(struct frag_value) == 16, "frag_value layout");
_Static_assert(sizeof(struct learned_key) == 24, "learned_key layout");
_Static_assert(sizeof(struct learned_slot) == 40, "learned_slot layout");
_Static_assert(__builtin_offsetof(struct learned_slot, ifindex) == 16, "learned_slot layout");
_Static_assert(__builtin_offsetof(struct learned_slot, portset_id) == 20, "learned_slot layout");
_Static_assert(__builtin_offsetof(struct learned_slot, audit_portset_id) == 24, "learned_slot layout");
_Static_assert(__builtin_offsetof(struct learned_slot, expires_ns) == 32, "learned_slot layout");

#endif
