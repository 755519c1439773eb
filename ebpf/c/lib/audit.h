/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staged (audit) policies: what a staged table would change, reported and
 * never enforced.
 */
#ifndef PALISADE_LIB_AUDIT_H
#define PALISADE_LIB_AUDIT_H

#include "common.h"
#include "parse.h"
#include "endpoint.h"
#include "policy.h"
#include "flow_events.h"

/* Would the staged table audit_id allow the new flow f to or from peer?
 * A learning pod's egress consults its learned entry for the peer first,
 * as the enforced egress does: the entry's staged port set (its staged
 * rules by name included) decides when it has one; else the table.  The
 * entry's liveness is the enforced one's (a new flow: not expired). */
static __always_inline bool audit_allows(const struct ep_view *ep, __u32 ifindex, bool egress,
					 __u32 audit_id, const __u8 *peer, const struct flow *f)
{
	struct learned_key lk = {};
	__u32 portset = 0, staged = 0;

	if (egress && (ep->flags & EP_FLAG_LEARNS)) {
		lk.ifindex = ifindex;
		__builtin_memcpy(lk.addr, peer, 16);
		if (learned_entry(&lk, 0, &portset, &staged) && staged)
			return portset_allows(staged, f->proto, f->dport);
	}
	return policy_allows(audit_id, peer, f->proto, f->dport);
}

/* Judges a new flow by the pod's staged (audit) policy table for this
 * direction, if it has one, and reports a flow whose verdict that table
 * would change.  Never changes the verdict: it only reads the tables and
 * writes an event and a counter.  stat: the STAT_* slot the packet is
 * counted under.  The staged ids are one word of the endpoint's slot,
 * read once. */
static __always_inline void audit_check(const struct flow *f, const struct ep_view *ep,
					__u32 ifindex, __u8 hook, bool allowed, enum pal_stat stat)
{
	__u64 staged = READ_ONCE_U64(&ep->s->audit);
	const __u8 *peer = hook == HOOK_FROM_POD ? f->dst : f->src;
	bool egress = hook == HOOK_FROM_POD;
	__u32 audit_id = egress ? (__u32)(staged >> 32) : (__u32)staged;

	if (!audit_id)
		return;
	if (audit_allows(ep, ifindex, egress, audit_id, peer, f) == allowed)
		return;
	if (allowed) {
		flow_count(egress ? FLOW_STAT_WOULD_DENY_EGRESS : FLOW_STAT_WOULD_DENY_INGRESS);
		flow_event(f, ifindex, hook, FLOW_WOULD_DENY, audit_id, stat);
	} else {
		flow_count(egress ? FLOW_STAT_WOULD_ALLOW_EGRESS : FLOW_STAT_WOULD_ALLOW_INGRESS);
		flow_event(f, ifindex, hook, FLOW_WOULD_ALLOW, audit_id, stat);
	}
}

#endif
