#!/bin/bash
# Fidelity check: original blogbench 1.1 (C) vs anvil's reimplementation,
# alternated on a freshly made ext4 on the same loop device.
# Must run as root.  Outputs go to $OUT (default /var/tmp/bbf-out).
set -euo pipefail

ORIG=${ORIG:?set ORIG to a blogbench 1.1 binary built from its sources}
OURS=${OURS:-target/release/anvil}
ROUNDS=${ROUNDS:-3}
ITER=${ITER:-6}
SLEEP=${SLEEP:-5}
IMG=${IMG:-/var/tmp/bbf-disk.img}
MNT=${MNT:-/var/tmp/bbf-mnt}
OUT=${OUT:-/var/tmp/bbf-out}

[ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }
[ -x "$ORIG" ] || { echo "missing $ORIG" >&2; exit 1; }
[ -x "$OURS" ] || { echo "missing $OURS" >&2; exit 1; }

LOOP=""
cleanup() {
    set +e
    if mountpoint -q "$MNT"; then umount "$MNT"; fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP"; fi
    rm -f "$IMG"
    rmdir "$MNT" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$MNT" "$OUT"
rm -f "$IMG"
truncate -s 8G "$IMG"
LOOP=$(losetup --direct-io=on -f --show "$IMG")
echo "loop device: $LOOP (backing $IMG, direct-io=on)"
echo "outputs: $OUT"
: > "$OUT/scores.tsv"

run_one() { # $1 = round, $2 = orig|ours
    local round=$1 prog=$2 log="$OUT/r$1-$2.txt"
    mkfs.ext4 -q -F "$LOOP"
    mount "$LOOP" "$MNT"
    mkdir "$MNT/d"
    sync
    echo 3 > /proc/sys/vm/drop_caches
    echo "=== round $round: $prog  ($(date +%T), loadavg $(cut -d' ' -f1-3 /proc/loadavg))"
    local t0=$SECONDS
    if [ "$prog" = orig ]; then
        "$ORIG" -d "$MNT/d" -i "$ITER" -s "$SLEEP" > "$log" 2>&1
    else
        "$OURS" bench blogbench -d "$MNT/d" -i "$ITER" -s "$SLEEP" > "$log" 2>&1
    fi
    local secs=$((SECONDS - t0))
    local w r
    w=$(sed -n 's/^Final score for writes: *\([0-9]*\).*/\1/p' "$log")
    r=$(sed -n 's/^Final score for reads : *\([0-9]*\).*/\1/p' "$log")
    [ -n "$w" ] && [ -n "$r" ] || { echo "no score in $log" >&2; cat "$log" >&2; exit 1; }
    echo "    writes=$w reads=$r (${secs}s wall)"
    printf '%s\t%s\t%s\t%s\n' "$round" "$prog" "$w" "$r" >> "$OUT/scores.tsv"
    umount "$MNT"
}

for round in $(seq 1 "$ROUNDS"); do
    # Alternate which program goes first so drift in the shared machine's
    # load does not favour one of them.
    if [ $((round % 2)) -eq 1 ]; then order="orig ours"; else order="ours orig"; fi
    for prog in $order; do
        run_one "$round" "$prog"
    done
done

python3 - "$OUT/scores.tsv" <<'EOF'
import sys, statistics
rows = [l.split('\t') for l in open(sys.argv[1]).read().split('\n') if l]
data = {'orig': {'w': [], 'r': []}, 'ours': {'w': [], 'r': []}}
print()
print(f"{'round':>5} {'program':>8} {'writes':>8} {'reads':>10}")
for rnd, prog, w, r in rows:
    print(f"{rnd:>5} {prog:>8} {int(w):>8} {int(r):>10}")
    data[prog]['w'].append(int(w)); data[prog]['r'].append(int(r))
print()
print(f"{'program':>8} {'':>7} {'median':>10} {'min':>10} {'max':>10} {'spread%':>8}")
med = {}
for prog in ('orig', 'ours'):
    for k, name in (('w', 'writes'), ('r', 'reads')):
        v = data[prog][k]
        m = statistics.median(v); med[(prog, k)] = m
        spread = 100.0 * (max(v) - min(v)) / m if m else float('nan')
        print(f"{prog:>8} {name:>7} {m:>10.0f} {min(v):>10} {max(v):>10} {spread:>7.1f}%")
print()
for k, name in (('w', 'writes'), ('r', 'reads')):
    o, u = med[('orig', k)], med[('ours', k)]
    print(f"ratio ours/orig of medians, {name}: {u / o:.3f}" if o else f"{name}: original median is 0")
EOF
