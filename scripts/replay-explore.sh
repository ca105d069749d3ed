#!/usr/bin/env bash
# Long run of `anvil replay-check` on a run of the real mount: records every device write
# and flush of a mount (`--device-log`) while fsx and a small-file writer (one file in
# four fsync'd, renames) run on it, then replays the log and checks, on every CPU, the
# volume at every flush point, REORDER crash states inside each flush interval (random
# subsets of its writes in random order, some torn at 512 bytes) and the state after every
# write (a crash of the daemon). Prints the states checked, the time and the rate; any
# violation is printed with its place and makes the script fail. Needs root and /dev/fuse.
#
#   sudo scripts/replay-explore.sh [REORDER] [FSX_OPS]     (defaults 100 and 20000)
#
# REPLAY_SIZE sets the volume's size (default 256M; history fills it within 10,000-20,000
# fsx operations, so longer runs need more), SEED the seed of the reordered subsets.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REORDER="${1:-100}"
FSX_OPS="${2:-20000}"
[[ "$REORDER" =~ ^[0-9]+$ && "$FSX_OPS" =~ ^[0-9]+$ ]] || { echo "usage: $0 [REORDER] [FSX_OPS]" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "replay-explore: needs root (FUSE mount)" >&2; exit 2; }
cargo build --release --locked -p anvil-cli >/dev/null
ANVIL="$ROOT/target/release/anvil"
WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/anvil-replay-explore.XXXXXX")"
trap 'umount "$WORK/mnt" 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir "$WORK/mnt"
"$ANVIL" mkfs "$WORK/vol.img" --size "${REPLAY_SIZE:-256M}" >/dev/null
cp --sparse=always "$WORK/vol.img" "$WORK/base.img"
"$ANVIL" mount "$WORK/vol.img" "$WORK/mnt" --device-log "$WORK/device.log" \
    ${ANVIL_MOUNT_OPTS:+-o "$ANVIL_MOUNT_OPTS"}
echo "replay-explore: recording fsx ($FSX_OPS operations) and a small-file writer ($(date -u +%FT%TZ))"
FSX_TARGET="$WORK/mnt" FSX_SEEDS="1 2" scripts/run-fsx.sh - "$FSX_OPS" >/dev/null
mkdir "$WORK/mnt/small"
for i in $(seq 1 400); do
    head -c $(( (i * 997) % 20000 + 1 )) /dev/urandom > "$WORK/mnt/small/f$i"
    if (( i % 4 == 0 )); then sync "$WORK/mnt/small/f$i"; fi
    if (( i % 50 == 0 )); then mv "$WORK/mnt/small/f$((i - 1))" "$WORK/mnt/small/renamed$i"; fi
done
"$ANVIL" synctid "$WORK/mnt" >/dev/null
umount "$WORK/mnt"
while pgrep -f "anvil mount $WORK/vol.img" >/dev/null; do sleep 0.1; done
echo "replay-explore: device log $(du -h "$WORK/device.log" | cut -f1); checking"
"$ANVIL" replay-check "$WORK/base.img" "$WORK/device.log" --reorder "$REORDER" --kills \
    --seed "${SEED:-$RANDOM}"
