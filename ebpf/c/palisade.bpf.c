// SPDX-License-Identifier: Apache-2.0
/*
 * Palisade TC programs: Kubernetes NetworkPolicy on a pod's host-side veth.
 *
 *   palisade_from_pod  TC ingress of the host veth: packets the pod sends,
 *                      judged by the pod's EGRESS policy (peer = destination).
 *   palisade_to_pod    TC egress of the host veth: packets to the pod,
 *                      judged by the pod's INGRESS policy (peer = source).
 *
 * Verdict, in order:
 *   1. interface has no endpoint               -> next (not ours to judge)
 *      its endpoint slot is not its own         -> drop (see Endpoints)
 *   2. not IPv4/IPv6                           -> next (ARP and friends)
 *   3. malformed IP header (truncated, ihl < 5,
 *      IPv4-mapped address in IPv6); a first
 *      fragment too short for its L4 header;
 *      the L4 header behind more than
 *      IPV6_EXT_HEADERS_MAX extension headers  -> drop, whatever the policy
 *      (IPv6 extension headers are walked to the L4 header and its ports:
 *      hop-by-hop, routing, destination options, fragment, AH; ESP ends
 *      the walk, a protocol without ports)
 *   4. ICMPv6 neighbour discovery, right after
 *      the IPv6 header                         -> next (IPv6's ARP; DAD sends
 *                                                 from ::, so before step 5)
 *   5. from_pod only: source not one of the
 *      pod's own addresses                     -> drop (anti-spoofing)
 *  5a. a later fragment (no L4 header)         -> the verdict its datagram's
 *      (fragments.h)                              first fragment got on this
 *                                                 hook; drop when there is no
 *                                                 such first fragment or the
 *                                                 fragment overlaps its L4
 *                                                 header; under older epochs
 *                                                 on to 6-10, with the first
 *                                                 fragment's ports
 *   6. reply to a flow the OTHER hook of the
 *      SAME interface allowed                  -> next, refresh conntrack
 *   7. forward packet of a flow this hook
 *      allowed under the current epoch         -> next (no policy lookup)
 *      (6 and 7 in either order, same verdict: a packet to a lower port
 *      than its source tries 7 first, see likely_forward; plain IPv4
 *      headers take 5-7 on a fast path, see fast_path_v4; a TCP segment
 *      opening a connection, SYN without ACK, skips 6 and 7: no entry
 *      vouches for it, see opens_connection)
 *   8. direction not isolated (policy id 0)    -> next, track the flow
 *   9. policy(peer) and ports(proto, dport)    -> next, track the flow
 *      (the peer's longest-prefix entry: one exact lookup per prefix
 *      length the policy has, or a trie walk when it has many; see
 *      policy_entry)
 *      from_pod of a pod with EP_FLAG_LEARNS only: the pod's learned
 *      entry for the peer (a slot of pal_learned, found through
 *      pal_learned_index and used only when it names this pod and this
 *      peer; see learned_entry), when it has one, decides instead, by
 *      its own port set (the pod's whole egress verdict for that host,
 *      STAT_ALLOWED_LEARNED): a new flow ignores an entry
 *      that has expired (the table decides), an established flow re-judged
 *      under a newer epoch (6, 7) does not, so connections opened while a
 *      name was allowed outlive its TTL (see peer_allowed).  The ingress
 *      hook and staged policies never look: names are egress-only.
 *  10. anything else                           -> drop, forget the flow
 *      (8 and 9 drop a new flow instead when the hook already holds its
 *      share of the conntrack table: see struct ct_share)
 *  11. after the verdict, a packet it allowed, of a pod with
 *      EP_FLAG_LEARNS only (dns_capture.h, a global function the programs
 *      call; any other pod pays one flag test): DNS with a trusted server
 *      (pal_dns_servers) while the learner is alive (pal_dns_config)
 *        from_pod: a query                     -> copied to pal_dns_frames,
 *                                                 next
 *        to_pod: an answer (and the later
 *        fragments of one held)                -> copied and held (taken
 *                                                 from the stack, not
 *                                                 dropped: verdict_hold),
 *                                                 the enforcer re-injects it
 *                                                 after learning from it;
 *                                                 next when the copy fails
 *      (counted in pal_dns_stats; a held packet stays counted as the
 *      verdict allowed it, never as a denial)
 *
 * Conntrack: an entry is created only by step 8 or 9, i.e. by a forward
 * packet this hook's policy let through, never by a packet that matched as a
 * reply (which at most re-stamps an existing entry, see Epochs).  It is keyed by (tuple, ifindex, hook), so it vouches for replies
 * on the other hook of that one pod only: another pod cannot plant an entry
 * that a victim's hook would take as proof, and no entry is ever made from
 * a spoofed source (step 5 runs first).  A datagram's first fragment
 * carries its real ports and is judged, creates and matches entries, like
 * any packet; its later fragments, which carry none, take the verdict it
 * got (pal_frags4, pal_frags6) and neither create nor match entries
 * unless that verdict is of older epochs, when they are judged again by
 * the first fragment's ports.  So entries are keyed by real ports only,
 * and no fragment is ever judged with port 0.  IPv6 extension headers are
 * walked, so packets behind them are judged and tracked by their ports
 * too.
 *
 * IPv4 flows are tracked in pal_ct4 under a 20-byte key, IPv6 flows in
 * pal_conntrack under a 44-byte one; the rules are the same for both.
 *
 * Endpoints: a packet reads its endpoint once, from its slot of
 * pal_ep_slots (struct ep_slot): at its home position when that slot says
 * so (an inlined array lookup), else where pal_ep_index says, which is
 * trusted only when the slot names the packet's interface.  A slot that
 * does not is a slot being retired or reused under the lookup: the packet
 * is dropped (STAT_DENIED_ENDPOINT_UNSURE), never judged by what another
 * endpoint's slot holds.  Each direction's policy id and epoch are one
 * 8-byte word, read once per packet (see ep_find).
 *
 * Counters: every verdict is counted once, by account(), in pal_verdicts
 * under the direction of the hook that judged it (STAT_SLOT).
 *
 * Epochs: each direction of an endpoint has an epoch, which the enforcer
 * moves to a never-used value whenever it changes that direction's policy:
 * a new policy id, or an in-place edit of its table that narrowed it (such
 * edits only add or remove host keys, so every address sees its old or its
 * new answer in between), and on every takeover by a new enforcer.  An
 * entry remembers the epoch it was
 * allowed under.  A packet whose entry is of the current epoch passes on one
 * lookup (step 6 or 7); an entry of another epoch is re-judged by the policy
 * that wrote it and refreshed if still allowed, or deleted, so a tightened
 * policy stops established flows, their replies included, at once.  (A
 * pod's learned overlay is part of its egress policy here: an entry that
 * expired still vouches for the flows it allowed, one deleted does not.)
 *
 * Return codes (TCX composition): an allowed packet returns TC_ACT_UNSPEC,
 * which TCX reads as TCX_NEXT: the next program on the hook (another TC user
 * such as a CNI's own program) still runs, and the packet passes when none
 * is left.  TC_ACT_OK would be TCX_PASS, which ends the chain and silently
 * skips everyone after us.  A denied packet returns TC_ACT_SHOT (TCX_DROP).
 * The enforcer attaches these programs at the HEAD of each TCX chain, so
 * nothing that runs before them can redirect a packet around policy.
 *
 * The parts live in lib/, one concern a header (maps.h, parse.h,
 * endpoint.h, policy.h, conntrack.h, fast_path.h, flow_events.h, audit.h,
 * counters.h, fragments.h, dns_capture.h): this file keeps the verdict and
 * the programs.
 * What user space shares: the layouts in palisade.h, the sizes in
 * lib/sizes.h and the verdict kinds in lib/reasons.h (the last two, and
 * palisade.h's flow log counters, generated into Rust by build.rs).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/endpoint.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/fast_path.h"
#include "lib/flow_events.h"
#include "lib/audit.h"
#include "lib/counters.h"
#include "lib/fragments.h"
#include "lib/dns_capture.h"

char LICENSE[] SEC("license") = "Apache-2.0";

/* ---- verdict ---- */

/* Steps 1 to 10; the endpoint's flags (EP_FLAG_*, 0 without one) into
 * *flags, for step 11. */
static __always_inline int verdict(struct __sk_buff *skb, __u8 hook, __u32 *flags)
{
	__u32 ifindex = skb->ifindex;
	struct ct_ref own_key;
	struct ct_value *own;
	struct ep_view ep;
	struct flow f = {};
	int found, parsed, fast, judged;
	bool allowed;
	enum pal_stat stat;
	int later;

	found = ep_find(ifindex, &ep);
	if (found == EP_NONE)
		return VERDICT_NEXT;
	if (found == EP_UNSURE)
		return account(hook, STAT_DENIED_ENDPOINT_UNSURE, VERDICT_DROP);
	*flags = ep.flags;

	fast = fast_path_v4(skb, &ep, ifindex, hook);
	if (fast == FAST_ESTABLISHED)
		return account(hook, STAT_ALLOWED_ESTABLISHED, VERDICT_NEXT);
	if (fast == FAST_REPLY)
		return account(hook, STAT_ALLOWED_REPLY, VERDICT_NEXT);

	parsed = parse_flow(skb, &f);
	if (parsed == PARSE_NOT_IP)
		return VERDICT_NEXT;
	if (parsed == PARSE_MALFORMED)
		return account(hook, STAT_DENIED_MALFORMED, VERDICT_DROP);
	if (parsed == PARSE_FRAGMENT)
		return account(hook, STAT_DENIED_FRAGMENT, VERDICT_DROP);
	if (parsed == PARSE_EXT_LIMIT)
		return account(hook, STAT_DENIED_EXT_HEADERS, VERDICT_DROP);

	if (f.ndp)
		return account(hook, STAT_ALLOWED_NDP, VERDICT_NEXT);

	if (hook == HOOK_FROM_POD && !pod_owns_source(&ep, f.src)) {
		/* Logged like a policy denial (mode deny or all), under the rate
		 * limit; malformed packets above are not (no trustworthy flow). */
		flow_event(&f, ifindex, hook, FLOW_DENIED, 0, STAT_DENIED_SPOOF);
		return account(hook, STAT_DENIED_SPOOF, VERDICT_DROP);
	}

	if (f.frag == FRAG_LATER && frag_later_settled(&f, &ep, ifindex, hook, &later))
		return later;

	if (fast == FAST_CT_ABSENT || f.tcp_open) {
		/* Neither entry exists (the fast path looked) or may vouch for
		 * the packet (opens_connection): straight to policy. */
		ct_key(&own_key, &f, false, ifindex, hook);
		own = NULL;
	} else if (ct_vouches(&f, &ep, ifindex, hook, &own_key, &own, &stat)) {
		/* Steps 6 and 7, the likelier first (likely_forward). */
		return settle(&f, &ep, ifindex, hook, stat, VERDICT_NEXT);
	}

	judged = ct_policy_allows(&f, &ep, ifindex, hook, &own_key, own);
	if (judged == JUDGED_OVER_SHARE) {
		flow_event(&f, ifindex, hook, FLOW_DENIED, hook_policy(&ep, hook),
			   STAT_DENIED_CT_SHARE);
		return settle(&f, &ep, ifindex, hook, STAT_DENIED_CT_SHARE, VERDICT_DROP);
	}
	allowed = judged == JUDGED_ALLOWED || judged == JUDGED_LEARNED;
	if (judged == JUDGED_LEARNED)
		stat = STAT_ALLOWED_LEARNED;
	else
		stat = hook_policy(&ep, hook) ? STAT_ALLOWED_POLICY : STAT_ALLOWED_UNISOLATED;
	/* Staged tables are judged alone (a learning pod's by its learned
	 * entries' staged port sets first, see audit_allows). */
	audit_check(&f, &ep, ifindex, hook, allowed, allowed ? stat : STAT_DENIED);
	if (!allowed) {
		flow_event(&f, ifindex, hook, FLOW_DENIED, hook_policy(&ep, hook), STAT_DENIED);
		return settle(&f, &ep, ifindex, hook, STAT_DENIED, VERDICT_DROP);
	}
	flow_event(&f, ifindex, hook, FLOW_ALLOWED, hook_policy(&ep, hook), stat);
	return settle(&f, &ep, ifindex, hook, stat, VERDICT_NEXT);
}

/* Step 11: a learning pod's DNS, once the verdict allowed the packet. */
static __always_inline int capture_dns(struct __sk_buff *skb, __u8 hook, int judged,
				       __u32 flags)
{
	if (judged != VERDICT_NEXT || !(flags & EP_FLAG_LEARNS))
		return judged;
	return dns_capture(skb, skb->ifindex, hook);
}

SEC("classifier")
int palisade_from_pod(struct __sk_buff *skb)
{
	__u32 flags = 0;
	int judged = verdict(skb, HOOK_FROM_POD, &flags);

	return capture_dns(skb, HOOK_FROM_POD, judged, flags);
}

SEC("classifier")
int palisade_to_pod(struct __sk_buff *skb)
{
	__u32 flags = 0;
	int judged = verdict(skb, HOOK_TO_POD, &flags);

	return capture_dns(skb, HOOK_TO_POD, judged, flags);
}
