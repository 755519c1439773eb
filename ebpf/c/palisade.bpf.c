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
 *  10. anything else                           -> drop, forget the flow
 *      (8 and 9 drop a new flow instead when the hook already holds its
 *      share of the conntrack table: see struct ct_share)
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
 * policy stops established flows, their replies included, at once.
 *
 * Return codes (TCX composition): an allowed packet returns TC_ACT_UNSPEC,
 * which TCX reads as TCX_NEXT: the next program on the hook (another TC user
 * such as a CNI's own program) still runs, and the packet passes when none
 * is left.  TC_ACT_OK would be TCX_PASS, which ends the chain and silently
 * skips everyone after us.  A denied packet returns TC_ACT_SHOT (TCX_DROP).
 * The enforcer attaches these programs at the HEAD of each TCX chain, so
 * nothing that runs before them can redirect a packet around policy.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "palisade.h"

#define VERDICT_NEXT TC_ACT_UNSPEC /* TCX_NEXT: allowed, later programs run */
#define VERDICT_DROP TC_ACT_SHOT   /* TCX_DROP */

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

char LICENSE[] SEC("license") = "Apache-2.0";

/* ---- maps (pinned by name so every pod's programs share one copy) ---- */

/* Endpoint state, one slot per endpoint (struct ep_slot: how a packet
 * finds and trusts its slot).  Memory-mapped, so the enforcer changes a
 * direction's policy and epoch with one 8-byte store. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, EP_SLOTS);
	__type(key, __u32);
	__type(value, struct ep_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ep_slots SEC(".maps");

/* ifindex -> slot of pal_ep_slots, for an endpoint not (yet) trusted at
 * its home slot. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EP_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ep_index SEC(".maps");

/* Conntrack entries per endpoint hook (struct ct_share), by slot.
 * Memory-mapped: the enforcer's recount adds to it atomically. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, EP_SLOTS);
	__type(key, __u32);
	__type(value, struct ct_share);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ct_share SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ct_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ct_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy SEC(".maps");

/* The trie's entries again, found by exact key: a policy whose entries
 * have few distinct prefix lengths (pal_policy_lens) is looked up one hash
 * lookup per length, whose cost does not grow with its size as a trie
 * walk does.  Always a subset of pal_policy (written after it, removed
 * before it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy_exact SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct policy_lens);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy_lens SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct port_key);
	__type(value, struct port_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct4_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_ct4 SEC(".maps");

/* Verdict counters by direction (STAT_SLOT), with room for STAT_CAPACITY
 * kinds.  A pinned map keeps its size across upgrades, so the maps of
 * older versions, which had no room for later kinds, are left behind under
 * their own names (pal_stats: one slot per kind; pal_dir_stats: exactly
 * STAT_MAX kinds). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_CAPACITY * STAT_DIRECTIONS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_verdicts SEC(".maps");

/* Flow events for the enforcer's flow log (see struct flow_event).  The
 * buffer is bounded: when it is full an event is dropped and counted, the
 * packet's verdict never waits for user space. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_stats SEC(".maps");

/* The flow log's rate limit: one node-wide GCRA clock (see flow_admit).
 * Pinned so that a restarted enforcer's programs, which take the links over
 * one at a time, share it with the old ones and no restart grants a fresh
 * burst. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_flow_bucket SEC(".maps");

/* ---- packet parsing ---- */

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

/* ---- endpoints ---- */

/* One plain load the compiler may neither split nor repeat. */
#define READ_ONCE_U32(p) (*(volatile __u32 *)(p))
#define READ_ONCE_U64(p) (*(volatile __u64 *)(p))

/* What a packet reads of its endpoint, once: its slot (addresses, which
 * do not change while the slot is the endpoint's) and each direction's
 * word, one load each, so every decision about this packet uses one
 * consistent policy id and epoch per direction. */
struct ep_view {
	const struct ep_slot *s;
	__u32 slot;
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
	__u32 slot = ifindex & (EP_SLOTS - 1);
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
	for (int i = 0; i < MAX_POD_ADDRS; i++) {
		if (i >= ep->s->addr_count)
			return false;
		if (addr_eq(ep->s->addrs[i], src))
			return true;
	}
	return false;
}

/* ---- the two hooks of an endpoint ---- */

/* What a hook judges by: the endpoint's policy id and epoch for its
 * direction, from the one word the packet read. */
static __always_inline __u64 hook_word(const struct ep_view *ep, __u8 owner)
{
	return owner == OWNER_FROM_POD ? ep->egress : ep->ingress;
}

static __always_inline __u32 hook_policy(const struct ep_view *ep, __u8 owner)
{
	return EP_WORD_POLICY(hook_word(ep, owner));
}

static __always_inline __u32 hook_epoch(const struct ep_view *ep, __u8 owner)
{
	return EP_WORD_EPOCH(hook_word(ep, owner));
}

static __always_inline __u8 other_hook(__u8 owner)
{
	return owner == OWNER_FROM_POD ? OWNER_TO_POD : OWNER_FROM_POD;
}

/* ---- policy ---- */

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
	for (int i = 0; i < MAX_POLICY_LENS; i++) {
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

/* Does the hook `owner` of ep allow the forward packet f? */
static __always_inline bool hook_allows(const struct ep_view *ep, __u8 owner,
					const struct flow *f)
{
	const __u8 *peer = owner == OWNER_FROM_POD ? f->dst : f->src;

	return policy_allows(hook_policy(ep, owner), peer, f->proto, f->dport);
}

/* Would the hook `owner` of ep still allow the flow that f replies to?
 * The original flow is f reversed: its peer is f's source when it was
 * judged as egress (destination), f's destination when judged as ingress
 * (source); its destination port is f's source port. */
static __always_inline bool hook_allows_original(const struct ep_view *ep, __u8 owner,
						 const struct flow *f)
{
	const __u8 *peer = owner == OWNER_FROM_POD ? f->src : f->dst;

	return policy_allows(hook_policy(ep, owner), peer, f->proto, f->sport);
}

/* ---- conntrack ---- */

/* How far CLOCK_MONOTONIC_COARSE may lag CLOCK_MONOTONIC: one tick, 10 ms
 * at the slowest HZ (100), doubled for safety. */
#define COARSE_CLOCK_LAG_NS (20ULL * 1000 * 1000)

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

/* The key of the entry hook `owner` of ifindex writes for the flow whose
 * packet is f (reverse: for the flow f replies to). */
static __always_inline void ct_key(struct ct_ref *r, const struct flow *f, bool reverse,
				   __u32 ifindex, __u8 owner)
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
		r->k4.owner = owner;
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
	r->k6.owner = owner;
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

/* Does hook `owner` of the endpoint hold its share of entries already?
 * Read without a lock: CPUs creating entries at the same moment may pass
 * the share by one each, never more. */
static __always_inline bool ct_share_full(const struct ep_view *ep, __u8 owner)
{
	__u32 zero = 0;
	const struct ct_config *cfg = bpf_map_lookup_elem(&pal_ct_config, &zero);
	const struct ct_share *sh = bpf_map_lookup_elem(&pal_ct_share, &ep->slot);

	if (!cfg || !sh)
		return true;
	return READ_ONCE_U64(&sh->created[owner]) - READ_ONCE_U64(&sh->removed[owner]) >=
	       cfg->share;
}

/* Counts an entry hook `owner` of the endpoint created or removed. */
static __always_inline void ct_share_count(const struct ep_view *ep, __u8 owner, bool created)
{
	struct ct_share *sh = bpf_map_lookup_elem(&pal_ct_share, &ep->slot);

	if (!sh)
		return;
	if (created)
		__sync_fetch_and_add(&sh->created[owner], 1);
	else
		__sync_fetch_and_add(&sh->removed[owner], 1);
}

/* Removes the entry under r, which hook `owner` of the endpoint wrote,
 * and counts it if it was there (another CPU, the LRU or the enforcer may
 * have removed it first). */
static __always_inline void ct_delete(const struct ct_ref *r, const struct ep_view *ep,
				      __u8 owner)
{
	long err;

	if (r->v4)
		err = bpf_map_delete_elem(&pal_ct4, &r->k4);
	else
		err = bpf_map_delete_elem(&pal_conntrack, &r->k6);
	if (!err)
		ct_share_count(ep, owner, false);
}

/* Creates the entry under r for hook `owner` of the endpoint, and counts
 * it; one that exists already (another CPU made it) is left as it is. */
static __always_inline void ct_create(const struct ct_ref *r, const struct ct_value *v,
				      const struct ep_view *ep, __u8 owner)
{
	long err;

	if (r->v4)
		err = bpf_map_update_elem(&pal_ct4, &r->k4, v, BPF_NOEXIST);
	else
		err = bpf_map_update_elem(&pal_conntrack, &r->k6, v, BPF_NOEXIST);
	if (!err)
		ct_share_count(ep, owner, true);
}

/* Is f a reply to a flow the other hook of this interface allowed?  An
 * entry of an older epoch counts only if that hook's policy still allows
 * the flow; otherwise it is forgotten. */
static __always_inline bool ct_is_reply(const struct flow *f, const struct ep_view *ep,
					__u32 ifindex, __u8 owner)
{
	__u8 writer = other_hook(owner);
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
		if (!hook_allows_original(ep, writer, f)) {
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
						     __u32 ifindex, __u8 owner)
{
	if (!f->trackable)
		return NULL;
	ct_key(r, f, false, ifindex, owner);
	return ct_lookup(r);
}

/* Was the flow allowed under the hook's current epoch?  Then it passes with
 * no policy lookup (refreshed in place: no LRU update per packet). */
static __always_inline bool ct_established(struct ct_value *v, const struct ep_view *ep,
					   __u8 owner)
{
	if (!v || v->epoch != hook_epoch(ep, owner))
		return false;
	ct_touch(v);
	return true;
}

enum judged {
	JUDGED_DENIED,
	JUDGED_ALLOWED,
	JUDGED_OVER_SHARE, /* allowed, but a new entry would pass the hook's share */
};

/* Judges a forward packet by policy and keeps its entry (v under key r, or
 * none) in step: an allowed packet writes or refreshes it, a denied one
 * forgets it.  An allowed packet that needs a new entry while the hook
 * holds its share gets none and is dropped: passed untracked, it would
 * still make entries at its peer's hooks, which no share of this pod's
 * bounds. */
static __always_inline int ct_policy_allows(const struct flow *f, const struct ep_view *ep,
					    __u8 owner, const struct ct_ref *r,
					    struct ct_value *v)
{
	struct ct_value fresh = {};

	if (!hook_allows(ep, owner, f)) {
		if (v)
			ct_delete(r, ep, owner);
		return JUDGED_DENIED;
	}
	if (v) {
		v->epoch = hook_epoch(ep, owner);
		ct_touch(v);
	} else if (f->trackable) {
		if (ct_share_full(ep, owner))
			return JUDGED_OVER_SHARE;
		fresh.last_seen_ns = seen_now();
		fresh.epoch = hook_epoch(ep, owner);
		ct_create(r, &fresh, ep, owner);
	}
	return JUDGED_ALLOWED;
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


/* ---- the IPv4 fast path ----
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

enum fast_result {
	FAST_MISS,        /* judge by verdict's full path */
	FAST_CT_ABSENT,   /* likewise, and no conntrack entry may vouch for it:
			   * neither exists, or it opens a TCP connection */
	FAST_ESTABLISHED, /* STAT_ALLOWED_ESTABLISHED */
	FAST_REPLY,       /* STAT_ALLOWED_REPLY */
};

/* Is saddr one of the pod's IPv4 addresses? */
static __always_inline bool pod_owns_v4(const struct ep_view *ep, __be32 saddr)
{
#pragma unroll
	for (int i = 0; i < MAX_POD_ADDRS; i++) {
		if (i >= ep->s->v4_count)
			return false;
		if (ep->s->v4[i] == saddr)
			return true;
	}
	return false;
}

static __always_inline struct ct_value *ct4_lookup(const struct ct4_key *k)
{
	struct ct_value *v = bpf_map_lookup_elem(&pal_ct4, k);

	barrier_var(v);
	return v;
}

static __always_inline int fast_path_v4(struct __sk_buff *skb, const struct ep_view *ep,
					__u32 ifindex, __u8 owner)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	__u16 *ports = data + ETH_HLEN + sizeof(struct iphdr);
	__u8 writer = other_hook(owner);
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
	if (owner == OWNER_FROM_POD && !pod_owns_v4(ep, ip->saddr))
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
	k.owner = fwd ? owner : writer;
	k.pad[0] = 0;
	k.pad[1] = 0;
	v = ct4_lookup(&k);
	if (v) {
		if (v->epoch != hook_epoch(ep, k.owner))
			return FAST_MISS;
		ct_touch(v);
		return fwd ? FAST_ESTABLISHED : FAST_REPLY;
	}
	k.src = k.dst;
	k.dst = ip->daddr ^ ip->saddr ^ k.src;
	pp = (pp >> 16) | (pp << 16);
	__builtin_memcpy(&k.sport, &pp, 4);
	k.owner ^= 1; /* the other hook */
	v = ct4_lookup(&k);
	if (v) {
		if (v->epoch != hook_epoch(ep, k.owner))
			return FAST_MISS;
		ct_touch(v);
		return fwd ? FAST_REPLY : FAST_ESTABLISHED;
	}
	return FAST_CT_ABSENT;
}

/* ---- flow events ---- */

static __always_inline void flow_count(__u32 stat)
{
	__u64 *count = bpf_map_lookup_elem(&pal_flow_stats, &stat);

	if (count)
		*count += 1;
}

/* How many times flow_admit retries its compare-and-swap when other CPUs
 * move the clock under it.  Each failure means another CPU just admitted
 * an event, so giving up (the event counts as rate limited) is fair, and
 * the bound keeps the verifier's loop analysis trivial. */
#define FLOW_ADMIT_TRIES 4

/* The node-wide rate limit: a token bucket of `burst` tokens refilled at
 * `rate_per_sec`, kept as GCRA (the generic cell rate algorithm), which
 * needs one 64-bit word instead of a token count, a timestamp and a lock.
 * The word is the "theoretical arrival time" tat: the time at which the
 * bucket would be full again.  An event costs one interval (1 s / rate);
 * it is admitted when, after paying, the bucket is at most `burst`
 * intervals in debt:  max(tat, now) + interval - now <= burst * interval.
 * So over any span of t seconds at most burst + rate * t events pass, for
 * the whole node at once (every CPU shares the word; a CPU that loses the
 * compare-and-swap re-reads and retries).  Under a flood most calls only
 * read the word and see the debt too high, so the shared cache line is
 * written at most `rate` times a second. */
static __always_inline bool flow_admit(const struct flow_config *cfg, __u64 now)
{
	__u32 zero = 0;
	__u64 *tat = bpf_map_lookup_elem(&pal_flow_bucket, &zero);
	__u64 interval, limit, old, start, next;
	__u32 burst = cfg->burst ? cfg->burst : 1;

	if (!tat)
		return false;
	interval = 1000000000ULL / cfg->rate_per_sec;
	limit = (__u64)burst * interval;
#pragma unroll
	for (int i = 0; i < FLOW_ADMIT_TRIES; i++) {
		old = READ_ONCE_U64(tat);
		start = old > now ? old : now;
		next = start + interval;
		if (next - now > limit)
			return false;
		if (__sync_val_compare_and_swap(tat, old, next) == old)
			return true;
	}
	return false;
}

/* Sends one event of kind `kind` about f, if the configured mode wants it
 * and the rate limit lets it through.  Never affects the verdict: a full
 * ring buffer or an exhausted rate drops the event and counts it.  Staged
 * policies' FLOW_WOULD_* events are sent in every mode (staging a policy
 * is the opt-in), under the same rate limit. */
static __always_inline void flow_event(const struct flow *f, __u32 ifindex, __u8 owner,
				       __u8 kind, __u32 policy_id, __u8 stat)
{
	__u32 zero = 0;
	struct flow_config *cfg = bpf_map_lookup_elem(&pal_flow_config, &zero);
	struct flow_event *e;
	__u64 now;

	if (!cfg)
		return;
	if (kind == FLOW_ALLOWED && cfg->mode != FLOW_LOG_ALL)
		return;
	if (kind == FLOW_DENIED && cfg->mode == FLOW_LOG_OFF)
		return;
	if (cfg->rate_per_sec == 0)
		return;
	now = bpf_ktime_get_ns();
	if (!flow_admit(cfg, now)) {
		flow_count(FLOW_STAT_RATE_LIMITED);
		return;
	}
	e = bpf_ringbuf_reserve(&pal_flow_events, sizeof(*e), 0);
	if (!e) {
		flow_count(FLOW_STAT_OVERFLOW);
		return;
	}
	e->ts_ns = now;
	e->ifindex = ifindex;
	e->policy_id = policy_id;
	__builtin_memcpy(e->src, f->src, 16);
	__builtin_memcpy(e->dst, f->dst, 16);
	e->sport = f->sport;
	e->dport = f->dport;
	e->proto = f->proto;
	e->owner = owner;
	e->kind = kind;
	e->stat = stat;
	bpf_ringbuf_submit(e, 0);
	flow_count(FLOW_STAT_EMITTED);
}

/* ---- staged (audit) policies ---- */

/* Judges a new flow by the pod's staged (audit) policy table for this
 * direction, if it has one, and reports a flow whose verdict that table
 * would change.  Never changes the verdict: it only reads the tables and
 * writes an event and a counter.  stat: the STAT_* slot the packet is
 * counted under.  The staged ids are one word of the endpoint's slot,
 * read once. */
static __always_inline void audit_check(const struct flow *f, const struct ep_view *ep,
					__u32 ifindex, __u8 owner, bool allowed, __u32 stat)
{
	__u64 staged = READ_ONCE_U64(&ep->s->audit);
	const __u8 *peer = owner == OWNER_FROM_POD ? f->dst : f->src;
	bool egress = owner == OWNER_FROM_POD;
	__u32 audit_id = egress ? (__u32)(staged >> 32) : (__u32)staged;

	if (!audit_id)
		return;
	if (policy_allows(audit_id, peer, f->proto, f->dport) == allowed)
		return;
	if (allowed) {
		flow_count(egress ? FLOW_STAT_WOULD_DENY_EGRESS : FLOW_STAT_WOULD_DENY_INGRESS);
		flow_event(f, ifindex, owner, FLOW_WOULD_DENY, audit_id, stat);
	} else {
		flow_count(egress ? FLOW_STAT_WOULD_ALLOW_EGRESS : FLOW_STAT_WOULD_ALLOW_INGRESS);
		flow_event(f, ifindex, owner, FLOW_WOULD_ALLOW, audit_id, stat);
	}
}

/* ---- verdict ---- */

/* The one place that counts: every verdict goes through it once, under
 * the direction of the hook that judged it. */
static __always_inline int account(__u8 owner, __u32 stat, int verdict)
{
	__u32 slot = STAT_SLOT(owner, stat);
	__u64 *count = bpf_map_lookup_elem(&pal_verdicts, &slot);

	if (count)
		*count += 1; /* per-CPU slot: no atomics needed */
	return verdict;
}

#include "fragments.h"

static __always_inline int verdict(struct __sk_buff *skb, __u8 owner)
{
	__u32 ifindex = skb->ifindex;
	struct ct_ref own_key;
	struct ct_value *own;
	struct ep_view ep;
	struct flow f = {};
	int found, parsed, fast, judged;
	bool allowed;
	__u32 stat;
	int later;

	found = ep_find(ifindex, &ep);
	if (found == EP_NONE)
		return VERDICT_NEXT;
	if (found == EP_UNSURE)
		return account(owner, STAT_DENIED_ENDPOINT_UNSURE, VERDICT_DROP);

	fast = fast_path_v4(skb, &ep, ifindex, owner);
	if (fast == FAST_ESTABLISHED)
		return account(owner, STAT_ALLOWED_ESTABLISHED, VERDICT_NEXT);
	if (fast == FAST_REPLY)
		return account(owner, STAT_ALLOWED_REPLY, VERDICT_NEXT);

	parsed = parse_flow(skb, &f);
	if (parsed == PARSE_NOT_IP)
		return VERDICT_NEXT;
	if (parsed == PARSE_MALFORMED)
		return account(owner, STAT_DENIED_MALFORMED, VERDICT_DROP);
	if (parsed == PARSE_FRAGMENT)
		return account(owner, STAT_DENIED_FRAGMENT, VERDICT_DROP);
	if (parsed == PARSE_EXT_LIMIT)
		return account(owner, STAT_DENIED_EXT_HEADERS, VERDICT_DROP);

	if (f.ndp)
		return account(owner, STAT_ALLOWED_NDP, VERDICT_NEXT);

	if (owner == OWNER_FROM_POD && !pod_owns_source(&ep, f.src)) {
		/* Logged like a policy denial (mode deny or all), under the rate
		 * limit; malformed packets above are not (no trustworthy flow). */
		flow_event(&f, ifindex, owner, FLOW_DENIED, 0, STAT_DENIED_SPOOF);
		return account(owner, STAT_DENIED_SPOOF, VERDICT_DROP);
	}

	if (f.frag == FRAG_LATER && frag_later_settled(&f, &ep, ifindex, owner, &later))
		return later;

	if (fast == FAST_CT_ABSENT || f.tcp_open) {
		/* Neither entry exists (the fast path looked) or may vouch for
		 * the packet (opens_connection): straight to policy. */
		ct_key(&own_key, &f, false, ifindex, owner);
		own = NULL;
	} else if (likely_forward(&f)) {
		own = ct_own_entry(&own_key, &f, ifindex, owner);
		if (ct_established(own, &ep, owner))
			return settle(&f, &ep, ifindex, owner, STAT_ALLOWED_ESTABLISHED, VERDICT_NEXT);
		if (ct_is_reply(&f, &ep, ifindex, owner))
			return settle(&f, &ep, ifindex, owner, STAT_ALLOWED_REPLY, VERDICT_NEXT);
	} else {
		if (ct_is_reply(&f, &ep, ifindex, owner))
			return settle(&f, &ep, ifindex, owner, STAT_ALLOWED_REPLY, VERDICT_NEXT);
		own = ct_own_entry(&own_key, &f, ifindex, owner);
		if (ct_established(own, &ep, owner))
			return settle(&f, &ep, ifindex, owner, STAT_ALLOWED_ESTABLISHED, VERDICT_NEXT);
	}

	judged = ct_policy_allows(&f, &ep, owner, &own_key, own);
	if (judged == JUDGED_OVER_SHARE) {
		flow_event(&f, ifindex, owner, FLOW_DENIED, hook_policy(&ep, owner),
			   STAT_DENIED_CT_SHARE);
		return settle(&f, &ep, ifindex, owner, STAT_DENIED_CT_SHARE, VERDICT_DROP);
	}
	allowed = judged == JUDGED_ALLOWED;
	stat = hook_policy(&ep, owner) ? STAT_ALLOWED_POLICY : STAT_ALLOWED_UNISOLATED;
	audit_check(&f, &ep, ifindex, owner, allowed, allowed ? stat : STAT_DENIED);
	if (!allowed) {
		flow_event(&f, ifindex, owner, FLOW_DENIED, hook_policy(&ep, owner), STAT_DENIED);
		return settle(&f, &ep, ifindex, owner, STAT_DENIED, VERDICT_DROP);
	}
	flow_event(&f, ifindex, owner, FLOW_ALLOWED, hook_policy(&ep, owner), stat);
	return settle(&f, &ep, ifindex, owner, stat, VERDICT_NEXT);
}

SEC("classifier")
int palisade_from_pod(struct __sk_buff *skb)
{
	return verdict(skb, OWNER_FROM_POD);
}

SEC("classifier")
int palisade_to_pod(struct __sk_buff *skb)
{
	return verdict(skb, OWNER_TO_POD);
}
