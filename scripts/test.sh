#!/usr/bin/env bash
# The whole test suite: lint, unit tests, eBPF verdict tests (BPF_PROG_TEST_RUN)
# and the end-to-end lab tests with real traffic. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

echo "== buf lint"
buf lint
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build"
cargo build --workspace --bins
# The image the image tests run (release binaries); they would build it
# themselves, this says how long it takes.
echo "== image"
time scripts/image.sh
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# Tests that need root are marked ignored, so that a plain `cargo test`
# runs the pure ones anywhere; here, as root, every tier runs
# (palisade-test-support says how a test says it needs root).
cargo test --workspace -- --include-ignored 2>&1 | tee "$log" || status=$?
echo "== leftovers"
e2e/scripts/check-clean.sh || status=1
# cargo's last summary is the doc-tests' (often 0 tests); close with the
# whole suite's count instead.
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
  } END { print p + 0, f + 0 }' "$log")
echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
