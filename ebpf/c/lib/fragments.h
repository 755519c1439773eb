/* SPDX-License-Identifier: Apache-2.0 */
/*
 * IP fragments.  Only a datagram's first fragment (offset 0) carries its L4
 * header; a later one has no ports to judge.  So the first fragment is
 * judged like any packet (conntrack, then policy, by its real ports) and
 * its verdict is recorded in pal_frags4 or pal_frags6 under the datagram's
 * name (source, destination, identification and IPv4's protocol: what the
 * receiver reassembles by) and the hook's (ifindex, hook) pair, so one hook's
 * verdict never stands for another's.  A later fragment takes that
 * verdict:
 *
 *   no record (no first fragment seen, it came later, or the record was
 *   evicted)                                     -> drop
 *   the first fragment was dropped               -> drop
 *   it starts inside the L4 header the first
 *   fragment was judged by (an overlap, RFC 3128) -> drop, and so do the
 *                                                   datagram's other
 *                                                   fragments (RFC 5722)
 *   passed under the endpoint's current epochs   -> next
 *   passed under other epochs                    -> judged again as a
 *                                                   packet of its flow, by
 *                                                   the first fragment's
 *                                                   ports
 *
 * Drops are STAT_DENIED_FRAGMENT, passes STAT_ALLOWED_FRAGMENT.  Why no
 * fragment opens a port policy denies: every offset-0 fragment is judged
 * by its own ports (a second first fragment with another flow's ports
 * meets that flow's verdict and overwrites the record); one too short for
 * its L4 header is dropped (frag_first_whole); no later fragment reaches
 * into the bytes its first fragment was judged by.  So whatever the
 * receiver reassembles starts with a header that passed.  Fragments that
 * arrive before their first fragment are dropped: veths keep order, and
 * fail closed is the stance.
 *
 * Used by palisade.bpf.c's verdict, with struct flow, struct ep_view (the
 * slot it read), account and flow_event.
 */
#ifndef PALISADE_LIB_FRAGMENTS_H
#define PALISADE_LIB_FRAGMENTS_H

#include "common.h"
#include "../palisade.h"
#include "parse.h"
#include "endpoint.h"
#include "flow_events.h"
#include "counters.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PAL_MAX_FRAG_ENTRIES);
	__type(key, struct frag4_key);
	__type(value, struct frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_frags4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PAL_MAX_FRAG_ENTRIES);
	__type(key, struct frag6_key);
	__type(value, struct frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_frags6 SEC(".maps");

/* A record's key of either family (as struct ct_ref is for conntrack). */
struct frag_ref {
	bool v4;
	union {
		struct frag4_key k4;
		struct frag6_key k6;
	};
};

static __always_inline void frag_key_of(struct frag_ref *r, const struct flow *f, __u32 ifindex,
					__u8 hook)
{
	r->v4 = f->v4;
	if (f->v4) {
		__builtin_memcpy(&r->k4.src, f->src + 12, 4);
		__builtin_memcpy(&r->k4.dst, f->dst + 12, 4);
		r->k4.ifindex = ifindex;
		r->k4.id = (__be16)f->frag_id;
		r->k4.proto = f->frag_proto;
		r->k4.hook = hook;
		return;
	}
	__builtin_memcpy(r->k6.src, f->src, 16);
	__builtin_memcpy(r->k6.dst, f->dst, 16);
	r->k6.id = f->frag_id;
	r->k6.ifindex = ifindex;
	r->k6.hook = hook;
	r->k6.pad[0] = 0;
	r->k6.pad[1] = 0;
	r->k6.pad[2] = 0;
}

/* Two lookups the compiler may not merge (see ct_lookup). */
static __always_inline struct frag_value *frag_lookup(const struct frag_ref *r)
{
	struct frag_value *v;

	if (r->v4) {
		v = bpf_map_lookup_elem(&pal_frags4, &r->k4);
		barrier_var(v);
		return v;
	}
	v = bpf_map_lookup_elem(&pal_frags6, &r->k6);
	barrier_var(v);
	return v;
}

/* A failed write leaves the later fragments without a record: they drop,
 * which is the safe side. */
static __always_inline void frag_update(const struct frag_ref *r, const struct frag_value *v)
{
	if (r->v4)
		bpf_map_update_elem(&pal_frags4, &r->k4, v, BPF_ANY);
	else
		bpf_map_update_elem(&pal_frags6, &r->k6, v, BPF_ANY);
}

/* Records the verdict on the first fragment f for its later fragments.  An
 * identification comes back (a later datagram, or a forged first
 * fragment): the newest first fragment's verdict and ports stand, but
 * l4_end only grows, so that of two first fragments laid out differently
 * (IPv6 headers inside the fragmentable part) neither leaves the other's
 * L4 header open to a later fragment. */
static __always_inline void frag_remember(const struct flow *f, const struct ep_view *ep,
					  __u32 ifindex, __u8 hook, bool allowed)
{
	struct frag_ref r;
	struct frag_value v = {};
	const struct frag_value *old;

	frag_key_of(&r, f, ifindex, hook);
	v.sport = f->sport;
	v.dport = f->dport;
	v.l4_end = f->frag_at;
	v.proto = f->proto;
	v.allowed = allowed;
	v.ingress_epoch = hook_epoch(ep, HOOK_TO_POD);
	v.egress_epoch = hook_epoch(ep, HOOK_FROM_POD);
	old = frag_lookup(&r);
	if (old && old->l4_end > v.l4_end)
		v.l4_end = old->l4_end;
	frag_update(&r, &v);
}

enum frag_answer {
	FRAG_PASS,  /* STAT_ALLOWED_FRAGMENT */
	FRAG_DROP,  /* STAT_DENIED_FRAGMENT */
	FRAG_JUDGE, /* judge it as a packet of its flow (f now has its ports) */
};

/* What the record of its first fragment says of the later fragment f.  f
 * takes the datagram's ports and protocol from it, for the flow log of a
 * drop and for a new judgement. */
static __always_inline int frag_follow(struct flow *f, const struct ep_view *ep, __u32 ifindex,
				       __u8 hook)
{
	struct frag_ref r;
	struct frag_value *v;

	frag_key_of(&r, f, ifindex, hook);
	v = frag_lookup(&r);
	if (!v)
		return FRAG_DROP;
	f->sport = v->sport;
	f->dport = v->dport;
	f->proto = v->proto;
	if (f->frag_at < v->l4_end) {
		v->allowed = 0;
		return FRAG_DROP;
	}
	if (!v->allowed)
		return FRAG_DROP;
	if (v->ingress_epoch == hook_epoch(ep, HOOK_TO_POD) &&
	    v->egress_epoch == hook_epoch(ep, HOOK_FROM_POD))
		return FRAG_PASS;
	f->trackable = true;
	return FRAG_JUDGE;
}

/* Settles the later fragment f when its record decides it (into *verdict,
 * counted); false when it is to be judged as a packet of its flow. */
static __always_inline bool frag_later_settled(struct flow *f, const struct ep_view *ep,
					       __u32 ifindex, __u8 hook, int *verdict)
{
	int answer = frag_follow(f, ep, ifindex, hook);

	if (answer == FRAG_PASS) {
		*verdict = account(hook, STAT_ALLOWED_FRAGMENT, VERDICT_NEXT);
		return true;
	}
	if (answer == FRAG_DROP) {
		flow_event(f, ifindex, hook, FLOW_DENIED, hook_policy(ep, hook),
			   STAT_DENIED_FRAGMENT);
		*verdict = account(hook, STAT_DENIED_FRAGMENT, VERDICT_DROP);
		return true;
	}
	return false;
}

/* Counts the verdict on the parsed packet f (account), first recording it
 * for the later fragments when f is a first fragment. */
static __always_inline int settle(const struct flow *f, const struct ep_view *ep, __u32 ifindex,
				  __u8 hook, enum pal_stat stat, int verdict)
{
	if (f->frag == FRAG_FIRST)
		frag_remember(f, ep, ifindex, hook, verdict == VERDICT_NEXT);
	return account(hook, stat, verdict);
}

#endif
