/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The maps the programs share with the enforcer, pinned by name so every
 * pod's programs share one copy; their value layouts are in palisade.h.
 * (pal_frags4 and pal_frags6 are with the rest of fragments, in
 * fragments.h.)
 */
#ifndef PALISADE_LIB_MAPS_H
#define PALISADE_LIB_MAPS_H

#include "common.h"
#include "../palisade.h"

/* Endpoint state, one slot per endpoint (struct ep_slot: how a packet
 * finds and trusts its slot).  Memory-mapped, so the enforcer changes a
 * direction's policy and epoch with one 8-byte store. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, PAL_EP_SLOTS);
	__type(key, __u32);
	__type(value, struct ep_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ep_slots SEC(".maps");

/* ifindex -> slot of pal_ep_slots, for an endpoint not (yet) trusted at
 * its home slot. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PAL_EP_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ep_index SEC(".maps");

/* Conntrack entries per endpoint hook (struct ct_share), by slot.
 * Memory-mapped: the enforcer's recount adds to it atomically. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, PAL_EP_SLOTS);
	__type(key, __u32);
	__type(value, struct ct_share);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ct_share SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ct_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ct_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, PAL_MAX_POLICY_ENTRIES);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy SEC(".maps");

/* The trie's entries again, found by exact key: a policy whose entries
 * have few distinct prefix lengths (pal_policy_lens) is looked up one hash
 * lookup per length, whose cost does not grow with its size as a trie
 * walk does.  Always a subset of pal_policy (written after it, removed
 * before it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, PAL_MAX_POLICY_ENTRIES);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy_exact SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PAL_MAX_POLICY_LENS_ENTRIES);
	__type(key, __u32);
	__type(value, struct policy_lens);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy_lens SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, PAL_MAX_PORT_ENTRIES);
	__type(key, struct port_key);
	__type(value, struct port_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PAL_MAX_CONNTRACK_ENTRIES);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PAL_MAX_CONNTRACK_ENTRIES);
	__type(key, struct ct4_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ct4 SEC(".maps");

/* The pods' learned overlays: addresses learned by domain name, looked
 * up by the egress verdict of a pod with EP_FLAG_LEARNS (see policy.h,
 * learned_entry).  Written by the enforcer only, as endpoints are (struct
 * ep_slot; docs/DESIGN.md invariant 14): each entry is a slot of this
 * memory-mapped array (struct learned_slot), whose addr and ifindex are
 * written, ifindex last, before its index entry is inserted and never
 * change while ifindex is set; portset_id and expires_ns change in place,
 * one atomic store each; a slot is retired by deleting its index entry,
 * then clearing ifindex, and reused only a grace period later.  See struct
 * learned_slot for the whole contract. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, PAL_MAX_LEARNED_ENTRIES);
	__type(key, __u32);
	__type(value, struct learned_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_learned SEC(".maps");

/* struct learned_key -> slot of pal_learned.  A hint only: an element may
 * be reused under a reader (the kernel hands a freed one to the next
 * insert without waiting), so a packet uses the slot it names only when
 * the slot's ifindex and addr are the key's. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, PAL_MAX_LEARNED_ENTRIES);
	__type(key, struct learned_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_learned_index SEC(".maps");

/* Verdict counters by direction (STAT_SLOT), with room for PAL_STAT_CAPACITY
 * kinds.  A pinned map keeps its size across upgrades, so the maps of
 * older versions, which had no room for later kinds, are left behind under
 * their own names (pal_stats: one slot per kind; pal_dir_stats: exactly
 * STAT_COUNT kinds of its day). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PAL_STAT_MAP_ENTRIES);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_verdicts SEC(".maps");

/* Flow events for the enforcer's flow log (see struct flow_event).  The
 * buffer is bounded: when it is full an event is dropped and counted, the
 * packet's verdict never waits for user space. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, PAL_FLOW_EVENTS_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_stats SEC(".maps");

/* The flow log's rate limit: one node-wide GCRA clock (see flow_admit).
 * Pinned so that a restarted enforcer's programs, which take the links over
 * one at a time, share it with the old ones and no restart grants a fresh
 * burst. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_bucket SEC(".maps");

#endif
