#!/usr/bin/env bash
# Backup with snapshots: a source tree that changes every day is copied into an anvil mount
# with rsync and snapshotted, for DAYS days (default 30); then the snapshots are thinned to
# weekly and history is pruned. Prints time per day, space before and after the prune, checks
# that the weekly snapshots hash the same before and after the prune, and restores the day-3
# version of a changed file and compares it byte for byte with the original.
#
#   scripts/backup-scenario.sh [ANVIL_BIN]        (needs root and /dev/fuse)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ANVIL="${1:-$ROOT/target/release/anvil}"
DAYS="${DAYS:-30}"
KEEP="${KEEP:-3 10 17 24 $DAYS}"
WORK="$(mktemp -d /tmp/anvil-backup.XXXXXX)"
IMG="$WORK/vol.img" MNT="$WORK/mnt" SRC="$WORK/src"
mkdir -p "$MNT" "$SRC"
cleanup() { mountpoint -q "$MNT" && umount "$MNT"; sleep 0.5; rm -rf "$WORK"; }
trap cleanup EXIT

# The source tree as it is on day $1, written to $2: 400 files of text-like data, each
# changing on about one day in ten, some appearing late and some deleted.
generate() {
    python3 - "$1" "$2" <<'PY'
import os, random, sys
day, out = int(sys.argv[1]), sys.argv[2]
words = [w.strip() for w in "alpha beta gamma delta anvil history tree leaf node commit \
snapshot prune extent chunk inode block fsync mount kernel page".split()]
wanted = set()
for i in range(400):
    born, dies = i % 7, (1000 if i % 13 else 20 + i % 9)
    if not (born <= day < dies):
        continue
    version = sum(1 for d in range(born, day + 1) if (i * 7 + d) % 10 == 0)
    rng = random.Random(i * 1000 + version)
    path = os.path.join(out, f"dir{i % 20:02d}", f"file{i:03d}.txt")
    wanted.add(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    size = 1000 + rng.randrange(60000)
    text = " ".join(rng.choice(words) for _ in range(size // 6))
    data = f"file {i} version {version}\n{text}\n".encode()
    try:
        if open(path, "rb").read() == data:
            continue
    except FileNotFoundError:
        pass
    open(path, "wb").write(data)
for dirpath, _, files in os.walk(out):
    for f in files:
        p = os.path.join(dirpath, f)
        if p not in wanted:
            os.remove(p)
PY
}

elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
info_field() { "$ANVIL" info "$MNT" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

"$ANVIL" mkfs "$IMG" --size 8G >/dev/null
"$ANVIL" mount "$IMG" "$MNT" >/dev/null
echo "anvil backup scenario: $DAYS days, rsync -a --delete + snapshot per day ($WORK)"
start=$(date +%s.%N)
for day in $(seq 1 "$DAYS"); do
    t0=$(date +%s.%N)
    generate "$day" "$SRC"
    t1=$(date +%s.%N)
    rsync -a --delete "$SRC/" "$MNT/backup/"
    "$ANVIL" snapshot "$MNT" --label "$(printf 'day-%02d' "$day")" >/dev/null
    t2=$(date +%s.%N)
    printf 'day %2d: copy + snapshot %.2f s, source %s, used %s\n' "$day" \
        "$(elapsed "$t1" "$t2")" "$(du -sh "$SRC" | cut -f1)" "$(mib "$(info_field used_bytes)")"
done
total=$(elapsed "$start" "$(date +%s.%N)")
echo "all $DAYS days: $(printf '%.1f' "$total") s (including generating the source tree)"
echo "before prune: used $(mib "$(info_field used_bytes)"), live $(mib "$(info_field live_bytes)"), history $(mib "$(info_field history_bytes)")"

declare -A sums
for day in $KEEP; do
    label=$(printf 'day-%02d' "$day")
    sums[$label]=$(tar -C "$MNT/.snapshots/$label" -cf - . | sha256sum | cut -d' ' -f1)
done
for day in $(seq 1 "$DAYS"); do
    case " $KEEP " in *" $day "*) ;; *) "$ANVIL" snaprm "$MNT" "$(printf 'day-%02d' "$day")" ;; esac
done
t0=$(date +%s.%N)
"$ANVIL" prune-everything "$MNT"
printf 'prune to weekly (%s): %.2f s\n' "$KEEP" "$(elapsed "$t0" "$(date +%s.%N)")"
echo "after prune:  used $(mib "$(info_field used_bytes)"), live $(mib "$(info_field live_bytes)"), history $(mib "$(info_field history_bytes)")"
df -h "$MNT" | tail -1
for label in "${!sums[@]}"; do
    now=$(tar -C "$MNT/.snapshots/$label" -cf - . | sha256sum | cut -d' ' -f1)
    [[ "$now" == "${sums[$label]}" ]] || { echo "FAIL: snapshot $label changed by prune"; exit 1; }
done
echo "kept snapshots hash the same before and after the prune: ${!sums[*]}"

# A file that changed after day 3: restore its day-3 version and compare.
mkdir -p "$WORK/day3"
generate 3 "$WORK/day3"
file=$(cd "$WORK/day3" && for f in dir*/file*.txt; do
    if ! cmp -s "$f" "$SRC/$f" 2>/dev/null; then echo "$f"; break; fi
done)
"$ANVIL" undo "$MNT/backup/$file" -t day-03 -o "$WORK/restored"
cmp "$WORK/restored" "$WORK/day3/$file"
echo "restored day-3 version of backup/$file: identical to the original ($(stat -c %s "$WORK/restored") bytes, sha256 $(sha256sum < "$WORK/restored" | cut -c1-16))"
umount "$MNT"
for _ in $(seq 100); do "$ANVIL" check "$IMG" >/dev/null 2>&1 && break; sleep 0.2; done
"$ANVIL" check "$IMG"
