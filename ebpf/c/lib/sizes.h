/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sizes the programs share with user space, in one place: build.rs
 * turns each `#define PAL_<NAME> <value>` here into palisade_ebpf's
 * `pub const <NAME>: u32 = <value>;` (sizes.rs in OUT_DIR), with the
 * comment above the line as its doc, so no side mirrors the other by hand.
 * A value is an integer expression of decimal literals, PAL_ names defined
 * above it, parentheses, +, * and <<, which C and Rust read alike; build.rs
 * refuses anything else.
 */
#ifndef PALISADE_LIB_SIZES_H
#define PALISADE_LIB_SIZES_H

/* Slots of pal_ep_slots and pal_ct_share, and the most endpoints
 * pal_ep_index (so a node) holds: a power of two, as a home slot is the
 * ifindex modulo it. */
#define PAL_EP_SLOTS 16384

/* Most addresses one pod may send from (one per family is usual): a pod
 * with more is refused rather than partly protected. */
#define PAL_MAX_POD_ADDRS 4

/* Entries of each of pal_policy (the trie) and pal_policy_exact. */
#define PAL_MAX_POLICY_ENTRIES 262144

/* Entries of pal_ports. */
#define PAL_MAX_PORT_ENTRIES 262144

/* Policies pal_policy_lens holds prefix lengths for. */
#define PAL_MAX_POLICY_LENS_ENTRIES 65536

/* Most prefix lengths one policy may have for its entries to be found by
 * exact lookups in pal_policy_exact, one per length, longest first; a
 * policy with more (or none recorded) is looked up in the pal_policy trie,
 * which always holds every entry too. */
#define PAL_MAX_POLICY_LENS 6

/* Entries of each of pal_ct4 and pal_conntrack as compiled (the enforcer
 * may give them another size when it first creates them). */
#define PAL_MAX_CONNTRACK_ENTRIES 65536

/* Records each of pal_frags4 and pal_frags6 holds; the least recently
 * used goes first. */
#define PAL_MAX_FRAG_ENTRIES 8192

/* Slots of pal_learned (and entries of its index, pal_learned_index): the
 * addresses pods learned by domain name, for every pod of the node
 * together (the enforcer bounds each pod's share). */
#define PAL_MAX_LEARNED_ENTRIES 65536

/* Trusted DNS servers pal_dns_servers holds: the cluster DNS Service's
 * addresses and its backends'. */
#define PAL_MAX_DNS_SERVERS 64

/* Bytes of the pal_dns_frames ring buffer: the DNS queries copied and the
 * answers held for the learner (a record is 16 bytes of struct
 * dns_frame_hdr, the frame, and the ring's 8-byte header, rounded up to 8:
 * some 6000 answers of 600 bytes at once). */
#define PAL_DNS_FRAMES_BYTES (4 << 20)

/* The longest frame (from its Ethernet header) copied to pal_dns_frames:
 * a longer one is never held (it passes, counted). */
#define PAL_DNS_FRAME_MAX 4096

/* Records of pal_dns_frags (a DNS answer's first fragment: was it held?);
 * the least recently used goes first. */
#define PAL_MAX_DNS_FRAGS 4096

/* Kinds (STAT_*) pal_verdicts has room for, so that a kind added later
 * takes free slots of the pinned map instead of a new pin name. */
#define PAL_STAT_CAPACITY 32

/* Directions each kind is counted in: HOOK_FROM_POD (the pod's egress)
 * and HOOK_TO_POD (its ingress). */
#define PAL_STAT_DIRECTIONS 2

/* Entries of pal_verdicts: every kind it has room for, in each direction. */
#define PAL_STAT_MAP_ENTRIES (PAL_STAT_CAPACITY * PAL_STAT_DIRECTIONS)

/* Bytes of the pal_flow_events ring buffer. */
#define PAL_FLOW_EVENTS_BYTES (1 << 20)

/* Source ports bench.bpf.c's bench_new_flow cycles through: a run of at
 * most this many repeats never repeats a flow. */
#define PAL_BENCH_NEW_FLOW_PORTS 32768

/* How far CLOCK_MONOTONIC_COARSE may lag CLOCK_MONOTONIC: one tick, 10 ms
 * at the slowest HZ (100), doubled for safety.  The conntrack entries'
 * last_seen_ns is stamped this far ahead (lib/conntrack.h), which the
 * enforcer's sweep allows for. */
#define PAL_COARSE_CLOCK_LAG_NS (20 * 1000 * 1000)

#endif
