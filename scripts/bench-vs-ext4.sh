#!/usr/bin/env bash
# Benchmark anvil against ext4 on the same storage, with the same program.
#
#   scripts/bench-vs-ext4.sh [ANVIL_BIN|-] [QUICK_ARGS...]
#
# Sets up two equal-size sparse images in one temp dir (so both sit on the
# same host file system): ext4 on a loop device, and anvil (anvil mkfs +
# anvil mount). Runs `anvil-bench quick` on each (QUICK_ARGS are passed on,
# e.g. --files 5000 --seq-mib 256 --runs 1), prints both tables and one with
# the anvil/ext4 ratio per metric, then tears everything down.
# Needs root (loop devices, mount, drop_caches).
#
# Environment: BENCH_SIZE (image size, default 8G), BENCH_PREALLOCATE=0 (sparse images
# instead of fully written ones), BENCH_ONLY=ext4|anvil
# (run one side only), ANVIL_BENCH_BIN (default: builds target/release/anvil-bench),
# plus the ANVIL_* knobs of scripts/lib/mount.sh. Reports go to
# target/mount-tests/bench/{ext4,anvil}.json.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/mount.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/mount.sh"

require_root
ONLY="${BENCH_ONLY:-}"
case "$ONLY" in "" | ext4 | anvil) ;; *) die "BENCH_ONLY must be ext4 or anvil" ;; esac
[[ "$ONLY" == ext4 ]] || anvil_pick_bin "${1:-}"
if (($# > 0)); then shift; fi
QUICK_ARGS=("$@")
SIZE="${BENCH_SIZE:-8G}"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 not found; run scripts/setup.sh"

if [[ -n "${ANVIL_BENCH_BIN:-}" ]]; then
    BENCH="$ANVIL_BENCH_BIN"
else
    log "building anvil-bench (cargo build --release -p anvil-bench)"
    (cd "$ANVIL_ROOT" && cargo build --release -q -p anvil-bench)
    BENCH="$ANVIL_ROOT/target/release/anvil-bench"
fi
[[ -x "$BENCH" ]] || die "anvil-bench binary '$BENCH' not found"

OUT="$ANVIL_OUT/bench"
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/anvil-bench.XXXXXX")"
chmod 0755 "$WORK"
LOOP=""
EXT4_MNT="$WORK/ext4"

cleanup() {
    stop_jobs
    if is_mounted "$EXT4_MNT"; then
        umount "$EXT4_MNT" 2>/dev/null || umount -l "$EXT4_MNT" 2>/dev/null || true
    fi
    if [[ -n "$LOOP" ]]; then
        losetup -d "$LOOP" 2>/dev/null || true
    fi
    anvil_teardown
    rm -rf --one-file-system "$WORK" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# bench NAME DIR: run anvil-bench quick on DIR, report to $OUT/NAME.json.
bench() {
    local name="$1" dir="$2" rc=0
    rm -f "$OUT/$name.json"
    log "$name: anvil-bench quick --dir $dir ${QUICK_ARGS[*]}"
    "$BENCH" quick --dir "$dir" --label "$name" --json "$OUT/$name.json" "${QUICK_ARGS[@]}" &
    wait "$!" || rc=$?
    ((rc == 0)) || die "$name: anvil-bench failed (exit $rc)"
    echo
}

# Both images are written in full first by default, as a block device would be: on a
# sparse or fallocated image every first write to a region makes the host allocate or
# convert blocks, which penalises whichever file system writes to new places (anvil with
# history on never overwrites in place).
make_image() {
    if [[ "${BENCH_PREALLOCATE:-1}" == 1 ]]; then
        head -c "$SIZE" /dev/zero > "$1"
        sync "$1"
    else
        truncate -s "$SIZE" "$1"
    fi
}

if [[ "$ONLY" != anvil ]]; then
    log "ext4: $SIZE image on a loop device (BENCH_PREALLOCATE=${BENCH_PREALLOCATE:-1})"
    make_image "$WORK/ext4.img"
    LOOP="$(losetup --find --show "$WORK/ext4.img")"
    # Initialise inode tables and journal now, so that ext4lazyinit does not
    # write in the background during the measurements.
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
    mkdir -p "$EXT4_MNT"
    mount "$LOOP" "$EXT4_MNT"
    bench ext4 "$EXT4_MNT"
    umount "$EXT4_MNT"
    losetup -d "$LOOP"
    LOOP=""
    rm -f "$WORK/ext4.img"
fi

if [[ "$ONLY" != ext4 ]]; then
    log "anvil: $SIZE image ($ANVIL_BIN, BENCH_PREALLOCATE=${BENCH_PREALLOCATE:-1})"
    make_image "$WORK/anvil.img"
    "$ANVIL_BIN" mkfs "$WORK/anvil.img" --size "$SIZE"
    anvil_mount "$WORK/anvil.img" "$WORK/anvil" "$OUT/anvil-daemon.log"
    bench anvil "$WORK/anvil"
    anvil_unmount "$WORK/anvil" || die "anvil daemon did not exit cleanly (log: $OUT/anvil-daemon.log)"
    anvil_check "$WORK/anvil.img" || die "anvil check failed after the benchmark"
fi

if [[ -z "$ONLY" ]]; then
    echo "anvil vs ext4 (ratio > 1: anvil is faster)"
    "$BENCH" compare "$OUT/ext4.json" "$OUT/anvil.json"
fi
log "reports in $OUT"
