/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every Palisade TC program builds on: the kernel and libbpf headers,
 * the verdicts a program returns, and loads the compiler may neither split
 * nor repeat.
 */
#ifndef PALISADE_LIB_COMMON_H
#define PALISADE_LIB_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define VERDICT_NEXT TC_ACT_UNSPEC /* TCX_NEXT: allowed, later programs run */
#define VERDICT_DROP TC_ACT_SHOT   /* TCX_DROP */
/* A held packet (dns_capture.h): taken from the stack as consumed, not
 * dropped.  Returned only through verdict_hold(). */
#define VERDICT_HOLD TC_ACT_REDIRECT /* TCX_REDIRECT */

/* One plain load the compiler may neither split nor repeat. */
#define READ_ONCE_U32(p) (*(volatile __u32 *)(p))
#define READ_ONCE_U64(p) (*(volatile __u64 *)(p))

#endif
