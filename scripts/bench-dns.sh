#!/usr/bin/env bash
# DNS latency with egress by domain name: QUERIES queries through the lab's
# resolver (the kube-dns Service to its server pod, real UDP) from a pod
# that learns by name (its answers held by the datapath until the enforcer
# has written what they teach, then re-injected) and from a pod without
# domain rules (untouched), interleaved query by query on one lab
# (examples/dns-names.yaml, its steps played first). One line:
# `bench=dns queries= with_p50_ms= with_p99_ms= without_p50_ms=
# without_p99_ms= added_p99_ms=`, and the enforcer's own timing of the
# held answers, from the datapath's copy through its map writes to the
# re-injection (answer to map entry, and then some): `bench=dns part=hold
# held= hold_p50_us= hold_p99_us= hold_max_us=`. Then the learner's own logic on one core
# (cargo bench -p palisade-dns): `bench=dns_learn part=userspace
# answers_per_s= ...`; last, the two together as `bench=dns answers_per_s=
# answer_to_entry_us= answer_to_entry_p99_us=`. Run as root.
#
#   scripts/bench-dns.sh [QUERIES]      (default 2000)
#
# Release binaries by default; PALISADE_BENCH_PROFILE=debug skips that build.
set -euo pipefail
cd "$(dirname "$0")/.."
queries="${1:-2000}"
source scripts/setup.sh >/dev/null
profile="${PALISADE_BENCH_PROFILE:-release}"
if [ "$profile" = release ]; then
  cargo build --workspace --bins --release --quiet
  lab=target/release/palisade-lab
else
  cargo build --workspace --bins --quiet
  lab=target/debug/palisade-lab
fi
lab_out=$("$lab" bench-dns --queries "$queries" --scenario examples/dns-names.yaml)
echo "$lab_out"
learn_out=$(cargo bench -p palisade-dns --quiet 2>/dev/null | grep '^bench=')
echo "$learn_out"
# The issue's summary line: answers learned from per second on one core,
# and the time from an answer to its map entry (the hold, p50 and p99).
field() { tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
echo "bench=dns answers_per_s=$(echo "$learn_out" | field answers_per_s)" \
  "answer_to_entry_us=$(echo "$lab_out" | field hold_p50_us)" \
  "answer_to_entry_p99_us=$(echo "$lab_out" | field hold_p99_us)"
