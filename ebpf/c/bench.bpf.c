// SPDX-License-Identifier: Apache-2.0
/*
 * Programs that only the verdict benchmark (node-enforcer/benches/verdict)
 * loads; never attached anywhere.
 *
 *   bench_bare       the floor: parses Ethernet, IP and ports with direct
 *                    packet access and returns TC_ACT_OK.  Every verdict
 *                    row is reported as a ratio to it.
 *   bench_new_flow   BPF_PROG_TEST_RUN repeats one packet, so after its
 *                    first run a "new" flow would be established.  This
 *                    wrapper gives every run a source port of its own (a
 *                    counter shared by all CPUs: a long test run may move to
 *                    another CPU when it yields) and tail-calls the program
 *                    in slot 0 of bench_targets, the program under test.
 *   bench_return     returns at once: in slot 0 it measures the wrapper's
 *                    own cost (counter, port write, tail call), which the
 *                    benchmark subtracts.
 */
#include "lib/common.h"
#include "lib/sizes.h"

char LICENSE[] SEC("license") = "Apache-2.0";

/* First port the wrapper hands out; it cycles through
 * PAL_BENCH_NEW_FLOW_PORTS (lib/sizes.h). */
#define NEW_FLOW_PORT_BASE 1024

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_port_counter SEC(".maps");

/* Offset of the L4 header of an Ethernet frame, or 0 when it is neither
 * IPv4 nor IPv6 or is too short to hold the IP header. */
static __always_inline __u32 l4_offset(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	struct iphdr *ip4;

	if ((void *)(eth + 1) > data_end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		ip4 = (void *)(eth + 1);
		if ((void *)(ip4 + 1) > data_end || ip4->ihl < 5)
			return 0;
		return ETH_HLEN + ip4->ihl * 4;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		if (data + ETH_HLEN + sizeof(struct ipv6hdr) > data_end)
			return 0;
		return ETH_HLEN + sizeof(struct ipv6hdr);
	}
	return 0;
}

SEC("classifier")
int bench_bare(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 off = l4_offset(data, data_end);
	__u16 *ports;

	if (!off || off > 128)
		return TC_ACT_SHOT;
	ports = data + off;
	if ((void *)(ports + 2) > data_end)
		return TC_ACT_SHOT;
	/* Use the ports so the compiler keeps the read a verdict would make. */
	return ports[0] == ports[1] ? TC_ACT_SHOT : TC_ACT_OK;
}

SEC("classifier")
int bench_new_flow(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 off = l4_offset(data, data_end);
	__u32 zero = 0;
	__u32 *counter;
	__u16 *sport;

	counter = bpf_map_lookup_elem(&bench_port_counter, &zero);
	if (!counter || !off || off > 128)
		return TC_ACT_SHOT;
	sport = data + off;
	if ((void *)(sport + 1) > data_end)
		return TC_ACT_SHOT;
	*sport = bpf_htons(NEW_FLOW_PORT_BASE + __sync_fetch_and_add(counter, 1) % PAL_BENCH_NEW_FLOW_PORTS);
	bpf_tail_call(skb, &bench_targets, 0);
	/* Slot 0 empty: a measurement of nothing must not look like a verdict. */
	return TC_ACT_SHOT;
}

SEC("classifier")
int bench_return(struct __sk_buff *skb)
{
	return TC_ACT_UNSPEC;
}
