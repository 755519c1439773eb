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
#   scripts/bench-controller.sh kube       both shapes at 1/5 scale through
#                                          the kube source (API double over
#                                          HTTP, real watchers, feed, hub)
#   scripts/bench-controller.sh huge       one NetworkPolicy of 100,000
#                                          ingress rules (one /32 each)
#                                          into a small cluster: what=huge_policy
#   scripts/bench-controller.sh cnp [SCALE]
#                                          Antrea shape (full scale unless
#                                          small|medium) plus 100
#                                          ClusterNetworkPolicies (Admin and
#                                          Baseline; shape=antrea+cnp): every
#                                          line above, and what=cnp_edit_namespace
#                                          (an edit of one whose subject is one
#                                          namespace) and what=cnp_edit_all (of
#                                          one whose subject is every namespace),
#                                          with delta_bytes_per_node=
#
# Prints one `key=value` line per measurement (scale= shape= what= ms=
# peak_mb= nodes_reached= delta_bytes= cpu_ms= ...), then a table. The
# cluster is fed to the hub as a watching source does (every object a
# staged change, generated a chunk of namespaces at a time, then one
# resolve), so `full` is that whole computation and its peak_mb is the
# hub's state, not the bench's input; held_mb is what the hub (engine and
# plans) holds by the allocator's count. ms of a change is from handing the
# change to the hub until the deltas of every node it reaches are computed
# (median of 5 changes to different namespaces). cpu_ms is the thread's CPU
# time for the same work: the machine is shared, and wall time also measures
# the neighbours. view_diff (the manifest source's path: a whole view diffed)
# builds the whole cluster as objects last; its input_mb is the size of that
# view, and its peak_mb includes it. kube_sync is the kube path's first list
# to synced plans; kube_change a pod relabel from the API server's write to
# the node's new plan. Each run is its own process, so peaks do not mix.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/setup.sh >/dev/null

runs=()
case "${1:-all}" in
  small | medium | full) runs=("antrea $1") ;;
  mixed) runs=("mixed small" "mixed medium" "mixed full") ;;
  kube) runs=("antrea medium kube" "mixed medium kube") ;;
  huge) runs=("huge") ;;
  cnp)
    case "${2:-full}" in
      small | medium | full) runs=("antrea ${2:-full} cnp") ;;
      *) echo "usage: $0 cnp [small|medium|full]" >&2; exit 2 ;;
    esac ;;
  all) runs=("antrea small" "antrea medium" "antrea full" "mixed small" "mixed medium" "mixed full"
    "antrea medium kube" "mixed medium kube" "huge" "antrea full cnp") ;;
  *) echo "usage: $0 [small|medium|full|mixed|kube|huge|cnp [small|medium|full]]" >&2; exit 2 ;;
esac

echo "building the benchmark (release; the first build takes minutes)..." >&2
cargo bench -p policy-controller --bench controller --no-run >&2
# The bench's own artifact: the package's binaries are listed too.
bin=$(cargo bench -p policy-controller --bench controller --no-run --message-format=json 2>/dev/null |
  grep '"kind":\["bench"\]' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
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
  BEGIN { printf "%-7s %-10s %-18s %10s %10s %8s %6s %12s %9s %11s\n", "scale", "shape", "what", "ms", "cpu_ms", "peak_mb", "nodes", "delta_bytes", "held_mb", "B/pod|pol" }
  {
    extra = (get("what") == "full") ? get("bytes_per_pod") "|" get("bytes_per_policy") : ""
    held = (get("what") == "full") ? get("held_mb") : ""
    printf "%-7s %-10s %-18s %10s %10s %8s %6s %12s %9s %11s\n", get("scale"), get("shape"), get("what"), get("ms"), get("cpu_ms"), get("peak_mb"), get("nodes_reached"), get("delta_bytes"), held, extra
  }' "$out"
