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
	if (policy_allows(audit_id, peer, f->proto, f->dport) == allowed)
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
