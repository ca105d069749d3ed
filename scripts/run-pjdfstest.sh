#!/usr/bin/env bash
# POSIX conformance: run pjdfstest 0.2.2 against a freshly made anvil mount.
#
#   scripts/run-pjdfstest.sh [ANVIL_BIN|-] [PATTERN...]
#
# Makes a 2 GiB sparse image in a temp dir, mounts it, runs pjdfstest with
# tests/pjdfstest/anvil.toml (PATTERNs select tests by substring, as pjdfstest
# does), unmounts, runs `anvil check`. Exits non-zero if pjdfstest reports any
# failure, the daemon does not exit cleanly, or the check fails.
# Needs root. Works in the initial mount namespace or under `unshare -m`.
#
# Environment: PJDFSTEST_CONFIG (config file), PJDFSTEST_TIMEOUT (seconds,
# default 1800), PJDFSTEST_TARGET=DIR (run against DIR instead of a fresh anvil
# mount; used to check the harness on e.g. ext4), plus the ANVIL_* knobs of
# scripts/lib/mount.sh. The full log is kept in target/mount-tests/.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/mount.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/mount.sh"

require_root
TARGET="${PJDFSTEST_TARGET:-}"
[[ -n "$TARGET" ]] || anvil_pick_bin "${1:-}"
if (($# > 0)); then shift; fi
PJDFSTEST="$(anvil_tool pjdfstest)"
CONFIG="${PJDFSTEST_CONFIG:-$ANVIL_ROOT/tests/pjdfstest/anvil.toml}"
TIMEOUT="${PJDFSTEST_TIMEOUT:-1800}"
[[ -f "$CONFIG" ]] || die "config $CONFIG not found"

mkdir -p "$ANVIL_OUT"
LOG="$ANVIL_OUT/pjdfstest.log"
DAEMON_LOG="$ANVIL_OUT/pjdfstest-daemon.log"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/anvil-pjdfstest.XXXXXX")"
# mktemp makes the dir 0700; the tests run as other users too and must reach the mount.
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
# A directory on another file system, for the EXDEV tests (link/rename).
mkdir -p "$WORK/other-fs"

log "pjdfstest -c $CONFIG -p $TARGET -s $WORK/other-fs $*"
rc_tests=0
# NO_COLOR keeps the log greppable; panics' backtraces add nothing to the
# assertion messages unless asked for with RUST_LIB_BACKTRACE=1.
(cd "$WORK" && NO_COLOR=1 RUST_LIB_BACKTRACE="${RUST_LIB_BACKTRACE:-0}" \
    timeout "$TIMEOUT" "$PJDFSTEST" -c "$CONFIG" -p "$TARGET" -s "$WORK/other-fs" "$@") \
    >"$LOG" 2>&1 &
wait "$!" || rc_tests=$?
cat "$LOG"

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

echo
failed="$(grep -E ' (FAILED|PASSED UNEXPECTEDLY)$' "$LOG" | awk '{print "  " $1}' || true)"
if [[ -n "$failed" ]]; then
    log "failing tests:"
    printf '%s\n' "$failed" >&2
fi
((rc_tests == 124)) && log "pjdfstest timed out after ${TIMEOUT}s"
summary="$(grep -E '^Summary:' "$LOG" | tail -n 1 || true)"
printf '%s\n' "${summary:-Summary: (missing; pjdfstest exit $rc_tests)}"
if [[ "$summary" =~ ([0-9]+)\ failed,\ ([0-9]+)\ skipped,\ ([0-9]+)\ passed ]]; then
    # The same counts in the plain "N passed, N failed" form that CI log readers know.
    echo "pjdfstest: ${BASH_REMATCH[3]} passed, ${BASH_REMATCH[1]} failed, ${BASH_REMATCH[2]} skipped"
fi
log "pjdfstest exit $rc_tests, unmount exit $rc_umount, check exit $rc_check (log: $LOG)"
if ((rc_tests != 0 || rc_umount != 0 || rc_check != 0)); then
    log "FAIL"
    exit 1
fi
log "PASS"
