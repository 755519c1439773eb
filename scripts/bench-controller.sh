#!/usr/bin/env bash
# The policy-controller at cluster scale (issue 7): full computation and
# single changes (pod relabel, namespace relabel, policy edit, pod add) on
# synthetic clusters shaped like Antrea's controller benchmark (namespaces of
# 4 pods and 3 policies) at 1/25, 1/5 and full scale (25,000 namespaces,
# 100,000 pods, 75,000 policies, 1,000 nodes), and on a mixed shape (ipBlock
# with except, port ranges, namespaceSelector with podSelector, named ports).
#
#   scripts/bench-controller.sh            everything
#   scripts/bench-controller.sh small      Antrea shape, 1/25 scale
#   scripts/bench-controller.sh medium     Antrea shape, 1/5 scale
#   scripts/bench-controller.sh full       Antrea shape, full scale
#   scripts/bench-controller.sh mixed      mixed shape, all three scales
#
# Prints one `key=value` line per measurement (scale= shape= what= ms=
# peak_mb= nodes_reached= delta_bytes= ...), then a table. ms of a change is
# from handing the change to the hub until the deltas of every node it
# reaches are computed (median of 5 changes to different namespaces).
# peak_mb is the process's peak RSS, which includes the generated input
# objects (input_mb); held_mb is what the hub (engine and plans) holds.
# Each shape and scale runs in its own process, so peaks do not mix.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/setup.sh >/dev/null

runs=()
case "${1:-all}" in
  small | medium | full) runs=("antrea $1") ;;
  mixed) runs=("mixed small" "mixed medium" "mixed full") ;;
  all) runs=("antrea small" "antrea medium" "antrea full" "mixed small" "mixed medium" "mixed full") ;;
  *) echo "usage: $0 [small|medium|full|mixed]" >&2; exit 2 ;;
esac

echo "building the benchmark (release; the first build takes minutes)..." >&2
cargo bench -p policy-controller --bench controller --no-run >&2
bin=$(cargo bench -p policy-controller --bench controller --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "benchmark binary not found" >&2; exit 1; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for run in "${runs[@]}"; do
  # shellcheck disable=SC2086
  "$bin" $run | tee -a "$out"
done

echo
awk '
  function get(k,   i, kv) { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "-" }
  BEGIN { printf "%-7s %-7s %-12s %10s %8s %6s %12s %9s %9s\n", "scale", "shape", "what", "ms", "peak_mb", "nodes", "delta_bytes", "held_mb", "B/pod|pol" }
  {
    extra = (get("what") == "full") ? get("bytes_per_pod") "|" get("bytes_per_policy") : ""
    held = (get("what") == "full") ? get("held_mb") : ""
    printf "%-7s %-7s %-12s %10s %8s %6s %12s %9s %9s\n", get("scale"), get("shape"), get("what"), get("ms"), get("peak_mb"), get("nodes_reached"), get("delta_bytes"), held, extra
  }' "$out"
