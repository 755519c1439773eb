/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Conntrack: the entries a hook's allowed forward packets write (pal_ct4,
 * pal_conntrack), the replies and established packets they let through,
 * and each endpoint hook's share of the table (struct ct_share).
 */
#ifndef PALISADE_LIB_CONNTRACK_H
#define PALISADE_LIB_CONNTRACK_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "endpoint.h"
#include "policy.h"

/* PAL_COARSE_CLOCK_LAG_NS (lib/sizes.h), as the 64-bit clock's type. */
#define COARSE_CLOCK_LAG_NS ((__u64)PAL_COARSE_CLOCK_LAG_NS)

/* The last_seen_ns of a packet seen now: CLOCK_MONOTONIC nanoseconds, never
 * earlier than the true time (the enforcer's sweep keeps every entry seen
 * at or after the moment it started, so an early stamp could cost a live
 * flow its entry) and at most COARSE_CLOCK_LAG_NS later, which only keeps
 * an idle entry one sweep longer.  The coarse clock costs a few ns per
 * packet where bpf_ktime_get_ns costs ~40 (scripts/bench-datapath.sh). */
static __always_inline __u64 seen_now(void)
{
	return bpf_ktime_get_coarse_ns() + COARSE_CLOCK_LAG_NS;
}

/* Writes only when the stamp moved (once a tick), so a busy flow does not
 * dirty its entry's cache line on every packet. */
static __always_inline void ct_touch(struct ct_value *v)
{
	__u64 now = seen_now();

	if (v->last_seen_ns != now)
		v->last_seen_ns = now;
}

/* A conntrack key of either family: IPv4 flows live in pal_ct4 under a
 * 20-byte key, IPv6 flows in pal_conntrack under a 44-byte one. */
struct ct_ref {
	bool v4;
	union {
		struct ct4_key k4;
		struct ct_key k6;
	};
};

/* The key of the entry `hook` of ifindex writes for the flow whose
 * packet is f (reverse: for the flow f replies to). */
static __always_inline void ct_key(struct ct_ref *r, const struct flow *f, bool reverse,
				   __u32 ifindex, __u8 hook)
{
	const __u8 *src = reverse ? f->dst : f->src;
	const __u8 *dst = reverse ? f->src : f->dst;

	r->v4 = f->v4;
	if (f->v4) {
		__builtin_memcpy(&r->k4.src, src + 12, 4);
		__builtin_memcpy(&r->k4.dst, dst + 12, 4);
		r->k4.sport = reverse ? f->dport : f->sport;
		r->k4.dport = reverse ? f->sport : f->dport;
		r->k4.ifindex = ifindex;
		r->k4.proto = f->proto;
		r->k4.hook = hook;
		r->k4.pad[0] = 0;
		r->k4.pad[1] = 0;
		return;
	}
	__builtin_memcpy(r->k6.src, src, 16);
	__builtin_memcpy(r->k6.dst, dst, 16);
	r->k6.sport = reverse ? f->dport : f->sport;
	r->k6.dport = reverse ? f->sport : f->dport;
	r->k6.ifindex = ifindex;
	r->k6.proto = f->proto;
	r->k6.hook = hook;
	r->k6.pad[0] = 0;
	r->k6.pad[1] = 0;
}

/* The barrier keeps clang from merging the two lookups into one call
 * whose map is chosen at run time: the verifier inlines a lookup only
 * when its call always sees the same map, and the out-of-line helper call
 * costs about as much again as the lookup itself. */
static __always_inline struct ct_value *ct_lookup(const struct ct_ref *r)
{
	struct ct_value *v;

	if (r->v4) {
		v = bpf_map_lookup_elem(&pal_ct4, &r->k4);
		barrier_var(v);
		return v;
	}
	v = bpf_map_lookup_elem(&pal_conntrack, &r->k6);
	barrier_var(v);
	return v;
}

/* ---- each endpoint hook's share of the conntrack table ---- */

/* Does `hook` of the endpoint hold its share of entries already?
 * Read without a lock: CPUs creating entries at the same moment may pass
 * the share by one each, never more. */
static __always_inline bool ct_share_full(const struct ep_view *ep, __u8 hook)
{
	__u32 zero = 0;
	const struct ct_config *cfg = bpf_map_lookup_elem(&pal_ct_config, &zero);
	const struct ct_share *sh = bpf_map_lookup_elem(&pal_ct_share, &ep->slot);

	if (!cfg || !sh)
		return true;
	return READ_ONCE_U64(&sh->created[hook]) - READ_ONCE_U64(&sh->removed[hook]) >=
	       cfg->share;
}

/* Counts an entry `hook` of the endpoint created or removed. */
static __always_inline void ct_share_count(const struct ep_view *ep, __u8 hook, bool created)
{
	struct ct_share *sh = bpf_map_lookup_elem(&pal_ct_share, &ep->slot);

	if (!sh)
		return;
	if (created)
		__sync_fetch_and_add(&sh->created[hook], 1);
	else
		__sync_fetch_and_add(&sh->removed[hook], 1);
}

/* Removes the entry under r, which `hook` of the endpoint wrote,
 * and counts it if it was there (another CPU, the LRU or the enforcer may
 * have removed it first). */
static __always_inline void ct_delete(const struct ct_ref *r, const struct ep_view *ep,
				      __u8 hook)
{
	long err;

	if (r->v4)
		err = bpf_map_delete_elem(&pal_ct4, &r->k4);
	else
		err = bpf_map_delete_elem(&pal_conntrack, &r->k6);
	if (!err)
		ct_share_count(ep, hook, false);
}

/* Creates the entry under r for `hook` of the endpoint, and counts
 * it; one that exists already (another CPU made it) is left as it is. */
static __always_inline void ct_create(const struct ct_ref *r, const struct ct_value *v,
				      const struct ep_view *ep, __u8 hook)
{
	long err;

	if (r->v4)
		err = bpf_map_update_elem(&pal_ct4, &r->k4, v, BPF_NOEXIST);
	else
		err = bpf_map_update_elem(&pal_conntrack, &r->k6, v, BPF_NOEXIST);
	if (!err)
		ct_share_count(ep, hook, true);
}

/* Is f a reply to a flow the other hook of this interface allowed?  An
 * entry of an older epoch counts only if that hook's policy still allows
 * the flow; otherwise it is forgotten. */
static __always_inline bool ct_is_reply(const struct flow *f, const struct ep_view *ep,
					__u32 ifindex, __u8 hook)
{
	__u8 writer = other_hook(hook);
	__u32 epoch = hook_epoch(ep, writer);
	struct ct_ref r;
	struct ct_value *v;

	if (!f->trackable)
		return false;
	ct_key(&r, f, true, ifindex, writer);
	v = ct_lookup(&r);
	if (!v)
		return false;
	if (v->epoch != epoch) {
		if (!hook_allows_original(ep, ifindex, writer, f)) {
			ct_delete(&r, ep, writer);
			return false;
		}
		v->epoch = epoch;
	}
	ct_touch(v);
	return true;
}

/* The entry this hook wrote for f (a forward packet's own entry), or NULL;
 * r is left holding its key either way. */
static __always_inline struct ct_value *ct_own_entry(struct ct_ref *r, const struct flow *f,
						     __u32 ifindex, __u8 hook)
{
	if (!f->trackable)
		return NULL;
	ct_key(r, f, false, ifindex, hook);
	return ct_lookup(r);
}

/* Was the flow allowed under the hook's current epoch?  Then it passes with
 * no policy lookup (refreshed in place: no LRU update per packet). */
static __always_inline bool ct_established(struct ct_value *v, const struct ep_view *ep,
					   __u8 hook)
{
	if (!v || v->epoch != hook_epoch(ep, hook))
		return false;
	ct_touch(v);
	return true;
}

enum judged {
	JUDGED_DENIED,
	JUDGED_ALLOWED,
	JUDGED_LEARNED,    /* allowed by the pod's learned overlay */
	JUDGED_OVER_SHARE, /* allowed, but a new entry would pass the hook's share */
};

/* Judges a forward packet by policy and keeps its entry (v under key r, or
 * none) in step: an allowed packet writes or refreshes it, a denied one
 * forgets it.  An allowed packet that needs a new entry while the hook
 * holds its share gets none and is dropped: passed untracked, it would
 * still make entries at its peer's hooks, which no share of this pod's
 * bounds.  With an entry (of an older epoch) the flow is established, as
 * the learned overlay counts it (hook_allows). */
static __always_inline int ct_policy_allows(const struct flow *f, const struct ep_view *ep,
					    __u32 ifindex, __u8 hook, const struct ct_ref *r,
					    struct ct_value *v)
{
	struct ct_value fresh = {};
	int by = hook_allows(ep, ifindex, hook, f, v != NULL);

	if (by == ALLOWED_NOT) {
		if (v)
			ct_delete(r, ep, hook);
		return JUDGED_DENIED;
	}
	if (v) {
		v->epoch = hook_epoch(ep, hook);
		ct_touch(v);
	} else if (f->trackable) {
		if (ct_share_full(ep, hook))
			return JUDGED_OVER_SHARE;
		fresh.last_seen_ns = seen_now();
		fresh.epoch = hook_epoch(ep, hook);
		ct_create(r, &fresh, ep, hook);
	}
	return by == ALLOWED_BY_NAME ? JUDGED_LEARNED : JUDGED_ALLOWED;
}

/* A packet of a known flow has one of two entries: its own hook's (a
 * forward packet) or the other hook's (a reply).  Both are tried before
 * policy, and in either order the verdict is the same, so the likelier
 * one goes first and saves a lookup.  A packet towards a lower port than
 * it comes from is most likely client to server, the direction whose first
 * packet made the flow's entry; a wrong guess costs one lookup, nothing
 * else. */
static __always_inline bool likely_forward(const struct flow *f)
{
	return bpf_ntohs(f->dport) < bpf_ntohs(f->sport);
}

/* Does an entry vouch for f before policy: its own hook's, of the current
 * epoch (a forward packet: *stat = STAT_ALLOWED_ESTABLISHED), or the other
 * hook's (a reply: STAT_ALLOWED_REPLY)?  The reply entry is tried first
 * unless f is likely forward.  When none does, r holds the key of f's own
 * entry and *own that entry (or NULL), for policy to keep in step. */
static __always_inline bool ct_vouches(const struct flow *f, const struct ep_view *ep,
				       __u32 ifindex, __u8 hook, struct ct_ref *r,
				       struct ct_value **own, enum pal_stat *stat)
{
	bool forward = likely_forward(f);

	*stat = STAT_ALLOWED_REPLY;
	if (!forward && ct_is_reply(f, ep, ifindex, hook))
		return true;
	*own = ct_own_entry(r, f, ifindex, hook);
	if (ct_established(*own, ep, hook)) {
		*stat = STAT_ALLOWED_ESTABLISHED;
		return true;
	}
	return forward && ct_is_reply(f, ep, ifindex, hook);
}

#endif
