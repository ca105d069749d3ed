#!/usr/bin/env bash
# Data-path torture: run fsx 0.3.2 against a freshly made anvil mount.
#
#   scripts/run-fsx.sh [ANVIL_BIN|-] [OPS]
#
# OPS (default 100000) is split evenly across the seeds in FSX_SEEDS
# (default "1 2 3 4"); each seed exercises its own file on the mount with
# tests/fsx/fsx.toml. Then unmounts and runs `anvil check`. Exits non-zero if
# any fsx run fails, the daemon does not exit cleanly, or the check fails.
# Needs root. Works in the initial mount namespace or under `unshare -m`.
#
# Environment: FSX_SEEDS, FSX_PARALLEL=1 (run the seeds concurrently),
# FSX_CONFIG, FSX_TIMEOUT (seconds per seed, default 1800),
# FSX_TARGET=DIR (run against DIR instead of a fresh anvil mount), plus the
# ANVIL_* knobs of scripts/lib/mount.sh. On failure fsx leaves FILE.fsxlog and
# FILE.fsxgood in target/mount-tests/fsx/ (replay with the same seed).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/mount.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/mount.sh"

require_root
TARGET="${FSX_TARGET:-}"
[[ -n "$TARGET" ]] || anvil_pick_bin "${1:-}"
OPS="${2:-100000}"
[[ "$OPS" =~ ^[0-9]+$ ]] || die "OPS must be a number, got '$OPS'"
read -r -a SEEDS <<<"${FSX_SEEDS:-1 2 3 4}"
((${#SEEDS[@]} > 0)) || die "FSX_SEEDS is empty"
PER_SEED=$((OPS / ${#SEEDS[@]}))
((PER_SEED > 0)) || die "OPS ($OPS) is smaller than the number of seeds"
FSX="$(anvil_tool fsx)"
CONFIG="${FSX_CONFIG:-$ANVIL_ROOT/tests/fsx/fsx.toml}"
TIMEOUT="${FSX_TIMEOUT:-1800}"
[[ -f "$CONFIG" ]] || die "config $CONFIG not found"

ART="$ANVIL_OUT/fsx"
rm -rf "$ART"
mkdir -p "$ART"
DAEMON_LOG="$ANVIL_OUT/fsx-daemon.log"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/anvil-fsx.XXXXXX")"
chmod 0755 "$WORK"

cleanup() {
    stop_jobs
    anvil_teardown
    rm -rf --one-file-system "$WORK" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -z "$TARGET" ]]; then
    IMG="$WORK/anvil.img"
    TARGET="$WORK/mnt"
    log "anvil: $ANVIL_BIN"
    "$ANVIL_BIN" mkfs "$IMG" --size 2G
    anvil_mount "$IMG" "$TARGET" "$DAEMON_LOG"
fi

# run_seed SEED: one fsx run; its output goes to $ART/fsx.SEED.out.
run_seed() {
    local seed="$1" rc=0 start=$SECONDS
    timeout "$TIMEOUT" "$FSX" -f "$CONFIG" -N "$PER_SEED" -S "$seed" -P "$ART" \
        "$TARGET/fsx.$seed" >"$ART/fsx.$seed.out" 2>&1 &
    wait "$!" || rc=$?
    if ((rc == 0)); then
        log "seed $seed: ok, $PER_SEED ops in $((SECONDS - start))s"
    else
        ((rc == 124)) && log "seed $seed: timed out after ${TIMEOUT}s"
        log "seed $seed: FAILED (exit $rc); last lines of $ART/fsx.$seed.out:"
        tail -n 30 "$ART/fsx.$seed.out" >&2
    fi
    return "$rc"
}

log "fsx -f $CONFIG, ${#SEEDS[@]} seeds (${SEEDS[*]}) x $PER_SEED ops on $TARGET"
failed=()
if [[ "${FSX_PARALLEL:-0}" == 1 ]]; then
    declare -A pids=()
    for seed in "${SEEDS[@]}"; do
        run_seed "$seed" &
        pids[$seed]=$!
    done
    for seed in "${SEEDS[@]}"; do
        wait "${pids[$seed]}" || failed+=("$seed")
    done
else
    for seed in "${SEEDS[@]}"; do
        run_seed "$seed" || failed+=("$seed")
    done
fi

rc_umount=0
rc_check=0
if [[ -n "${IMG:-}" ]]; then
    anvil_unmount "$TARGET" || rc_umount=$?
    if ((rc_umount == 0)); then
        anvil_check "$IMG" || rc_check=$?
    else
        rc_check=1
        log "skipping anvil check: the daemon did not exit cleanly (log: $DAEMON_LOG)"
    fi
fi

passed=$((${#SEEDS[@]} - ${#failed[@]}))
echo "fsx: seeds ${SEEDS[*]}, $PER_SEED ops each"
echo "fsx: $passed passed, ${#failed[@]} failed"
log "unmount exit $rc_umount, check exit $rc_check (artifacts: $ART)"
if ((${#failed[@]} != 0 || rc_umount != 0 || rc_check != 0)); then
    ((${#failed[@]} == 0)) || log "failed seeds: ${failed[*]}"
    log "FAIL"
    exit 1
fi
log "PASS"
