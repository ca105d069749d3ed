#!/usr/bin/env bash
# Many kill -9s of a daemon on the /dev/fuse transport with the writeback cache, each
# replaced by its keeper, while two writers create, write, read back, rename and remove
# files: no system call may fail, every read must match, and the volume must check clean.
# Needs root and /dev/fuse.
#
#   sudo scripts/takeover-soak.sh [KILLS]      (default 100)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KILLS="${1:-100}"
started=$(date +%s)
echo "takeover-soak: $KILLS kills ($(date -u +%FT%TZ))"
ANVIL_REQUIRE_FUSE=1 ANVIL_TAKEOVER_KILLS="$KILLS" ANVIL_TAKEOVER_LIMIT=$((KILLS + 1)) \
    cargo test --release --locked -p anvil-cli --test takeover requests_in_flight -- --nocapture 2>&1 |
    grep -E "steps across|test result|panicked|errors|differs"
echo "takeover-soak: $KILLS kills, done in $(( $(date +%s) - started )) s"
