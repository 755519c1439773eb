/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Packet parsing: what the verdict needs from a packet (struct flow), read
 * from the frame's bytes, IPv6 extension headers walked to the L4 header.
 */
#ifndef PALISADE_LIB_PARSE_H
#define PALISADE_LIB_PARSE_H

#include "common.h"
#include "../palisade.h"

#define PROTO_ICMPV6 58
#define ICMPV6_NDP_FIRST 133 /* router solicitation */
#define ICMPV6_NDP_LAST 137  /* redirect */
#define NDP_HOP_LIMIT 255    /* RFC 4861: anything else is not on-link NDP */
#define IPV4_MF 0x2000          /* more fragments */
#define IPV4_FRAG_OFFSET 0x1fff /* in 8-byte units */
#define TCP_FLAGS_OFF 13 /* the byte of CWR..FIN in a TCP header */
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

/* IPv6 extension headers the programs walk to find the L4 header (IANA). */
#define IPV6_HOP_BY_HOP 0
#define IPV6_ROUTING 43
#define IPV6_FRAGMENT 44
#define IPV6_AH 51
#define IPV6_DEST_OPTS 60
#define IPV6_FRAG_OFFSET 0xfff8 /* of the fragment header: the offset, already in bytes */
#define IPV6_FRAG_MORE 0x0001
/* Most extension headers walked before the L4 header.  RFC 8200's order
 * has at most six before it (hop-by-hop, destination options, routing,
 * fragment, AH, destination options; ESP ends the walk); one more covers
 * any sane chain.  A packet whose chain goes on past it is dropped
 * (STAT_DENIED_EXT_HEADERS), never judged without its ports. */
#define IPV6_EXT_HEADERS_MAX 7

/* 1 only in a test build (ebpf/build.rs) that reads every header through
 * the paged-data fallback of header_at, which BPF_PROG_TEST_RUN cannot
 * reach otherwise: tests/verdict.rs checks both builds judge alike. */
#ifndef HEADERS_BY_COPY
#define HEADERS_BY_COPY 0
#endif

/* What the verdict needs from a packet; addresses IPv6 or IPv4-mapped. */
struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport; /* network order, 0 when the protocol has no ports */
	__u16 dport;
	__u8 proto;
	bool v4; /* src and dst are IPv4-mapped */
	bool ndp;
	/* The ports are the flow's own (read from its L4 header, or a later
	 * fragment's from its first fragment's record), so it may create or
	 * match conntrack. */
	bool trackable;
	/* A TCP segment with SYN and without ACK: the first packet of a
	 * connection, which no entry may vouch for (see opens_connection). */
	bool tcp_open;
	__u8 frag; /* FRAG_NONE, FRAG_FIRST or FRAG_LATER */
	/* A fragment's datagram, as a receiver names it (struct frag4_key,
	 * frag6_key): IPv4's protocol and the identification (IPv4's in the
	 * low 16 bits, network order). */
	__u8 frag_proto;
	/* FRAG_FIRST: where the L4 header it is judged by ends; FRAG_LATER:
	 * where it starts.  Bytes into the datagram's fragmentable part. */
	__u16 frag_at;
	__u32 frag_id;
};

#define FRAG_NONE 0  /* a whole datagram (an IPv6 atomic fragment too) */
#define FRAG_FIRST 1 /* offset 0, more to come: it holds the L4 header */
#define FRAG_LATER 2 /* offset > 0: no L4 header */

enum parse_result {
	PARSE_OK,
	PARSE_NOT_IP,
	PARSE_MALFORMED,
	PARSE_FRAGMENT,  /* a first fragment without its whole L4 header */
	PARSE_EXT_LIMIT, /* more than IPV6_EXT_HEADERS_MAX extension headers */
};

static __always_inline void v4_mapped(__u8 out[16], __be32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &addr, 4);
}

static __always_inline bool is_v4_mapped(const __u8 addr[16])
{
	__u64 head;
	__u32 mid;

	__builtin_memcpy(&head, addr, 8);
	__builtin_memcpy(&mid, addr + 8, 4);
	return head == 0 && mid == bpf_htonl(0x0000ffff);
}

static __always_inline bool has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* The extension headers the IPv6 walk steps over (ipv6_step). */
static __always_inline bool ipv6_walks(__u8 nexthdr)
{
	switch (nexthdr) {
	case IPV6_HOP_BY_HOP:
	case IPV6_ROUTING:
	case IPV6_FRAGMENT:
	case IPV6_AH:
	case IPV6_DEST_OPTS:
		return true;
	default:
		return false;
	}
}

/* IANA's other extension headers, which the walk does not enter: what
 * follows one is unknown, so the packet is judged as that protocol with
 * port 0 (which fails closed under port rules) and stays out of
 * conntrack.  (ESP is a protocol without ports, as under IPv4.) */
static __always_inline bool ipv6_is_opaque(__u8 nexthdr)
{
	switch (nexthdr) {
	case 135: /* mobility */
	case 139: /* HIP */
	case 140: /* shim6 */
	case 253: /* experimental */
	case 254: /* experimental */
		return true;
	default:
		return false;
	}
}

/* The fixed L4 header a verdict reads: TCP's up to its options (ports and
 * flags), UDP's, SCTP's common header; nothing of protocols without ports. */
static __always_inline __u32 l4_header_len(__u8 proto)
{
	switch (proto) {
	case IPPROTO_TCP:
		return 20;
	case IPPROTO_UDP:
		return 8;
	case IPPROTO_SCTP:
		return 12;
	default:
		return 0;
	}
}

/* The len bytes at off, read in place when they are in the skb's linear
 * area (the usual case: a veth hands over frames whose headers are linear)
 * and copied into buf by bpf_skb_load_bytes when they are in paged data,
 * like the kernel's skb_header_pointer.  NULL when the packet is shorter.
 * The copy leaves the skb alone; bpf_skb_pull_data would linearise it for
 * every later hook too, at the price of reallocating its head, which is
 * more than copying at most 40 bytes for a case that is rare here.  (This
 * kernel's BPF_PROG_TEST_RUN cannot build a non-linear skb, so a real
 * pull cannot be timed; the benchmark's established_fwd_by_copy row times
 * the copy forced on every header: ~3x the bare parse, ~25-30 ns, more
 * than reading in place.) */
static __always_inline const void *header_at(struct __sk_buff *skb, __u32 off, __u32 len,
					     void *buf)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (!HEADERS_BY_COPY && data + off + len <= data_end)
		return data + off;
	if (bpf_skb_load_bytes(skb, off, buf, len) < 0)
		return NULL;
	return buf;
}

/* Does a TCP segment with these flags open a connection (SYN without
 * ACK)?  Such a segment is never a reply to a flow we track (the answer to
 * a SYN carries ACK) and never needs an entry to pass: policy judges it
 * under the hook's current epoch, which gives the verdict an entry of that
 * epoch would (an entry outlives a policy change only with its epoch
 * moved).  So it skips both conntrack lookups, two of the three hash walks
 * a new connection would cost.  The one exchange this judges differently
 * is a TCP simultaneous open, where each side's SYN crosses the other's:
 * such a SYN meets the policy of the hook it arrives at, never the entry of
 * the other, so it fails closed. */
static __always_inline bool opens_connection(__u8 flags)
{
	return (flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

/* TCP, UDP and SCTP all start with source port then destination port. */
static __always_inline int parse_ports(struct __sk_buff *skb, __u32 l4_off, struct flow *f)
{
	__u16 buf[2];
	__u8 flags_buf;
	const __u16 *ports = header_at(skb, l4_off, sizeof(buf), buf);
	const __u8 *flags;

	if (!ports)
		return PARSE_MALFORMED;
	f->sport = ports[0];
	f->dport = ports[1];
	if (f->proto != IPPROTO_TCP)
		return PARSE_OK;
	/* A TCP header cut before its flags opens nothing: it takes the
	 * lookups like any other segment. */
	flags = header_at(skb, l4_off + TCP_FLAGS_OFF, 1, &flags_buf);
	f->tcp_open = flags && opens_connection(*flags);
	return PARSE_OK;
}

/* Does a first fragment hold its whole L4 header (struct flow.frag_at)?
 * One that does not (the tiny fragment attack, RFC 1858 and 3128) would
 * leave part of what its verdict reads to a later fragment.  start: the
 * first byte of its fragmentable part; l4_off: its L4 header's; end: where
 * its IP header says it ends. */
static __always_inline bool frag_first_whole(struct __sk_buff *skb, struct flow *f, __u32 start,
					     __u32 l4_off, __u32 end)
{
	__u32 l4_end = l4_off + l4_header_len(f->proto);

	if (l4_end > end || l4_end > skb->len)
		return false;
	f->frag_at = l4_end - start;
	return true;
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow *f)
{
	struct iphdr buf;
	const struct iphdr *ip = header_at(skb, ETH_HLEN, sizeof(buf), &buf);
	__u32 l4_off;
	__u16 frag;

	if (!ip)
		return PARSE_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;
	v4_mapped(f->src, ip->saddr);
	v4_mapped(f->dst, ip->daddr);
	f->proto = ip->protocol;
	f->v4 = true;
	l4_off = ETH_HLEN + ip->ihl * 4;
	frag = bpf_ntohs(ip->frag_off);
	if (frag & (IPV4_MF | IPV4_FRAG_OFFSET)) {
		f->frag_proto = ip->protocol;
		f->frag_id = ip->id;
		/* A later fragment carries no L4 header: it is judged by its
		 * first fragment's record (fragments.h). */
		if (frag & IPV4_FRAG_OFFSET) {
			f->frag = FRAG_LATER;
			f->frag_at = (frag & IPV4_FRAG_OFFSET) * 8;
			return PARSE_OK;
		}
		f->frag = FRAG_FIRST;
		if (!frag_first_whole(skb, f, l4_off, l4_off, ETH_HLEN + bpf_ntohs(ip->tot_len)))
			return PARSE_FRAGMENT;
	}
	f->trackable = true;
	if (!has_ports(ip->protocol))
		return PARSE_OK;
	return parse_ports(skb, l4_off, f);
}

/* Where the IPv6 walk is: at the header of type nexthdr at off. */
struct ipv6_walk {
	__u32 off;
	__u32 frag_start; /* a first fragment's fragmentable part starts here */
	__u8 nexthdr;
	bool frag_seen;
};

enum ipv6_step_result {
	EXT_NEXT,      /* stepped over one */
	EXT_LATER,     /* a later fragment's fragment header: no L4 header follows */
	EXT_MALFORMED, /* truncated, or a second fragment header (RFC 8200: one) */
};

/* Steps over the extension header at w->off, one ipv6_walks names.  A
 * fragment header names its datagram in f (unless it is an atomic
 * fragment, a whole packet: RFC 6946). */
static __always_inline int ipv6_step(struct __sk_buff *skb, struct ipv6_walk *w, struct flow *f)
{
	__u8 buf[8]; /* every extension header is at least 8 bytes */
	const __u8 *h = header_at(skb, w->off, sizeof(buf), buf);
	__u16 frag;

	if (!h)
		return EXT_MALFORMED;
	if (w->nexthdr != IPV6_FRAGMENT) {
		/* AH counts its length in 4-byte words less 2, the others in
		 * 8-byte units less 1. */
		__u32 len = w->nexthdr == IPV6_AH ? ((__u32)h[1] + 2) * 4 : ((__u32)h[1] + 1) * 8;

		w->nexthdr = h[0];
		w->off += len;
		return EXT_NEXT;
	}
	if (w->frag_seen)
		return EXT_MALFORMED;
	w->frag_seen = true;
	w->nexthdr = h[0];
	w->off += sizeof(buf);
	__builtin_memcpy(&frag, h + 2, sizeof(frag));
	frag = bpf_ntohs(frag);
	if (!(frag & (IPV6_FRAG_OFFSET | IPV6_FRAG_MORE)))
		return EXT_NEXT;
	__builtin_memcpy(&f->frag_id, h + 4, sizeof(f->frag_id));
	if (frag & IPV6_FRAG_OFFSET) {
		f->frag = FRAG_LATER;
		f->frag_at = frag & IPV6_FRAG_OFFSET;
		return EXT_LATER;
	}
	f->frag = FRAG_FIRST;
	w->frag_start = w->off;
	return EXT_NEXT;
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow *f)
{
	struct ipv6hdr buf;
	const struct ipv6hdr *ip = header_at(skb, ETH_HLEN, sizeof(buf), &buf);
	struct ipv6_walk w = {};
	const __u8 *icmp_type;
	__u8 icmp_buf, hop_limit;
	__u32 end;
	int walked;

	if (!ip)
		return PARSE_MALFORMED;
	if (ip->version != 6)
		return PARSE_MALFORMED;
	__builtin_memcpy(f->src, &ip->saddr, 16);
	__builtin_memcpy(f->dst, &ip->daddr, 16);
	/* IPv4-mapped addresses never appear on an IPv6 wire (Linux drops them
	 * on receive); here they would pass for the IPv4 address in the maps. */
	if (is_v4_mapped(f->src) || is_v4_mapped(f->dst))
		return PARSE_MALFORMED;
	hop_limit = ip->hop_limit;
	w.off = ETH_HLEN + sizeof(struct ipv6hdr);
	w.nexthdr = ip->nexthdr;
	end = w.off + bpf_ntohs(ip->payload_len);
	/* The extension headers, to the L4 header and its ports. */
	for (walked = 0; walked <= IPV6_EXT_HEADERS_MAX; walked++) {
		int step;

		if (!ipv6_walks(w.nexthdr))
			break;
		if (walked == IPV6_EXT_HEADERS_MAX)
			return PARSE_EXT_LIMIT;
		step = ipv6_step(skb, &w, f);
		if (step == EXT_MALFORMED)
			return PARSE_MALFORMED;
		if (step == EXT_LATER) {
			f->proto = w.nexthdr;
			return PARSE_OK;
		}
	}
	f->proto = w.nexthdr;
	if (f->frag == FRAG_FIRST && !frag_first_whole(skb, f, w.frag_start, w.off, end))
		return PARSE_FRAGMENT;
	if (ipv6_is_opaque(w.nexthdr))
		return PARSE_OK;
	f->trackable = true;
	if (has_ports(w.nexthdr))
		return parse_ports(skb, w.off, f);
	/* Neighbour discovery only right after the IPv6 header, as it is sent:
	 * behind an extension header (MLD's hop-by-hop router alert, or a
	 * fragment header, which RFC 6980 forbids NDP) ICMPv6 is judged like
	 * any other protocol. */
	if (walked == 0 && w.nexthdr == PROTO_ICMPV6 && hop_limit == NDP_HOP_LIMIT) {
		icmp_type = header_at(skb, w.off, 1, &icmp_buf);
		if (!icmp_type)
			return PARSE_MALFORMED;
		f->ndp = *icmp_type >= ICMPV6_NDP_FIRST && *icmp_type <= ICMPV6_NDP_LAST;
	}
	return PARSE_OK;
}

static __always_inline int parse_flow(struct __sk_buff *skb, struct flow *f)
{
	__be16 buf;
	const __be16 *eth_proto;

	/* Read the frame, not skb->protocol, so the verdict depends only on
	 * the bytes (and BPF_PROG_TEST_RUN sees what the wire sees). */
	eth_proto = header_at(skb, offsetof(struct ethhdr, h_proto), sizeof(buf), &buf);
	if (!eth_proto)
		return PARSE_NOT_IP;
	if (*eth_proto == bpf_htons(ETH_P_IP))
		return parse_ipv4(skb, f);
	if (*eth_proto == bpf_htons(ETH_P_IPV6))
		return parse_ipv6(skb, f);
	return PARSE_NOT_IP;
}

#endif
