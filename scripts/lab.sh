#!/usr/bin/env bash
# Builds Palisade and runs a lab scenario: a node and its pods as network
# namespaces, wired by the standard CNI plugins chained with palisade-cni, the
# real controller and enforcer, real traffic. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --workspace --bins --quiet
exec target/debug/palisade-lab run "${1:-examples/quickstart.yaml}" "${@:2}"
