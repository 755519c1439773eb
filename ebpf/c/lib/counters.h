/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Verdict counters (pal_verdicts): every verdict is counted once, under the
 * direction of the hook that judged it (STAT_SLOT).
 */
#ifndef PALISADE_LIB_COUNTERS_H
#define PALISADE_LIB_COUNTERS_H

#include "common.h"
#include "maps.h"

/* The one place that counts: every verdict goes through it once, under
 * the direction of the hook that judged it. */
static __always_inline int account(__u8 hook, enum pal_stat stat, int verdict)
{
	__u32 slot = STAT_SLOT(hook, stat);
	__u64 *count = bpf_map_lookup_elem(&pal_verdicts, &slot);

	if (count)
		*count += 1; /* per-CPU slot: no atomics needed */
	return verdict;
}

#endif
