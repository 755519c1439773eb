/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The IPv4 fast path.
 *
 * Most packets are IPv4 TCP/UDP/SCTP of an established flow under a plain
 * 20-byte header.  fast_path_v4 reads those in place (when at least 14
 * bytes of L4 header are there, TCP's flags included) into a struct
 * ct4_key, with no struct flow and no IPv4-mapped copies, and answers only
 * when the full path would pass the packet under the same counter: the
 * source is the pod's own (from_pod), and the entry it finds was written
 * under the current epoch of the hook that wrote it.  Anything else (other
 * header layouts, fragments, a spoofed source, a stale or absent entry) is
 * FAST_MISS and verdict judges it in full, as it did before this path
 * existed; FAST_CT_ABSENT spares the full path the lookups: the two just
 * made, or none at all for a connection's first segment
 * (opens_connection).  It reads the endpoint verdict found (ep_find): at
 * its home slot an inlined array lookup, ~1 ns, where a hash lookup by
 * ifindex costs ~6-7, so an established packet costs ~4.5-5x the bare
 * parse (scripts/bench-datapath.sh; ~6x through pal_ep_index, ~7x without
 * this path); a new flow pays the header check twice. */
#ifndef PALISADE_LIB_FAST_PATH_H
#define PALISADE_LIB_FAST_PATH_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "endpoint.h"
#include "conntrack.h"

enum fast_result {
	FAST_MISS,        /* judge by verdict's full path */
	FAST_CT_ABSENT,   /* likewise, and no conntrack entry may vouch for it:
			   * neither exists, or it opens a TCP connection */
	FAST_ESTABLISHED, /* STAT_ALLOWED_ESTABLISHED */
	FAST_REPLY,       /* STAT_ALLOWED_REPLY */
};

static __always_inline struct ct_value *ct4_lookup(const struct ct4_key *k)
{
	struct ct_value *v = bpf_map_lookup_elem(&pal_ct4, k);

	barrier_var(v);
	return v;
}

static __always_inline int fast_path_v4(struct __sk_buff *skb, const struct ep_view *ep,
					__u32 ifindex, __u8 hook)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	__u16 *ports = data + ETH_HLEN + sizeof(struct iphdr);
	__u8 writer = other_hook(hook);
	__u32 pp, keep, swap_addr, swap_ports;
	struct ct4_key k;
	struct ct_value *v;
	bool fwd;

	/* That build must take header_at for every header (see its comment). */
	if (HEADERS_BY_COPY)
		return FAST_MISS;
	/* One bound for every protocol: through TCP's flags, which shorter
	 * packets (a UDP datagram of under 6 bytes) skip to the full path. */
	if ((void *)ports + TCP_FLAGS_OFF + 1 > data_end)
		return FAST_MISS;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return FAST_MISS;
	if (*(__u8 *)ip != 0x45) /* version 4, no options */
		return FAST_MISS;
	if (ip->frag_off & bpf_htons(IPV4_MF | IPV4_FRAG_OFFSET))
		return FAST_MISS; /* fragments: see fragments.h */
	if (!has_ports(ip->protocol))
		return FAST_MISS;
	if (hook == HOOK_FROM_POD && !pod_owns_v4(ep, ip->saddr))
		return FAST_MISS;
	if (ip->protocol == IPPROTO_TCP && opens_connection(*((__u8 *)ports + TCP_FLAGS_OFF)))
		return FAST_CT_ABSENT;

	/* The likelier entry first (see likely_forward), the other one only
	 * when it is absent.  The keys are the packet's addresses and ports
	 * (both as one word) as they are or swapped: chosen by mask, and the
	 * second key is the first with every swap undone, so neither costs a
	 * branch. */
	__builtin_memcpy(&pp, ports, 4);
	fwd = bpf_ntohs(ports[1]) < bpf_ntohs(ports[0]);
	keep = fwd ? 0 : ~0U;
	swap_addr = (ip->saddr ^ ip->daddr) & keep;
	swap_ports = (pp ^ ((pp >> 16) | (pp << 16))) & keep;
	k.src = ip->saddr ^ swap_addr;
	k.dst = ip->daddr ^ swap_addr;
	pp ^= swap_ports;
	__builtin_memcpy(&k.sport, &pp, 4);
	k.ifindex = ifindex;
	k.proto = ip->protocol;
	k.hook = fwd ? hook : writer;
	k.pad[0] = 0;
	k.pad[1] = 0;
	v = ct4_lookup(&k);
	if (v) {
		if (v->epoch != hook_epoch(ep, k.hook))
			return FAST_MISS;
		ct_touch(v);
		return fwd ? FAST_ESTABLISHED : FAST_REPLY;
	}
	k.src = k.dst;
	k.dst = ip->daddr ^ ip->saddr ^ k.src;
	pp = (pp >> 16) | (pp << 16);
	__builtin_memcpy(&k.sport, &pp, 4);
	k.hook ^= 1; /* the other hook */
	v = ct4_lookup(&k);
	if (v) {
		if (v->epoch != hook_epoch(ep, k.hook))
			return FAST_MISS;
		ct_touch(v);
		return fwd ? FAST_REPLY : FAST_ESTABLISHED;
	}
	return FAST_CT_ABSENT;
}

#endif
