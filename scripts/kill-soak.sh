#!/usr/bin/env bash
# Long run of daemon kills on real mounts: kill -9 of the daemon under a file writer (one
# file in three fsync'd) with stress-ng load, under SQLite transactions (WAL and rollback
# journal, synchronous FULL and OFF) and during `git gc --aggressive`. After every kill:
# `anvil check` clean, remount, and every acknowledged operation present (every file whose
# writes returned, every SQLite transaction whose COMMIT returned, every git commit, a
# repository that passes `git fsck --full --strict`). Needs root and /dev/fuse.
#
#   sudo scripts/kill-soak.sh [KILLS]      (default 100; split 40% writer, 48% SQLite, 12% git)
#   ANVIL_TEST_MOUNT_OPTS=transport=classic sudo scripts/kill-soak.sh 100
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KILLS="${1:-100}"
writer=$(( KILLS * 40 / 100 ))
sqlite_rounds=$(( (KILLS * 48 / 100 + 3) / 4 ))   # per mode, 4 modes
git=$(( KILLS - writer - 4 * sqlite_rounds ))
(( git >= 1 )) || git=1
total=$(( writer + 4 * sqlite_rounds + git ))
echo "kill-soak: $total kills: $writer under the writer, $((4 * sqlite_rounds)) under SQLite, $git during git gc ($(date -u +%FT%TZ))"
started=$(date +%s)
export ANVIL_REQUIRE_FUSE=1
ANVIL_KILL_ROUNDS="$writer" ANVIL_KILL_SEED="${ANVIL_KILL_SEED:-$RANDOM}" \
    cargo test --release --locked -p anvil-cli --test daemon_kill -- --nocapture 2>&1 |
    grep -E "daemon kill test|round [0-9]+:|test result|panicked|lost|differs"
ANVIL_SQLITE_KILLS="$sqlite_rounds" cargo test --release --locked -p anvil-cli --test real_clients \
    sqlite -- --nocapture 2>&1 | grep -E "test result|panicked|lost|torn"
ANVIL_GIT_KILLS="$git" cargo test --release --locked -p anvil-cli --test real_clients \
    git_survives -- --nocapture 2>&1 | grep -E "test result|panicked|round"
echo "kill-soak: $total kills, 0 acknowledged operations lost, done in $(( $(date +%s) - started )) s"
