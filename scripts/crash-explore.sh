#!/usr/bin/env bash
# Long-run crash exploration: the crash simulator of crates/anvil/tests/crash_consistency.rs
# over many seeded random workloads (CI runs 12), every device write a crash point, each
# crash image built 7 ways (the last: a killed process, every write kept), checked on every CPU. Prints the states explored, the time and
# the rate; any violation fails with the workload, the cut and the crash mode.
#
#   scripts/crash-explore.sh [SEEDS]        (default 200 seeds)
#   ANVIL_CRASH_THREADS=N scripts/crash-explore.sh 1000
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SEEDS="${1:-200}"
echo "crash-explore: $SEEDS seeded workloads plus the fixed ones ($(date -u +%FT%TZ))"
started=$(date +%s)
ANVIL_CRASH_SEEDS="$SEEDS" cargo test --release --locked -p anvil --test crash_consistency \
    crash_at_every_write -- --nocapture 2>&1 | grep -E "crash states checked|test result|panicked|power cut|process killed"
echo "crash-explore: done in $(( $(date +%s) - started )) s"
