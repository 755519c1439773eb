/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Policy: does a hook's policy table allow a peer on (protocol, port)?
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

/* Does policy_id allow the peer on (proto, dport)?  Policy id 0 is "not
 * isolated": everything.  dport in network order. */
static __always_inline bool policy_allows(__u32 policy_id, const __u8 peer[16], __u8 proto,
					  __u16 dport)
{
	struct port_key portk = {};
	struct policy_value *pv;
	struct port_value *portv;

	if (!policy_id)
		return true;
	pv = policy_entry(policy_id, peer);
	if (!pv)
		return false;

	portk.prefixlen = PORT_FULL_PREFIX;
	portk.portset_id = pv->portset_id;
	portk.proto = proto;
	__builtin_memcpy(portk.port, &dport, 2);
	portv = bpf_map_lookup_elem(&pal_ports, &portk);
	return portv && portv->allow;
}

/* Does the `hook` of ep allow the forward packet f? */
static __always_inline bool hook_allows(const struct ep_view *ep, __u8 hook,
					const struct flow *f)
{
	const __u8 *peer = hook == HOOK_FROM_POD ? f->dst : f->src;

	return policy_allows(hook_policy(ep, hook), peer, f->proto, f->dport);
}

/* Would the `hook` of ep still allow the flow that f replies to?
 * The original flow is f reversed: its peer is f's source when it was
 * judged as egress (destination), f's destination when judged as ingress
 * (source); its destination port is f's source port. */
static __always_inline bool hook_allows_original(const struct ep_view *ep, __u8 hook,
						 const struct flow *f)
{
	const __u8 *peer = hook == HOOK_FROM_POD ? f->src : f->dst;

	return policy_allows(hook_policy(ep, hook), peer, f->proto, f->sport);
}

#endif
