/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Flow events: new flows and drops for the enforcer's flow log, under a
 * node-wide rate limit (struct flow_event).
 */
#ifndef PALISADE_LIB_FLOW_EVENTS_H
#define PALISADE_LIB_FLOW_EVENTS_H

#include "common.h"
#include "maps.h"
#include "parse.h"

static __always_inline void flow_count(enum pal_flow_stat stat)
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
static __always_inline void flow_event(const struct flow *f, __u32 ifindex, __u8 hook,
				       __u8 kind, __u32 policy_id, enum pal_stat stat)
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
	e->hook = hook;
	e->kind = kind;
	e->stat = stat;
	bpf_ringbuf_submit(e, 0);
	flow_count(FLOW_STAT_EMITTED);
}

#endif
