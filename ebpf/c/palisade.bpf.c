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
 *   1. interface not in pal_endpoints          -> pass (not ours to judge)
 *   2. not IPv4/IPv6                           -> pass (ARP and friends)
 *   3. ICMPv6 neighbour discovery              -> pass (IPv6's ARP)
 *   4. reply to a flow the other hook allowed  -> pass, refresh conntrack
 *   5. direction not isolated (policy id 0)    -> pass, track the flow
 *   6. policy(peer) and ports(proto, dport)    -> pass, track the flow
 *   7. anything else                           -> drop
 *
 * Forward packets never bypass step 6 through conntrack, so a tightened
 * policy takes effect on established flows at once.
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

#define PROTO_ICMPV6 58
#define ICMPV6_NDP_FIRST 133 /* router solicitation */
#define ICMPV6_NDP_LAST 137  /* redirect */
#define NDP_HOP_LIMIT 255    /* RFC 4861: anything else is not on-link NDP */
#define IPV4_FRAG_OFFSET 0x1fff

char LICENSE[] SEC("license") = "Apache-2.0";

/* ---- maps (pinned by name so every pod's programs share one copy) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_policy SEC(".maps");

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
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pal_stats SEC(".maps");

/* ---- packet parsing ---- */

/* What the verdict needs from a packet; addresses IPv6 or IPv4-mapped. */
struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport; /* network order, 0 when the protocol has no ports */
	__u16 dport;
	__u8 proto;
	bool ndp;
};

enum parse_result {
	PARSE_OK,
	PARSE_NOT_IP,
	PARSE_MALFORMED,
};

static __always_inline void v4_mapped(__u8 out[16], __be32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &addr, 4);
}

static __always_inline bool has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* TCP, UDP and SCTP all start with source port then destination port, so
 * bpf_skb_load_bytes (not direct access) also copes with non-linear skbs. */
static __always_inline int parse_ports(struct __sk_buff *skb, __u32 l4_off, struct flow *f)
{
	__u16 ports[2];

	if (bpf_skb_load_bytes(skb, l4_off, ports, sizeof(ports)) < 0)
		return PARSE_MALFORMED;
	f->sport = ports[0];
	f->dport = ports[1];
	return PARSE_OK;
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow *f)
{
	struct iphdr ip;
	__u32 l4_off;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return PARSE_MALFORMED;
	if (ip.ihl < 5)
		return PARSE_MALFORMED;
	v4_mapped(f->src, ip.saddr);
	v4_mapped(f->dst, ip.daddr);
	f->proto = ip.protocol;
	/* A non-first fragment carries no L4 header: it keeps port 0, so only a
	 * rule allowing every port of the protocol (or a reply) lets it pass. */
	if (!has_ports(ip.protocol) || (ip.frag_off & bpf_htons(IPV4_FRAG_OFFSET)))
		return PARSE_OK;
	l4_off = ETH_HLEN + ip.ihl * 4;
	return parse_ports(skb, l4_off, f);
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow *f)
{
	__u32 l4_off = ETH_HLEN + sizeof(struct ipv6hdr);
	struct ipv6hdr ip;
	__u8 icmp_type;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return PARSE_MALFORMED;
	__builtin_memcpy(f->src, &ip.saddr, 16);
	__builtin_memcpy(f->dst, &ip.daddr, 16);
	/* Extension headers are not walked: their next-header value becomes the
	 * protocol with port 0, which fails closed under port rules. */
	f->proto = ip.nexthdr;
	if (has_ports(ip.nexthdr))
		return parse_ports(skb, l4_off, f);
	if (ip.nexthdr == PROTO_ICMPV6 && ip.hop_limit == NDP_HOP_LIMIT) {
		if (bpf_skb_load_bytes(skb, l4_off, &icmp_type, 1) < 0)
			return PARSE_MALFORMED;
		f->ndp = icmp_type >= ICMPV6_NDP_FIRST && icmp_type <= ICMPV6_NDP_LAST;
	}
	return PARSE_OK;
}

static __always_inline int parse_flow(struct __sk_buff *skb, struct flow *f)
{
	__u16 eth_proto;

	/* Read the frame, not skb->protocol, so the verdict depends only on
	 * the bytes (and BPF_PROG_TEST_RUN sees what the wire sees). */
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &eth_proto,
			       sizeof(eth_proto)) < 0)
		return PARSE_NOT_IP;
	if (eth_proto == bpf_htons(ETH_P_IP))
		return parse_ipv4(skb, f);
	if (eth_proto == bpf_htons(ETH_P_IPV6))
		return parse_ipv6(skb, f);
	return PARSE_NOT_IP;
}

/* ---- conntrack ---- */

static __always_inline void ct_key_forward(struct ct_key *k, const struct flow *f, __u8 owner)
{
	__builtin_memcpy(k->src, f->src, 16);
	__builtin_memcpy(k->dst, f->dst, 16);
	k->sport = f->sport;
	k->dport = f->dport;
	k->proto = f->proto;
	k->owner = owner;
}

static __always_inline void ct_key_reverse(struct ct_key *k, const struct flow *f, __u8 owner)
{
	__builtin_memcpy(k->src, f->dst, 16);
	__builtin_memcpy(k->dst, f->src, 16);
	k->sport = f->dport;
	k->dport = f->sport;
	k->proto = f->proto;
	k->owner = owner;
}

/* Record that this hook allowed the flow, so the other hook of the same pod
 * lets the replies back.  Refresh in place to avoid an LRU update per packet. */
static __always_inline void ct_track(const struct flow *f, __u8 owner)
{
	struct ct_value fresh = { .last_seen_ns = bpf_ktime_get_ns() };
	struct ct_key k = {};
	struct ct_value *v;

	ct_key_forward(&k, f, owner);
	v = bpf_map_lookup_elem(&pal_conntrack, &k);
	if (v) {
		v->last_seen_ns = fresh.last_seen_ns;
		return;
	}
	bpf_map_update_elem(&pal_conntrack, &k, &fresh, BPF_ANY);
}

/* Is this packet a reply to a flow the pod's other hook allowed? */
static __always_inline bool ct_is_reply(const struct flow *f, __u8 owner)
{
	struct ct_key k = {};
	struct ct_value *v;

	ct_key_reverse(&k, f, owner == OWNER_FROM_POD ? OWNER_TO_POD : OWNER_FROM_POD);
	v = bpf_map_lookup_elem(&pal_conntrack, &k);
	if (!v)
		return false;
	v->last_seen_ns = bpf_ktime_get_ns();
	return true;
}

/* ---- policy ---- */

static __always_inline bool policy_allows(__u32 policy_id, const __u8 peer[16],
					  const struct flow *f)
{
	/* Zeroed then filled field by field: a partial designated initializer
	 * makes clang emit a .rodata template, which aya would turn into a map. */
	struct policy_key pk = {};
	struct port_key portk = {};
	struct policy_value *pv;
	struct port_value *portv;

	pk.prefixlen = POLICY_FULL_PREFIX;
	pk.policy_id = policy_id;
	__builtin_memcpy(pk.addr, peer, 16);
	pv = bpf_map_lookup_elem(&pal_policy, &pk);
	if (!pv)
		return false;

	portk.prefixlen = PORT_FULL_PREFIX;
	portk.portset_id = pv->portset_id;
	portk.proto = f->proto;
	__builtin_memcpy(portk.port, &f->dport, 2);
	portv = bpf_map_lookup_elem(&pal_ports, &portk);
	return portv && portv->allow;
}

/* ---- verdict ---- */

static __always_inline int account(__u32 stat, int verdict)
{
	__u64 *count = bpf_map_lookup_elem(&pal_stats, &stat);

	if (count)
		*count += 1; /* per-CPU slot: no atomics needed */
	return verdict;
}

static __always_inline int verdict(struct __sk_buff *skb, __u8 owner)
{
	__u32 ifindex = skb->ifindex;
	struct endpoint *ep;
	struct flow f = {};
	__u32 policy_id;
	int parsed;

	ep = bpf_map_lookup_elem(&pal_endpoints, &ifindex);
	if (!ep)
		return TC_ACT_OK;
	policy_id = owner == OWNER_FROM_POD ? ep->egress_policy : ep->ingress_policy;

	parsed = parse_flow(skb, &f);
	if (parsed == PARSE_NOT_IP)
		return TC_ACT_OK;
	if (parsed == PARSE_MALFORMED)
		return policy_id ? account(STAT_DENIED, TC_ACT_SHOT) : TC_ACT_OK;

	if (f.ndp)
		return account(STAT_ALLOWED_NDP, TC_ACT_OK);

	/* Checked before "not isolated" so that replies to a flow the other hook
	 * allowed never create an entry of their own that would later pass the
	 * other direction as a "reply" and bypass a tightened policy. */
	if (ct_is_reply(&f, owner))
		return account(STAT_ALLOWED_REPLY, TC_ACT_OK);

	if (!policy_id) {
		ct_track(&f, owner);
		return account(STAT_ALLOWED_UNISOLATED, TC_ACT_OK);
	}

	if (policy_allows(policy_id, owner == OWNER_FROM_POD ? f.dst : f.src, &f)) {
		ct_track(&f, owner);
		return account(STAT_ALLOWED_POLICY, TC_ACT_OK);
	}
	return account(STAT_DENIED, TC_ACT_SHOT);
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
