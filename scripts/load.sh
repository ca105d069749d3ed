#!/usr/bin/env bash
# Load test: blogbench with 100 readers and stress-ng's file-system stressors
# with verification, at the same time, on one fresh anvil mount; then unmount,
# remount, and check. Exits non-zero on any blogbench error, any stress-ng
# failure, an unclean daemon exit, or a check that is not clean.
#
#   scripts/load.sh [ANVIL_BIN|-]
#
# Environment:
#   LOAD_MINUTES   duration (default 30)
#   LOAD_READERS   blogbench readers (default 100)
#   LOAD_SIZE      image size (default 16G; blogbench writes ~3 MB per blog)
#   LOAD_STRESSORS stress-ng stressors (default: dentry dir rename link symlink hdd fstat xattr)
# plus the ANVIL_* knobs of scripts/lib/mount.sh. Output goes to target/mount-tests/load/.
# Needs root.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/mount.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/mount.sh"

require_root
anvil_pick_bin "${1:-}"
MINUTES="${LOAD_MINUTES:-30}"
[[ "$MINUTES" =~ ^[0-9]+$ && "$MINUTES" -gt 0 ]] || die "LOAD_MINUTES must be a positive number"
READERS="${LOAD_READERS:-100}"
SIZE="${LOAD_SIZE:-16G}"
read -r -a STRESSORS <<<"${LOAD_STRESSORS:-dentry dir rename link symlink hdd fstat xattr}"
command -v stress-ng >/dev/null || die "stress-ng not found; run scripts/setup.sh"

ART="$ANVIL_OUT/load"
rm -rf "$ART"
mkdir -p "$ART"
WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/anvil-load.XXXXXX")"
chmod 0755 "$WORK"
IMG="$WORK/anvil.img"
MNT="$WORK/mnt"

cleanup() {
    stop_jobs
    anvil_teardown
    rm -rf --one-file-system "$WORK" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$ANVIL_BIN" mkfs "$IMG" --size "$SIZE"
anvil_mount "$IMG" "$MNT" "$ART/daemon.log"
mkdir -p "$MNT/blogbench" "$MNT/stress"

# blogbench: intervals of 10 s for the whole duration.
ITER=$((MINUTES * 6))
log "blogbench: $READERS readers, $ITER intervals of 10 s; stress-ng: ${STRESSORS[*]} --verify for ${MINUTES}m"
START=$SECONDS
"$ANVIL_BIN" bench blogbench -d "$MNT/blogbench" -r "$READERS" -i "$ITER" -s 10 \
    --content random --json "$ART/blogbench.json" >"$ART/blogbench.out" 2>&1 &
BB=$!
STRESS_ARGS=(--temp-path "$MNT/stress" --verify --metrics-brief -t "${MINUTES}m")
for s in "${STRESSORS[@]}"; do
    STRESS_ARGS+=("--$s" 1)
done
stress-ng "${STRESS_ARGS[@]}" --hdd-bytes 256M >"$ART/stress-ng.out" 2>&1 &
SN=$!

rc_bb=0
rc_sn=0
wait "$BB" || rc_bb=$?
wait "$SN" || rc_sn=$?
ELAPSED=$((SECONDS - START))
tail -n 4 "$ART/blogbench.out" >&2 || true
failed=0
if ((rc_bb != 0)); then
    log "blogbench FAILED (exit $rc_bb); see $ART/blogbench.out"
    failed=1
fi
errors="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["errors"])' "$ART/blogbench.json" 2>/dev/null || echo unknown)"
collisions="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["extra"]["collisions"])' "$ART/blogbench.json" 2>/dev/null || echo unknown)"
# Collisions are blogbench's own race (two of its threads renaming one .tmp name), not errors.
log "blogbench errors: $errors (and $collisions tmp-name collisions between its own threads)"
[[ "$errors" == 0 ]] || failed=1
if ((rc_sn != 0)); then
    log "stress-ng FAILED (exit $rc_sn); last lines:"
    tail -n 20 "$ART/stress-ng.out" >&2
    failed=1
else
    log "stress-ng: ok"
fi

anvil_unmount "$MNT" || { log "daemon did not exit cleanly"; failed=1; }
anvil_check "$IMG" >"$ART/check.out" 2>&1 || { log "check after unmount FAILED"; cat "$ART/check.out" >&2; failed=1; }
head -n 1 "$ART/check.out" >&2
# Remount once: the volume must come back and still read.
anvil_mount "$IMG" "$MNT" "$ART/daemon2.log"
# Every blog's first article and picture must read back in full.
if ! find "$MNT/blogbench" -type f \( -name 'article-1.xml' -o -name 'picture-1.jpg' \) -print0 \
    | xargs -0 -r cat >/dev/null; then
    log "reading back after remount FAILED"
    failed=1
fi
anvil_unmount "$MNT" || failed=1
"$ANVIL_BIN" info "$IMG" >"$ART/info.out" 2>&1 || true

log "load: ${ELAPSED}s, blogbench exit $rc_bb, errors $errors, stress-ng exit $rc_sn; artifacts in $ART"
((failed == 0)) || die "load test failed"
log "load test passed"
