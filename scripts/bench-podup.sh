#!/usr/bin/env bash
# Pod-up benchmark: CNI ADD to reply of palisade-cni, for PODS pods started
# PARALLEL at a time through the real chain (ptp + host-local, then
# palisade-cni) with the real controller and enforcer, in standard and strict
# mode. Prints one line per mode, `mode=<m> pods=<n> p50_ms=<x> p99_ms=<y>
# max_ms= chain_p50_ms= chain_p99_ms=` (chain_*: the plugins before
# palisade-cni in the same ADDs), then a table. Run as root.
#
#   scripts/bench-podup.sh [PODS] [PARALLEL]      (defaults: 1000 20)
#
# With --runtime containerd, pods are started by a real containerd over CRI
# instead: RunPodSandbox (request to reply: netns, the whole CNI chain, the
# pause container) one at a time (UNCONTENDED pods, default 40: the
# baseline), then in bursts of 20 and 100, with palisade-cni in the chain
# and without it (a second containerd in the same node), interleaved burst
# by burst, ROUNDS bursts of each (default 3). One line per burst size:
# `runtime=containerd burst=N with_p50_ms= with_p99_ms= without_p50_ms=
# without_p99_ms= add_p50_ms= add_p99_ms= add_p99_ratio=`; add_*:
# palisade-cni's ADD as containerd ran it, exec to exit, from the kernel's
# sched_process_exec/exit tracepoints (a tracefs instance of the bench's
# own; nothing is added to the chain), and add_p99_ratio its p99 over the
# burst of 1's.
#
#   scripts/bench-podup.sh --runtime containerd [--rounds ROUNDS] [--bursts 20,100] [--uncontended N]
#
# With --rcu-expedited 0|1 the kernel's /sys/kernel/rcu_expedited is set
# for the run and put back after; every line then ends in `rcu_expedited=N`.
# Each pod's two TCX attaches wait out an RCU grace period holding RTNL, so
# a burst queues on them (node-enforcer/benches/attach.rs measures it);
# expedited grace periods are the node-wide knob that shortens them.
#
# Release binaries by default; PALISADE_BENCH_PROFILE=debug skips that build.
#
# An enforcer that does not accept --mode yet is benchmarked once, in its
# default (standard) behaviour, and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=lab
rounds=3
bursts=20,100
uncontended=40
positional=()
while (($#)); do
  case "$1" in
    --runtime) runtime="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --bursts) bursts="$2"; shift 2 ;;
    --uncontended) uncontended="$2"; shift 2 ;;
    --rcu-expedited) expedited="$2"; shift 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
pods="${positional[0]:-1000}"
expedited="${expedited:-}"
suffix=""
if [ -n "$expedited" ]; then
  case "$expedited" in
    0|1) ;;
    *) echo "bench-podup.sh: --rcu-expedited 0 or 1, not $expedited" >&2; exit 2 ;;
  esac
  knob=/sys/kernel/rcu_expedited
  was="$(cat "$knob")"
  trap 'echo "$was" > "$knob"' EXIT
  echo "$expedited" > "$knob"
  suffix=" rcu_expedited=$expedited"
fi
parallel="${positional[1]:-20}"
source scripts/setup.sh >/dev/null
profile="${PALISADE_BENCH_PROFILE:-release}"
if [ "$profile" = release ]; then
  cargo build --workspace --bins --release --quiet
  lab=target/release/palisade-lab
else
  cargo build --workspace --bins --quiet
  lab=target/debug/palisade-lab
fi

if [ "$runtime" = containerd ]; then
  "$lab" bench-podup --runtime containerd --bursts "$bursts" --rounds "$rounds" --uncontended "$uncontended" |
    while IFS= read -r line; do
      case "$line" in runtime=*) echo "$line$suffix" ;; *) echo "$line" ;; esac
    done
  exit "${PIPESTATUS[0]}"
elif [ "$runtime" != lab ]; then
  echo "bench-podup.sh: --runtime lab or containerd, not $runtime" >&2
  exit 2
fi

results=()
for mode in standard strict; do
  log="$(mktemp)"
  if line="$("$lab" bench-podup --pods "$pods" --parallel "$parallel" --mode "$mode" 2>"$log")"; then
    line="$line$suffix"
    echo "$line"
    results+=("$line")
  elif grep -q -- "unexpected argument '--mode'" "$log"; then
    echo "note: this enforcer does not accept --mode; mode=$mode not measured" >&2
    if [ "$mode" = standard ]; then
      line="$("$lab" bench-podup --pods "$pods" --parallel "$parallel" 2>"$log")" || {
        cat "$log" >&2; rm -f "$log"; exit 1; }
      # Without modes the enforcer behaves as standard does.
      line="${line/mode=default/mode=standard}"
      echo "$line  (no --mode flag: the enforcer's default)"
      results+=("$line")
    fi
  else
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
done

echo
printf '%-10s %6s %9s %9s %9s\n' MODE PODS P50_MS P99_MS MAX_MS
for line in "${results[@]}"; do
  declare -A f=()
  for kv in $line; do f[${kv%%=*}]="${kv#*=}"; done
  printf '%-10s %6s %9s %9s %9s\n' "${f[mode]}" "${f[pods]}" "${f[p50_ms]}" "${f[p99_ms]}" "${f[max_ms]}"
  unset f
done
