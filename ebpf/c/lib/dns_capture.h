/* SPDX-License-Identifier: Apache-2.0 */
/*
 * DNS capture for the learner (egress by domain name, docs/DESIGN.md): the
 * last step of a verdict that allowed a packet of a pod with
 * EP_FLAG_LEARNS, and only of such a pod (every other pod's packets pay
 * the flag test in palisade.bpf.c, nothing here).
 *
 *   from_pod: a UDP packet to port 53 of a trusted server (pal_dns_servers),
 *             while the learner is alive: copied to pal_dns_frames as
 *             DNS_FRAME_QUERY; it passes whatever happens.
 *   to_pod:   a UDP packet from port 53 of a trusted server: while the
 *             learner is alive (pal_dns_config), when the frame fits
 *             (PAL_DNS_FRAME_MAX) and the ring buffer takes it, copied as
 *             DNS_FRAME_ANSWER and held (verdict_hold: taken from the
 *             stack, not dropped), the enforcer re-injects it once it has
 *             learned from it.  Otherwise it passes,
 *             counted by why.
 *             A first fragment of such a datagram records in pal_dns_frags
 *             whether it was held.  A later fragment of a datagram whose
 *             first fragment was held is copied and held too, or, when
 *             the copy fails, passes (the enforcer re-injects what it holds
 *             of a datagram when its reassembly times out, so the pod gets
 *             every fragment either way); one of a datagram not held passes.
 *
 * The verdict has already counted the packet as allowed (pal_verdicts,
 * flow events): a held packet is not a denial.  Counters: pal_dns_stats.
 * Only the first fragment of a fragmented query is copied (queries are
 * short; the learner needs the question, which the first fragment holds).
 */
#ifndef PALISADE_LIB_DNS_CAPTURE_H
#define PALISADE_LIB_DNS_CAPTURE_H

#include "common.h"
#include "../palisade.h"
#include "parse.h"

#define DNS_PORT 53

/* The trusted DNS servers: address (IPv6, or IPv4-mapped) -> 1. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PAL_MAX_DNS_SERVERS);
	__type(key, __u8[16]);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_dns_servers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dns_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_dns_config SEC(".maps");

/* struct dns_frame_hdr records, each followed by its frame. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, PAL_DNS_FRAMES_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_dns_frames SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DNS_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_dns_stats SEC(".maps");

/* struct dns_frag_key -> 1 when the datagram's first fragment was held. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PAL_MAX_DNS_FRAGS);
	__type(key, struct dns_frag_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_dns_frags SEC(".maps");

/* Where dns_capture works: the packet's struct flow, a pal_dns_frags key,
 * and a record put together before it goes to the ring buffer (hdr and
 * frame, adjacent).  In a map rather than on the stack because the
 * programs' own frames leave a global function called from them less than
 * 100 of the 512 bytes of stack.
 *
 * Why a copy and bpf_ringbuf_output rather than reserving a record in the
 * ring: a reservation's size must be a constant, so every record would
 * take PAL_DNS_FRAME_MAX bytes, and the 4 MiB ring would hold about 1000
 * answers at once; a record of the frame's own length (a DNS answer is
 * typically 100 to 600 bytes) lets it hold several thousand, which is
 * what decides how many answers can wait for a slow learner before they
 * pass unheld.  The price is one more copy of the frame, of a learning
 * pod's DNS only.  Per CPU, so no lock: a program runs to its end on one
 * CPU, and the record is out of the scratch before it returns.  Not
 * pinned: nothing outside the program reads it. */
struct dns_scratch {
	struct flow f;
	struct dns_frag_key key;
	struct dns_frame_hdr hdr;
	__u8 frame[PAL_DNS_FRAME_MAX]; /* right after hdr: the record is both */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dns_scratch);
} pal_dns_scratch SEC(".maps");

static __always_inline void dns_count(enum pal_dns_stat stat)
{
	__u32 index = stat;
	__u64 *count = bpf_map_lookup_elem(&pal_dns_stats, &index);

	if (count)
		*count += 1; /* per-CPU slot: no atomics needed */
}

/* Is the learner alive: its deadline (CLOCK_BOOTTIME) still ahead? */
static __always_inline bool dns_learner_alive(void)
{
	__u32 zero = 0;
	const struct dns_config *cfg = bpf_map_lookup_elem(&pal_dns_config, &zero);

	return cfg && READ_ONCE_U64(&cfg->learner_deadline_ns) > bpf_ktime_get_boot_ns();
}

static __always_inline bool dns_trusted(const __u8 addr[16])
{
	return bpf_map_lookup_elem(&pal_dns_servers, addr) != NULL;
}

enum dns_copy_result {
	DNS_COPIED,
	DNS_TOO_BIG,   /* longer than PAL_DNS_FRAME_MAX */
	DNS_RING_FULL, /* the ring buffer did not take it (or the frame did not read) */
};

/* Copies the whole frame, from its Ethernet header (offset 0 as TC sees
 * it: skb->len counts from there), to pal_dns_frames as one record of
 * kind `kind` (see struct dns_scratch for why through a copy). */
static __always_inline int dns_copy(struct __sk_buff *skb, struct dns_scratch *s,
				    __u32 ifindex, __u8 kind)
{
	__u32 len = skb->len;

	if (len > PAL_DNS_FRAME_MAX)
		return DNS_TOO_BIG;
	if (len == 0)
		return DNS_RING_FULL; /* never: the frame was parsed */
	if (bpf_skb_load_bytes(skb, 0, s->frame, len) < 0)
		return DNS_RING_FULL;
	s->hdr.ts_ns = bpf_ktime_get_boot_ns();
	s->hdr.ifindex = ifindex;
	s->hdr.len = len;
	s->hdr.kind = kind;
	s->hdr.pad = 0;
	if (bpf_ringbuf_output(&pal_dns_frames, &s->hdr, sizeof(s->hdr) + len, 0) < 0)
		return DNS_RING_FULL;
	return DNS_COPIED;
}

/* Counts a copy that failed under why (DNS_TOO_BIG or DNS_RING_FULL). */
static __always_inline void dns_count_failed(int why)
{
	dns_count(why == DNS_TOO_BIG ? DNS_STAT_PASSED_TOO_BIG : DNS_STAT_PASSED_RING_FULL);
}

static __always_inline void dns_frag_key_of(struct dns_frag_key *k, const struct flow *f,
					    __u32 ifindex)
{
	__builtin_memcpy(k->src, f->src, 16);
	__builtin_memcpy(k->dst, f->dst, 16);
	k->id = f->frag_id;
	k->ifindex = ifindex;
	k->proto = f->frag_proto; /* IPv4's; parse leaves it 0 for IPv6 */
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;
}

/* No interface has index 0: a redirect to it frees the packet. */
#define DNS_HOLD_NOWHERE 0

/* Takes a held packet out of the stack.  Not a drop: on the egress hook a
 * drop reports NET_XMIT_DROP to the sender, and a sender fragmenting a
 * datagram (the node refragmenting what its conntrack reassembled, as for
 * a Service's answer) stops at the first fragment that failed, so the
 * later fragments would never reach the hook.  A redirect reports success
 * whatever becomes of it, and a redirect to no interface frees the packet
 * (skb_do_redirect); bpf_redirect also resets the CPU's redirect target,
 * which a bare TC_ACT_REDIRECT would take stale from another program. */
static __always_inline int verdict_hold(void)
{
	return bpf_redirect(DNS_HOLD_NOWHERE, 0);
}

/* A query the pod sends (from_pod): copied, never held. */
static __always_inline int dns_copy_query(struct __sk_buff *skb, struct dns_scratch *s,
					  __u32 ifindex)
{
	const struct flow *f = &s->f;
	int copied;

	if (f->frag == FRAG_LATER || f->proto != IPPROTO_UDP || f->dport != bpf_htons(DNS_PORT))
		return VERDICT_NEXT;
	if (!dns_trusted(f->dst) || !dns_learner_alive())
		return VERDICT_NEXT;
	copied = dns_copy(skb, s, ifindex, DNS_FRAME_QUERY);
	if (copied == DNS_COPIED)
		dns_count(DNS_STAT_QUERY_COPIED);
	else
		dns_count_failed(copied);
	return VERDICT_NEXT;
}

/* An answer to the pod (to_pod), whole or a first fragment: held when the
 * learner is alive and the copy succeeds. */
static __always_inline int dns_hold_answer(struct __sk_buff *skb, struct dns_scratch *s,
					   __u32 ifindex)
{
	const struct flow *f = &s->f;
	__u32 held = 0;
	int copied;

	if (f->proto != IPPROTO_UDP || f->sport != bpf_htons(DNS_PORT) || !dns_trusted(f->src))
		return VERDICT_NEXT;
	if (!dns_learner_alive()) {
		dns_count(DNS_STAT_PASSED_NO_LEARNER);
	} else {
		copied = dns_copy(skb, s, ifindex, DNS_FRAME_ANSWER);
		if (copied == DNS_COPIED) {
			dns_count(DNS_STAT_ANSWER_HELD);
			held = 1;
		} else {
			dns_count_failed(copied);
		}
	}
	if (f->frag == FRAG_FIRST) {
		/* A failed write leaves the later fragments without a record:
		 * they pass, and the enforcer re-injects the first after its
		 * reassembly timeout. */
		dns_frag_key_of(&s->key, f, ifindex);
		bpf_map_update_elem(&pal_dns_frags, &s->key, &held, BPF_ANY);
	}
	return held ? verdict_hold() : VERDICT_NEXT;
}

/* A later fragment to the pod (to_pod): held as its first fragment was. */
static __always_inline int dns_hold_later_fragment(struct __sk_buff *skb,
						   struct dns_scratch *s, __u32 ifindex)
{
	const __u32 *held;

	dns_frag_key_of(&s->key, &s->f, ifindex);
	held = bpf_map_lookup_elem(&pal_dns_frags, &s->key);
	if (!held)
		return VERDICT_NEXT; /* not a DNS answer's (or its record is gone) */
	if (*held && dns_copy(skb, s, ifindex, DNS_FRAME_ANSWER) == DNS_COPIED) {
		dns_count(DNS_STAT_FRAGMENT_HELD);
		return verdict_hold();
	}
	dns_count(DNS_STAT_FRAGMENT_PASSED);
	return VERDICT_NEXT;
}

/* Bytes dns_parse reads at the head of a frame: Ethernet, an IPv6 header
 * and the 8 bytes after it (a fragment header or the UDP header). */
#define DNS_HEAD_V4 (ETH_HLEN + 20)
#define DNS_HEAD_V6 (ETH_HLEN + 40 + 8)

/* What dns_capture needs of a packet the verdict allowed (so already found
 * well formed), into s->f: addresses, protocol, ports, and a fragment's
 * datagram (as parse.h names it).  Its own reader, not parse_flow, to keep
 * the stack of this global function small (see struct dns_scratch): the
 * head of the frame is read into s->frame (which dns_copy overwrites
 * later) and decoded from there.  IPv4, and IPv6 whose UDP header or
 * fragment header follows the IPv6 header directly, as DNS is sent; an
 * answer behind other extension headers is not DNS to it, so it passes
 * unheld (never learned from: the name fails closed).  false: not one it
 * reads. */
static __always_inline bool dns_parse(struct __sk_buff *skb, struct dns_scratch *s)
{
	struct flow *f = &s->f;
	const __u8 *h = s->frame;
	__u32 l4_off;
	__u16 frag;
	__be16 be16;
	__be32 be32;

	__builtin_memset(f, 0, sizeof(*f));
	if (bpf_skb_load_bytes(skb, 0, s->frame, DNS_HEAD_V4) < 0)
		return false;
	__builtin_memcpy(&be16, h + offsetof(struct ethhdr, h_proto), 2);
	if (be16 == bpf_htons(ETH_P_IP)) {
		if ((h[ETH_HLEN] >> 4) != 4 || (h[ETH_HLEN] & 0xf) < 5)
			return false;
		f->v4 = true;
		f->proto = h[ETH_HLEN + offsetof(struct iphdr, protocol)];
		__builtin_memcpy(&be32, h + ETH_HLEN + offsetof(struct iphdr, saddr), 4);
		v4_mapped(f->src, be32);
		__builtin_memcpy(&be32, h + ETH_HLEN + offsetof(struct iphdr, daddr), 4);
		v4_mapped(f->dst, be32);
		__builtin_memcpy(&be16, h + ETH_HLEN + offsetof(struct iphdr, frag_off), 2);
		frag = bpf_ntohs(be16);
		l4_off = ETH_HLEN + (h[ETH_HLEN] & 0xf) * 4;
		if (frag & (IPV4_MF | IPV4_FRAG_OFFSET)) {
			__builtin_memcpy(&be16, h + ETH_HLEN + offsetof(struct iphdr, id), 2);
			f->frag_id = be16;
			f->frag_proto = f->proto;
			f->frag = frag & IPV4_FRAG_OFFSET ? FRAG_LATER : FRAG_FIRST;
		}
	} else if (be16 == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, 0, s->frame, DNS_HEAD_V6) < 0)
			return false;
		if ((h[ETH_HLEN] >> 4) != 6)
			return false;
		__builtin_memcpy(f->src, h + ETH_HLEN + offsetof(struct ipv6hdr, saddr), 16);
		__builtin_memcpy(f->dst, h + ETH_HLEN + offsetof(struct ipv6hdr, daddr), 16);
		f->proto = h[ETH_HLEN + offsetof(struct ipv6hdr, nexthdr)];
		l4_off = ETH_HLEN + sizeof(struct ipv6hdr);
		if (f->proto == IPV6_FRAGMENT) {
			/* next header, reserved, offset and flags, identification */
			f->proto = h[l4_off];
			__builtin_memcpy(&be16, h + l4_off + 2, 2);
			frag = bpf_ntohs(be16);
			if (frag & (IPV6_FRAG_OFFSET | IPV6_FRAG_MORE)) {
				__builtin_memcpy(&f->frag_id, h + l4_off + 4, 4);
				f->frag = frag & IPV6_FRAG_OFFSET ? FRAG_LATER : FRAG_FIRST;
			}
			l4_off += 8;
		}
	} else {
		return false;
	}
	if (f->frag == FRAG_LATER || f->proto != IPPROTO_UDP)
		return true;
	/* sport and dport, adjacent in struct flow, in network order */
	return bpf_skb_load_bytes(skb, l4_off, &f->sport, 4) == 0;
}

/* The capture, for a packet the verdict allowed on the `hook` of a pod
 * with EP_FLAG_LEARNS behind ifindex: VERDICT_HOLD when it holds the
 * packet (verdict_hold), VERDICT_NEXT otherwise.  It reads the frame again (a packet on
 * the verdict's fast path was never parsed whole), which only a learning
 * pod's packets pay.
 *
 * A global function, so the verifier checks it once, on its own, not
 * along every path of the verdict that ends in an allowed packet (the
 * programs are near the verifier's limit; see learned_entry). */
__noinline int dns_capture(struct __sk_buff *skb, __u32 ifindex, __u32 hook)
{
	__u32 zero = 0;
	struct dns_scratch *s;

	if (!skb)
		return VERDICT_NEXT;
	s = bpf_map_lookup_elem(&pal_dns_scratch, &zero);
	if (!s || !dns_parse(skb, s))
		return VERDICT_NEXT;
	if (hook == HOOK_FROM_POD)
		return dns_copy_query(skb, s, ifindex);
	if (s->f.frag == FRAG_LATER)
		return dns_hold_later_fragment(skb, s, ifindex);
	return dns_hold_answer(skb, s, ifindex);
}

#endif
