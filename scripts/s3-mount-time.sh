#!/usr/bin/env bash
# How long `anvil mount` of an s3:// volume takes from a cold cache (no cache_dir, a new
# daemon), for a volume holding FILES files: the issue's target is under 3 s for 100,000.
#
#   . DIR/env   # an object store: scripts/garage.sh start DIR
#   scripts/s3-mount-time.sh [ANVIL] [FILES] [ROUNDS]
#
# Prints each round's mount time, the median, and the store's objects for the volume.
set -euo pipefail
ANVIL="${1:-target/release/anvil}"
FILES="${2:-100000}"
ROUNDS="${3:-3}"
die() { echo "s3-mount-time: $*" >&2; exit 1; }
[[ -x "$ANVIL" ]] || die "no anvil binary at $ANVIL"
[[ -n "${AWS_ENDPOINT_URL:-}" && -n "${ANVIL_S3_BUCKET:-}" ]] ||
    die "no object store in the environment (scripts/garage.sh start DIR; . DIR/env)"
VOLUME="s3://$ANVIL_S3_BUCKET/mount-time-$(date +%s)"
MNT="$(mktemp -d /tmp/anvil-mount-time.XXXXXX)"
trap 'umount "$MNT" 2>/dev/null || true; rmdir "$MNT"' EXIT

"$ANVIL" mkfs "$VOLUME" --size 64G >/dev/null
"$ANVIL" mount "$VOLUME" "$MNT" >/dev/null
start=$(date +%s)
python3 - "$MNT" "$FILES" <<'EOF'
import os, sys
root, files = sys.argv[1], int(sys.argv[2])
per_dir = 1000
for d in range((files + per_dir - 1) // per_dir):
    path = os.path.join(root, f"d{d:04}")
    os.mkdir(path)
    for f in range(min(per_dir, files - d * per_dir)):
        with open(os.path.join(path, f"f{f:04}"), "wb") as out:
            out.write(f"file {d}/{f}\n".encode() * 8)
EOF
"$ANVIL" synctid "$MNT" >/dev/null
echo "made $FILES files in $(( $(date +%s) - start )) s"
umount "$MNT"
sleep 1

times=()
for round in $(seq 1 "$ROUNDS"); do
    t0=$(date +%s.%N)
    "$ANVIL" mount "$VOLUME" "$MNT" >/dev/null
    t1=$(date +%s.%N)
    count=$(find "$MNT" -type f | wc -l)
    [[ "$count" == "$FILES" ]] || die "round $round: $count files, not $FILES"
    times+=("$(echo "$t1 - $t0" | bc)")
    echo "round $round: mount in ${times[-1]} s ($count files there)"
    umount "$MNT"
    sleep 1
done
median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (ROUNDS + 1) / 2 ))p")
echo "median mount time: $median s ($FILES files, $ROUNDS rounds, cold cache)"
"$ANVIL" info "$VOLUME" --json | python3 -c \
    'import json,sys; d=json.load(sys.stdin); print("objects:", d["objects"], "segments:", d["device"]["store_segments"])'
