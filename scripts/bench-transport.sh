#!/usr/bin/env bash
# Small-file operations through the mount, against ext4 and against the transport's own
# ceiling, in alternated rounds of one run.
#
#   scripts/bench-transport.sh [ROUNDS] [FILES]        (defaults: 3 rounds, 5000 files)
#
# Targets, each measured once per round, rounds alternated so that machine noise falls on
# all of them alike:
#   ext4            ext4 on a loop device (image written in full first)
#   anvil-uring     anvil mount -o transport=uring
#   anvil-classic   anvil mount -o transport=classic
#   memfs-uring     anvil memfs (a trivial in-memory file system) on io_uring
#   memfs-classic   the same on the classic /dev/fuse transport
# Each target runs `anvil-bench quick --files FILES --seq-mib 0 --runs 1` (create + write
# 4 KiB + close, stat, cached open/read/close, unlink) in a fresh directory. The table gives
# medians over the rounds, the ratio to ext4, and anvil's share of the memfs ceiling on the
# same transport; requests per opcode from the last round go to target/mount-tests/transport/.
# Extra options for every anvil and memfs mount: BENCH_OPTS (e.g. worker_sched=normal).
# Needs root; enables FUSE over io_uring (scripts/setup.sh does the same).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/mount.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/mount.sh"

require_root
ROUNDS="${1:-3}"
FILES="${2:-5000}"
OPTS="${BENCH_OPTS:-}"
anvil_pick_bin "$ANVIL_ROOT/target/release/anvil"
(cd "$ANVIL_ROOT" && cargo build --release -q -p anvil-bench)
BENCH="$ANVIL_ROOT/target/release/anvil-bench"
[[ -w /sys/module/fuse/parameters/enable_uring ]] && echo Y > /sys/module/fuse/parameters/enable_uring

OUT="$ANVIL_OUT/transport"
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/anvil-transport.XXXXXX")"
LOOP=""
cleanup() {
    for m in "$WORK"/mnt-*; do
        if mountpoint -q "$m" 2>/dev/null; then umount "$m" 2>/dev/null || umount -l "$m" || true; fi
    done
    [[ -n "$LOOP" ]] && losetup -d "$LOOP" 2>/dev/null
    rm -rf --one-file-system "$WORK" || true
}
trap cleanup EXIT

head -c 2G /dev/zero > "$WORK/ext4.img"
LOOP="$(losetup --find --show "$WORK/ext4.img")"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
mkdir -p "$WORK/mnt-ext4"
mount "$LOOP" "$WORK/mnt-ext4"
head -c 2G /dev/zero > "$WORK/anvil.img"
"$ANVIL_BIN" mkfs "$WORK/anvil.img" --size 2G >/dev/null

# mount_target NAME: mounts the target on $WORK/mnt-NAME (ext4 stays mounted).
mount_target() {
    local name="$1" dir="$WORK/mnt-$1" transport="${1#*-}"
    mkdir -p "$dir"
    case "$name" in
        ext4) ;;
        anvil-*) "$ANVIL_BIN" mount "$WORK/anvil.img" "$dir" -o "transport=$transport${OPTS:+,$OPTS}" \
                     --log "$OUT/$name.log" >/dev/null ;;
        memfs-*) "$ANVIL_BIN" memfs "$dir" -o "transport=$transport${OPTS:+,$OPTS}" \
                     --log "$OUT/$name.log" >/dev/null ;;
    esac
}

unmount_target() {
    local name="$1" dir="$WORK/mnt-$1"
    [[ "$name" == ext4 ]] && return
    getfattr --absolute-names -n trusted.anvil.requests --only-values "$dir" \
        > "$OUT/$name.requests.json" 2>/dev/null || true
    umount "$dir"
    # The daemon holds the image until its final commit; wait for it to let go.
    for _ in $(seq 100); do
        pgrep -f -- "$dir" >/dev/null || break
        sleep 0.1
    done
}

TARGETS=(ext4 anvil-uring anvil-classic memfs-uring memfs-classic)
: > "$OUT/results.tsv"
for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
        mount_target "$t"
        log "round $round/$ROUNDS: $t"
        "$BENCH" quick --dir "$WORK/mnt-$t" --files "$FILES" --seq-mib 0 --runs 1 \
            --json "$OUT/$t.json" >/dev/null 2>&1
        python3 - "$t" "$OUT/$t.json" >> "$OUT/results.tsv" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
report = json.load(open(path))
for m in report["metrics"]:
    print(f"{name}\t{m['name']}\t{m['median']}")
EOF
        unmount_target "$t"
    done
done
umount "$WORK/mnt-ext4"

python3 - "$OUT/results.tsv" "$ROUNDS" "$FILES" <<'EOF'
import statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    t, metric, value = line.rstrip("\n").split("\t")
    rows[(t, metric)].append(float(value))
metrics = [m for m in ("create", "stat", "reread", "unlink") if ("ext4", m) in rows]
targets = ["ext4", "anvil-uring", "anvil-classic", "memfs-uring", "memfs-classic"]
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"\nmedians of {sys.argv[2]} alternated rounds, {sys.argv[3]} files, ops/s "
      "(x ext4; anvil as % of memfs on the same transport)")
print(f"{'':16}" + "".join(f"{m:>24}" for m in metrics))
for t in targets:
    cells = []
    for m in metrics:
        v = med.get((t, m))
        if v is None:
            cells.append(f"{'-':>24}")
            continue
        cell = f"{v:,.0f} ({v / med[('ext4', m)]:.2f}x"
        if t.startswith("anvil-"):
            ceiling = med.get(("memfs-" + t.split("-")[1], m))
            if ceiling:
                cell += f", {100 * v / ceiling:.0f}%"
        cells.append(f"{cell + ')':>24}")
    print(f"{t:16}" + "".join(cells))
EOF
