/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Verdict kinds (STAT_*): why a packet passed or was dropped, the one code
 * a program records for it, in pal_verdicts and in a flow event's stat.
 * pal_verdicts counts each per direction: the slot of (hook, stat) is
 * STAT_SLOT(hook, stat), so a kind added later takes new slots and never
 * moves an existing one.  The map has room for PAL_STAT_CAPACITY kinds: a
 * pinned map keeps its size across upgrades, so a new kind must fit in it.
 *
 * build.rs turns each kind into palisade_ebpf's `pub const STAT_<KIND>:
 * u32`, with the comment above it as its doc, so the enforcer's metrics
 * and flow logs read the programs' own numbers.  A kind's number is its
 * slot: never renumber one, add a new kind before STAT_COUNT.
 */
#ifndef PALISADE_LIB_REASONS_H
#define PALISADE_LIB_REASONS_H

#include "sizes.h"

enum pal_stat {
	/* Allowed by a policy rule. */
	STAT_ALLOWED_POLICY = 0,
	/* Allowed as a reply to a flow the pod's other hook allowed. */
	STAT_ALLOWED_REPLY = 1,
	/* Allowed: the pod is not isolated in that direction (policy id 0). */
	STAT_ALLOWED_UNISOLATED = 2,
	/* Dropped by policy. */
	STAT_DENIED = 3,
	/* ICMPv6 neighbour discovery (types 133-137, hop limit 255): never
	 * filtered, as ARP is never filtered for IPv4. */
	STAT_ALLOWED_NDP = 4,
	/* Dropped: the pod sent from an address not its own (struct
	 * ep_slot.addrs). */
	STAT_DENIED_SPOOF = 5,
	/* Dropped on both hooks whatever the policy: a truncated or impossible
	 * IP header. */
	STAT_DENIED_MALFORMED = 6,
	/* Forward packet of a flow the hook allowed under its current epoch:
	 * passed on one conntrack lookup, without a policy lookup. */
	STAT_ALLOWED_ESTABLISHED = 7,
	/* Later fragment of a datagram whose first fragment the hook let
	 * through under the endpoint's current epochs. */
	STAT_ALLOWED_FRAGMENT = 8,
	/* Dropped: a fragment that cannot be judged safely (lib/fragments.h): a
	 * later fragment whose first fragment the hook did not see or dropped,
	 * or that overlaps the L4 header its first fragment was judged by; a
	 * first fragment too short for its L4 header. */
	STAT_DENIED_FRAGMENT = 9,
	/* Dropped: an IPv6 packet whose L4 header lies behind more extension
	 * headers than the programs walk (IPV6_EXT_HEADERS_MAX, 7). */
	STAT_DENIED_EXT_HEADERS = 10,
	/* Dropped, never judged by another endpoint's policy: the endpoint
	 * entry found (through pal_ep_index) was not the interface's own, its
	 * slot being retired or reused under the lookup. */
	STAT_DENIED_ENDPOINT_UNSURE = 11,
	/* Dropped: a new flow the hook would allow, but the endpoint's hook
	 * already holds its share of the conntrack table (struct ct_share,
	 * struct ct_config.share). */
	STAT_DENIED_CT_SHARE = 12,
	/* Allowed by the pod's learned overlay (pal_learned): a flow of the
	 * pod's egress to an address it learned by domain name, whose entry
	 * allowed it; counted instead of STAT_ALLOWED_POLICY. */
	STAT_ALLOWED_LEARNED = 13,
	/* Number of kinds (not a kind). */
	STAT_COUNT
};

#define STAT_SLOT(hook, stat) ((stat) * PAL_STAT_DIRECTIONS + (hook))
_Static_assert(STAT_COUNT <= PAL_STAT_CAPACITY, "pal_verdicts has a slot for every kind");

#endif
