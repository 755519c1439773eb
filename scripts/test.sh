#!/usr/bin/env bash
# The whole test suite: lint, unit tests, eBPF verdict tests (BPF_PROG_TEST_RUN)
# and the end-to-end lab tests with real traffic. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== buf lint"
buf lint
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build"
cargo build --workspace --bins
echo "== cargo test"
cargo test --workspace
echo "== leftovers"
e2e/scripts/check-clean.sh
