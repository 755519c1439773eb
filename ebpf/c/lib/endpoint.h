/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A packet's endpoint: finding its slot of pal_ep_slots and trusting it
 * (struct ep_slot), the pod's own addresses (anti-spoofing), and what each
 * of its two hooks judges by.
 */
#ifndef PALISADE_LIB_ENDPOINT_H
#define PALISADE_LIB_ENDPOINT_H

#include "common.h"
#include "maps.h"

/* What a packet reads of its endpoint, once: its slot (addresses, which
 * do not change while the slot is the endpoint's), each direction's word
 * and the flags, one load each, so every decision about this packet uses
 * one consistent policy id and epoch per direction, and one set of flags. */
struct ep_view {
	const struct ep_slot *s;
	__u32 slot;
	__u32 flags; /* EP_FLAG_* */
	__u64 ingress;
	__u64 egress;
};

enum ep_found {
	EP_NONE,   /* no endpoint: not ours to judge */
	EP_FOUND,
	EP_UNSURE, /* pal_ep_index names a slot that is not the interface's */
};

/* Finds the endpoint of ifindex (see struct ep_slot for why each step can
 * be trusted).  The home slot counts only when its home field names the
 * interface, which the enforcer sets a grace period after writing the
 * rest.  Otherwise pal_ep_index gives a slot number that a reused hash
 * element may have made any number: the slot is used only when it names
 * the interface, and it is looked up again through a number computed from
 * the ifindex just read (the same number, as they are equal), so that
 * every later load of the slot depends on that check and no CPU can read
 * the rest of it first. */
static __always_inline int ep_find(__u32 ifindex, struct ep_view *ep)
{
	__u32 slot = ifindex & (PAL_EP_SLOTS - 1);
	const struct ep_slot *s;
	const __u32 *index;
	__u32 seen;

	if (!ifindex)
		return EP_NONE; /* an empty slot's home is 0 */
	s = bpf_map_lookup_elem(&pal_ep_slots, &slot);
	if (s && READ_ONCE_U32(&s->home) == ifindex)
		goto found;
	index = bpf_map_lookup_elem(&pal_ep_index, &ifindex);
	if (!index)
		return EP_NONE;
	slot = READ_ONCE_U32(index);
	s = bpf_map_lookup_elem(&pal_ep_slots, &slot);
	if (!s)
		return EP_UNSURE;
	seen = READ_ONCE_U32(&s->ifindex);
	slot += seen ^ ifindex;
	barrier_var(slot);
	s = bpf_map_lookup_elem(&pal_ep_slots, &slot);
	if (!s || seen != ifindex)
		return EP_UNSURE;
found:
	ep->s = s;
	ep->slot = slot;
	ep->ingress = READ_ONCE_U64(&s->ingress);
	ep->egress = READ_ONCE_U64(&s->egress);
	ep->flags = READ_ONCE_U32(&s->flags);
	return EP_FOUND;
}

/* ---- anti-spoofing ---- */

static __always_inline bool addr_eq(const __u8 a[16], const __u8 b[16])
{
	__u64 a0, a1, b0, b1;

	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return a0 == b0 && a1 == b1;
}

/* Is src one of the pod's own addresses?  With none configured, nothing is. */
static __always_inline bool pod_owns_source(const struct ep_view *ep, const __u8 src[16])
{
#pragma unroll
	for (int i = 0; i < PAL_MAX_POD_ADDRS; i++) {
		if (i >= ep->s->addr_count)
			return false;
		if (addr_eq(ep->s->addrs[i], src))
			return true;
	}
	return false;
}

/* Is saddr one of the pod's IPv4 addresses? */
static __always_inline bool pod_owns_v4(const struct ep_view *ep, __be32 saddr)
{
#pragma unroll
	for (int i = 0; i < PAL_MAX_POD_ADDRS; i++) {
		if (i >= ep->s->v4_count)
			return false;
		if (ep->s->v4[i] == saddr)
			return true;
	}
	return false;
}

/* ---- the two hooks of an endpoint ---- */

/* What a hook judges by: the endpoint's policy id and epoch for its
 * direction, from the one word the packet read. */
static __always_inline __u64 hook_word(const struct ep_view *ep, __u8 hook)
{
	return hook == HOOK_FROM_POD ? ep->egress : ep->ingress;
}

static __always_inline __u32 hook_policy(const struct ep_view *ep, __u8 hook)
{
	return EP_WORD_POLICY(hook_word(ep, hook));
}

static __always_inline __u32 hook_epoch(const struct ep_view *ep, __u8 hook)
{
	return EP_WORD_EPOCH(hook_word(ep, hook));
}

static __always_inline __u8 other_hook(__u8 hook)
{
	return hook == HOOK_FROM_POD ? HOOK_TO_POD : HOOK_FROM_POD;
}

#endif
