// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * palisade_ct_explain: asks the kernel's conntrack table whether it holds
 * flows, for the enforcer's conntrack cleanup.  Never attached: the enforcer
 * runs it with BPF_PROG_TEST_RUN in the node's network namespace.
 *
 * Why: the cleanup must know, for each eBPF entry, whether a kernel entry
 * explains it.  Dumping the kernel's table over netlink costs ~1.8 us per
 * kernel entry (ctnetlink builds a message for each), most of a second per
 * 500,000 entries, on every pass.  A lookup through the bpf_skb_ct_lookup
 * kfunc costs one hash probe and touches only the entries asked about.
 *
 * Input (the test packet): a struct batch_head, then up to
 * PAL_CT_EXPLAIN_BATCH_MAX struct ask records.  Each run of the program answers the record at
 * head.next and advances it, so one BPF_PROG_TEST_RUN with repeat = count
 * answers the batch; the kernel copies the packet back with the answers.
 *
 * A record is explained when a kernel entry holds its tuple in either of
 * its directions, or its reverse in either: the kfunc's lookup finds an
 * entry by its original or its reply tuple, so asking for the tuple and
 * then its reverse covers DNAT (the client's hook saw the VIP) and SNAT.
 *
 * Licensed GPL-compatibly (dual, like Cilium's bpf/): the kernel lets only
 * GPL-compatible programs call kfuncs.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Records one test run answers: 16 + 90 * 40 bytes fits a test packet
 * (< 3.7 KB).  Shared with the enforcer (build.rs generates its constant). */
#define PAL_CT_EXPLAIN_BATCH_MAX 90

/* Answers written into struct ask.answer; build.rs turns these into
 * palisade_ebpf's ANSWER_* (u8) for the enforcer. */
enum pal_ct_answer {
	ANSWER_NONE = 0,  /* no kernel entry holds the flow */
	ANSWER_FOUND = 1, /* a kernel entry holds it */
	ANSWER_ERROR = 2, /* the kernel refused the question (see .error) */
};

/* The kfunc's options, in the 12-byte form every kernel with it accepts
 * (the default zone; newer kernels also take a 16-byte form with a zone). */
struct ct_opts {
	__s32 netns_id; /* -1: the namespace of the test packet, the caller's */
	__s32 error;    /* out: -ENOENT when nothing matched */
	__u8 l4proto;   /* IPPROTO_TCP or IPPROTO_UDP: the kfunc takes no other */
	__u8 dir;       /* out */
	__u8 reserved[2];
};

/* First 16 bytes of the packet.  Bytes 12-13 (the Ethernet type the test
 * run reads) stay zero. */
struct batch_head {
	__u32 next;
	__u32 count;
	__u32 pad[2];
};

struct ask {
	__u32 tuple[9]; /* struct bpf_sock_tuple: ipv4 (12 bytes) or ipv6 (36) */
	__u8 proto;
	__u8 family; /* 4 or 6 */
	__u8 answer;
	__u8 error;  /* -opts.error of the failing lookup, for ANSWER_ERROR */
};

/* The batch's layout, shared with the enforcer, which writes the questions
 * and reads the answers at these offsets (build.rs generates its constants);
 * the asserts hold the structs above to them. */
#define PAL_CT_EXPLAIN_HEAD_BYTES 16 /* struct batch_head */
#define PAL_CT_EXPLAIN_ASK_BYTES 40  /* struct ask */
#define PAL_CT_ASK_PROTO_AT 36       /* struct ask.proto */
#define PAL_CT_ASK_FAMILY_AT 37      /* struct ask.family */
#define PAL_CT_ASK_ANSWER_AT 38      /* struct ask.answer */
#define PAL_CT_ASK_ERROR_AT 39       /* struct ask.error */

_Static_assert(sizeof(struct batch_head) == PAL_CT_EXPLAIN_HEAD_BYTES, "batch_head layout");
_Static_assert(sizeof(struct ask) == PAL_CT_EXPLAIN_ASK_BYTES, "ask layout");
_Static_assert(__builtin_offsetof(struct ask, proto) == PAL_CT_ASK_PROTO_AT, "ask.proto");
_Static_assert(__builtin_offsetof(struct ask, family) == PAL_CT_ASK_FAMILY_AT, "ask.family");
_Static_assert(__builtin_offsetof(struct ask, answer) == PAL_CT_ASK_ANSWER_AT, "ask.answer");
_Static_assert(__builtin_offsetof(struct ask, error) == PAL_CT_ASK_ERROR_AT, "ask.error");

struct nf_conn;
extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					 __u32 tuple__sz, struct ct_opts *opts,
					 __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/* ANSWER_* for one tuple in one orientation; *err set on ANSWER_ERROR. */
static __always_inline __u8 lookup(struct __sk_buff *skb, struct bpf_sock_tuple *t,
				   __u8 family, __u8 proto, __u8 *err)
{
	struct ct_opts o = { .netns_id = -1, .l4proto = proto };
	struct nf_conn *ct;

	if (family == 4)
		ct = bpf_skb_ct_lookup(skb, t, sizeof(t->ipv4), &o, sizeof(o));
	else
		ct = bpf_skb_ct_lookup(skb, t, sizeof(t->ipv6), &o, sizeof(o));
	if (ct) {
		bpf_ct_release(ct);
		return ANSWER_FOUND;
	}
	if (o.error == -2 /* ENOENT */)
		return ANSWER_NONE;
	*err = (__u8)-o.error;
	return ANSWER_ERROR;
}

static __always_inline void reverse(struct bpf_sock_tuple *r, const struct bpf_sock_tuple *t,
				    __u8 family)
{
	if (family == 4) {
		r->ipv4.saddr = t->ipv4.daddr;
		r->ipv4.daddr = t->ipv4.saddr;
		r->ipv4.sport = t->ipv4.dport;
		r->ipv4.dport = t->ipv4.sport;
	} else {
		__builtin_memcpy(r->ipv6.saddr, t->ipv6.daddr, 16);
		__builtin_memcpy(r->ipv6.daddr, t->ipv6.saddr, 16);
		r->ipv6.sport = t->ipv6.dport;
		r->ipv6.dport = t->ipv6.sport;
	}
}

SEC("classifier")
int palisade_ct_explain(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct batch_head *head = data;
	struct bpf_sock_tuple t, rev;
	struct ask *a;
	__u8 family, proto, answer, err = 0;
	__u32 i;

	if ((void *)(head + 1) > end)
		return TC_ACT_SHOT;
	i = head->next;
	if (i >= head->count || i >= PAL_CT_EXPLAIN_BATCH_MAX)
		return TC_ACT_SHOT;
	head->next = i + 1;
	a = data + sizeof(*head) + i * sizeof(*a);
	if ((void *)(a + 1) > end)
		return TC_ACT_SHOT;
	__builtin_memcpy(&t, a->tuple, sizeof(t.ipv6));
	family = a->family;
	proto = a->proto;

	answer = lookup(skb, &t, family, proto, &err);
	if (answer == ANSWER_NONE) {
		reverse(&rev, &t, family);
		answer = lookup(skb, &rev, family, proto, &err);
	}

	/* The kfunc took the context: find the record again. */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	a = data + sizeof(struct batch_head) + i * sizeof(*a);
	if ((void *)(a + 1) > end)
		return TC_ACT_SHOT;
	a->answer = answer;
	a->error = err;
	return TC_ACT_OK;
}
