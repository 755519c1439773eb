#!/usr/bin/env bash
# Datapath benchmarks of issue 6. Today: the `verdict` part, the cost in ns
# per packet of the real TC programs via BPF_PROG_TEST_RUN for pod policies
# of 10 to 100,000 CIDR rules, as ratios to a bare parse of the same round
# (see ebpf/src/bin/bench-verdict). Prints tables and one key=value line per
# measurement (bench=verdict row=.. rules=.. ns=.. ratio=..).
#
#   scripts/bench-datapath.sh [--rounds N] [--rules 10,1000,10000,100000]
#
# Root (BPF, bpffs). Installs nothing beyond what scripts/setup.sh does.
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/setup.sh >/dev/null

exec cargo run --release --quiet -p palisade-ebpf --bin bench-verdict -- "$@"
