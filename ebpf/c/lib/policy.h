/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Policy: does a hook's policy table allow a peer on (protocol, port)?
 * And, for a pod's egress, its learned overlay (pal_learned, found
 * through pal_learned_index), which decides before the table for the
 * addresses it holds.
 */
#ifndef PALISADE_LIB_POLICY_H
#define PALISADE_LIB_POLICY_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "endpoint.h"

/* The 32-bit word `word` (0..3) of an address prefix of addr_bits bits, as
 * a mask in network order. */
static __always_inline __u32 prefix_mask(__s32 addr_bits, int word)
{
	__s32 bits = addr_bits - 32 * word;

	if (bits <= 0)
		return 0;
	if (bits >= 32)
		return 0xffffffff;
	return bpf_htonl(0xffffffffU << (32 - bits));
}

/* The longest-prefix entry of policy_id for peer, as the pal_policy trie
 * would answer, by one exact lookup per prefix length the policy has,
 * longest first: the first hit is the longest match.  A policy with no
 * recorded lengths is looked up in the trie. */
static __always_inline struct policy_value *policy_entry(__u32 policy_id, const __u8 peer[16])
{
	/* Zeroed then filled field by field: a partial designated initializer
	 * makes clang emit a .rodata template, which aya would turn into a map. */
	struct policy_key pk = {};
	struct policy_lens *lens;
	struct policy_value *pv;
	__u32 addr[4];

	pk.policy_id = policy_id;
	lens = bpf_map_lookup_elem(&pal_policy_lens, &policy_id);
	if (!lens) {
		pk.prefixlen = POLICY_FULL_PREFIX;
		__builtin_memcpy(pk.addr, peer, 16);
		return bpf_map_lookup_elem(&pal_policy, &pk);
	}
	__builtin_memcpy(addr, peer, 16);
#pragma unroll
	for (int i = 0; i < PAL_MAX_POLICY_LENS; i++) {
		__u32 len, masked;

		if (i >= lens->count)
			break;
		len = lens->prefixlen[i];
		if (len < POLICY_ID_BITS || len > POLICY_FULL_PREFIX)
			continue;
		pk.prefixlen = len;
#pragma unroll
		for (int w = 0; w < 4; w++) {
			masked = addr[w] & prefix_mask(len - POLICY_ID_BITS, w);
			__builtin_memcpy(pk.addr + 4 * w, &masked, 4);
		}
		pv = bpf_map_lookup_elem(&pal_policy_exact, &pk);
		if (pv)
			return pv;
	}
	return NULL;
}

/* Does port set portset_id allow (proto, dport)?  dport in network order. */
static __always_inline bool portset_allows(__u32 portset_id, __u8 proto, __u16 dport)
{
	struct port_key portk = {};
	struct port_value *portv;

	portk.prefixlen = PORT_FULL_PREFIX;
	portk.portset_id = portset_id;
	portk.proto = proto;
	__builtin_memcpy(portk.port, &dport, 2);
	portv = bpf_map_lookup_elem(&pal_ports, &portk);
	return portv && portv->allow;
}

/* Does policy_id allow the peer on (proto, dport)?  Policy id 0 is "not
 * isolated": everything.  dport in network order. */
static __always_inline bool policy_allows(__u32 policy_id, const __u8 peer[16], __u8 proto,
					  __u16 dport)
{
	struct policy_value *pv;

	if (!policy_id)
		return true;
	pv = policy_entry(policy_id, peer);
	if (!pv)
		return false;
	return portset_allows(pv->portset_id, proto, dport);
}

/* ---- egress by domain name: the pod's learned overlay ---- */

/* The port sets of the learned entry for key (the pod's host veth and the
 * peer) into *portset and *audit_portset (the staged table's, 0: none),
 * when the entry decides the flow: 1; no entry, or
 * (for a new flow, established 0) an expired one: 0, and the table
 * decides.
 *
 * pal_learned_index gives a slot number that a reused hash element may
 * have made any number (struct learned_slot): the slot counts only when
 * its ifindex (read once) is the key's and its addr is the peer; any
 * other slot, or a number out of range, is no entry, and the table
 * decides (which fails closed: see struct learned_slot).  As in ep_find,
 * the slot is looked up again through a number computed from the ifindex
 * just read (the same number, as they are equal), so that every later
 * load of the slot depends on that check and no CPU reads addr, the port
 * set or the expiry before it: they are then the key's own, as addr never
 * changes while ifindex is set, and portset_id and expires_ns are each
 * read once (the old or the new value of an in-place rewrite, both the
 * key's).
 *
 * A global function, so the verifier checks it once, on its own, instead
 * of along every path of the verdict that may consult the overlay (the
 * programs are near the verifier's limit); its pointers may be NULL to
 * it, hence the checks. */
__noinline int learned_entry(const struct learned_key *key, __u32 established, __u32 *portset,
			     __u32 *audit_portset)
{
	struct learned_key lk;
	const struct learned_slot *s;
	const __u32 *index;
	__u32 slot, seen;

	if (!key || !portset || !audit_portset)
		return 0;
	__builtin_memcpy(&lk, key, sizeof(lk));
	if (!lk.ifindex)
		return 0; /* a free slot's ifindex is 0 */
	index = bpf_map_lookup_elem(&pal_learned_index, &lk);
	if (!index)
		return 0;
	slot = READ_ONCE_U32(index);
	s = bpf_map_lookup_elem(&pal_learned, &slot);
	if (!s)
		return 0;
	seen = READ_ONCE_U32(&s->ifindex);
	slot += seen ^ lk.ifindex;
	barrier_var(slot);
	s = bpf_map_lookup_elem(&pal_learned, &slot);
	if (!s || seen != lk.ifindex || !addr_eq(s->addr, lk.addr))
		return 0;
	if (!established && READ_ONCE_U64(&s->expires_ns) <= bpf_ktime_get_boot_ns())
		return 0;
	*portset = READ_ONCE_U32(&s->portset_id);
	*audit_portset = READ_ONCE_U32(&s->audit_portset_id);
	return 1;
}

/* Whether the pod's learned overlay may decide a flow `hook` of ep
 * judges: only the pod's egress (names are egress-only: the ingress hook
 * never looks), only when it is isolated (not isolated, everything passes
 * anyway) and only for a pod with domain-name rules (EP_FLAG_LEARNS). */
static __always_inline bool learned_consulted(const struct ep_view *ep, __u8 hook)
{
	return hook == HOOK_FROM_POD && (ep->flags & EP_FLAG_LEARNS) && hook_policy(ep, hook);
}

/* What allowed a flow (hook_allows). */
enum allowed_by {
	ALLOWED_NOT,      /* denied */
	ALLOWED_BY_TABLE, /* the direction's table, or not isolated */
	ALLOWED_BY_NAME,  /* the pod's learned overlay */
};

/* Does the `hook` of ep (interface ifindex) allow a flow to or from peer on
 * (proto, dport), and by what?  A learned entry for the peer decides alone
 * (its port set is the pod's whole egress verdict for that host); a new
 * flow ignores an expired one, an established flow (its conntrack entry,
 * of an older epoch, is being re-judged) does not: the flow opened while
 * the name was allowed (learned_entry).  Without an entry, the direction's
 * table decides. */
static __always_inline int peer_allowed(const struct ep_view *ep, __u32 ifindex, __u8 hook,
					const __u8 peer[16], __u8 proto, __u16 dport,
					bool established)
{
	struct learned_key lk = {};
	__u32 portset = 0, staged = 0;

	if (learned_consulted(ep, hook)) {
		lk.ifindex = ifindex;
		__builtin_memcpy(lk.addr, peer, 16);
		if (learned_entry(&lk, established, &portset, &staged))
			return portset_allows(portset, proto, dport) ? ALLOWED_BY_NAME
								     : ALLOWED_NOT;
	}
	return policy_allows(hook_policy(ep, hook), peer, proto, dport) ? ALLOWED_BY_TABLE
									: ALLOWED_NOT;
}

/* Does the `hook` of ep allow the forward packet f (ALLOWED_*)?
 * established: f's flow has an entry this hook wrote, of an older epoch. */
static __always_inline int hook_allows(const struct ep_view *ep, __u32 ifindex, __u8 hook,
				       const struct flow *f, bool established)
{
	const __u8 *peer = hook == HOOK_FROM_POD ? f->dst : f->src;

	return peer_allowed(ep, ifindex, hook, peer, f->proto, f->dport, established);
}

/* Would the `hook` of ep still allow the flow that f replies to?
 * The original flow is f reversed: its peer is f's source when it was
 * judged as egress (destination), f's destination when judged as ingress
 * (source); its destination port is f's source port.  It is established
 * (its entry is what f matched). */
static __always_inline bool hook_allows_original(const struct ep_view *ep, __u32 ifindex,
						 __u8 hook, const struct flow *f)
{
	const __u8 *peer = hook == HOOK_FROM_POD ? f->src : f->dst;

	return peer_allowed(ep, ifindex, hook, peer, f->proto, f->sport, true) != ALLOWED_NOT;
}

#endif
