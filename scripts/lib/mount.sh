# shellcheck shell=bash
# Shared helpers for anvil's mount-level test scripts (run-pjdfstest.sh,
# run-fsx.sh, bench-vs-ext4.sh). Source this file; do not run it.
#
# Mount lifecycle:
#   anvil_pick_bin [PATH]        set ANVIL_BIN (default target/release/anvil, then target/debug/anvil)
#   anvil_mount IMG DIR LOG      mount IMG on DIR, return once mounted; daemon output goes to LOG
#   anvil_unmount DIR            umount DIR, wait for the daemon to commit and exit;
#                                returns non-zero if the daemon failed or did not exit
#   anvil_check IMG              `anvil check IMG`, retried while the image is still busy
#   anvil_teardown               best-effort cleanup for an EXIT trap (unmount, stop daemon)
#   stop_jobs                    stop the script's other background jobs (for traps)
#
# Long-running steps run as `cmd & wait $!` so that a trapped INT/TERM
# interrupts the wait at once instead of after cmd finishes.
#
# Environment knobs:
#   ANVIL_MOUNT_OPTS     extra `-o` options for `anvil mount` (comma-separated)
#   ANVIL_MOUNT_MODE     foreground (default): run `anvil mount -f` as a child of the script,
#                        so its exit status and log are captured;
#                        daemon: run plain `anvil mount` (forks, returns once ready)
#   ANVIL_MOUNT_TIMEOUT  seconds to wait for the mount to appear (default 30)
#   ANVIL_EXIT_TIMEOUT   seconds to wait for the daemon after umount (default 120)
#   ANVIL_OUT            where logs and artifacts go (default <repo>/target/mount-tests)

ANVIL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ANVIL_TOOLS="$ANVIL_ROOT/.tools/bin"
ANVIL_OUT="${ANVIL_OUT:-$ANVIL_ROOT/target/mount-tests}"
ANVIL_TAG="$(basename "$0" .sh)"

# State of the current mount (one at a time).
ANVIL_BIN=""
ANVIL_PID=""
ANVIL_PID_IS_CHILD=0
ANVIL_MNT=""

log() { printf '%s: %s\n' "$ANVIL_TAG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$ANVIL_TAG" "$*" >&2; exit 1; }

require_root() {
    ((EUID == 0)) || die "must run as root (mounts a FUSE file system and loop devices)"
    [[ -c /dev/fuse ]] || die "/dev/fuse is missing"
}

# anvil_pick_bin [PATH]: choose the anvil binary.
anvil_pick_bin() {
    local want="${1:-}" cand
    if [[ -n "$want" && "$want" != "-" ]]; then
        [[ -x "$want" ]] || die "anvil binary '$want' is not executable"
        ANVIL_BIN="$(cd "$(dirname "$want")" && pwd)/$(basename "$want")"
        return
    fi
    for cand in "$ANVIL_ROOT/target/release/anvil" "$ANVIL_ROOT/target/debug/anvil"; do
        if [[ -x "$cand" ]]; then
            ANVIL_BIN="$cand"
            return
        fi
    done
    die "no anvil binary in target/release or target/debug; run 'cargo build --release -p anvil-cli' or pass its path"
}

# anvil_tool NAME: path of a cargo-installed test tool (see scripts/setup.sh).
anvil_tool() {
    local name="$1"
    if [[ -x "$ANVIL_TOOLS/$name" ]]; then
        printf '%s\n' "$ANVIL_TOOLS/$name"
    elif command -v "$name" >/dev/null; then
        command -v "$name"
    else
        die "$name not found in $ANVIL_TOOLS or PATH; run scripts/setup.sh"
    fi
}

# pid_alive PID: true while PID exists and is not a zombie.
pid_alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != Z ]]
}

# image_holders IMG: PIDs of processes that have IMG open.
image_holders() {
    local img fd
    img="$(realpath "$1")"
    for fd in /proc/[0-9]*/fd/*; do
        if [[ "$(readlink "$fd" 2>/dev/null)" == "$img" ]]; then
            fd="${fd#/proc/}"
            printf '%s\n' "${fd%%/*}"
        fi
    done | sort -un
}

is_mounted() { mountpoint -q "$1" 2>/dev/null; }

# anvil_mount IMG DIR LOG
anvil_mount() {
    local img="$1" dir="$2" logf="$3" i
    local -a opts=()
    [[ -n "${ANVIL_MOUNT_OPTS:-}" ]] && opts=(-o "$ANVIL_MOUNT_OPTS")
    local timeout="${ANVIL_MOUNT_TIMEOUT:-30}"
    ANVIL_MNT="$dir"
    mkdir -p "$dir"
    case "${ANVIL_MOUNT_MODE:-foreground}" in
        foreground)
            log "mounting $img on $dir ($ANVIL_BIN mount -f${opts[*]:+ ${opts[*]}})"
            "$ANVIL_BIN" mount "$img" "$dir" "${opts[@]}" -f >"$logf" 2>&1 &
            ANVIL_PID=$!
            ANVIL_PID_IS_CHILD=1
            for ((i = 0; i < timeout * 10; i++)); do
                is_mounted "$dir" && break
                if ! pid_alive "$ANVIL_PID"; then
                    wait "$ANVIL_PID" || true
                    ANVIL_PID=""
                    tail -n 20 "$logf" >&2 || true
                    die "anvil mount exited before the mount appeared (log: $logf)"
                fi
                sleep 0.1
            done
            ;;
        daemon)
            log "mounting $img on $dir ($ANVIL_BIN mount${opts[*]:+ ${opts[*]}})"
            if ! "$ANVIL_BIN" mount "$img" "$dir" "${opts[@]}" >"$logf" 2>&1; then
                tail -n 20 "$logf" >&2 || true
                die "anvil mount failed (log: $logf)"
            fi
            ANVIL_PID_IS_CHILD=0
            ANVIL_PID="$(image_holders "$img" | head -n 1)"
            ;;
        *) die "ANVIL_MOUNT_MODE must be foreground or daemon" ;;
    esac
    is_mounted "$dir" || die "$dir is not mounted after ${timeout}s (log: $logf)"
    log "mounted (daemon pid ${ANVIL_PID:-unknown})"
}

# wait_daemon_exit: wait for ANVIL_PID to go away; returns its exit status when
# it is our child, 0 otherwise, and 124 on timeout.
wait_daemon_exit() {
    local timeout="${ANVIL_EXIT_TIMEOUT:-120}" i rc=0
    [[ -n "$ANVIL_PID" ]] || return 0
    for ((i = 0; i < timeout * 10; i++)); do
        pid_alive "$ANVIL_PID" || break
        sleep 0.1
    done
    if pid_alive "$ANVIL_PID"; then
        log "daemon $ANVIL_PID still running ${timeout}s after unmount"
        return 124
    fi
    if ((ANVIL_PID_IS_CHILD)); then
        wait "$ANVIL_PID" || rc=$?
    fi
    ANVIL_PID=""
    return "$rc"
}

# anvil_unmount DIR: unmount and wait for the daemon to commit and exit.
anvil_unmount() {
    local dir="$1" i rc=0
    sync
    for ((i = 0; i < 20; i++)); do
        is_mounted "$dir" || break
        umount "$dir" 2>/dev/null && break
        sleep 0.5
    done
    if is_mounted "$dir"; then
        log "umount $dir failed (busy?):"
        umount "$dir" || true
        return 1
    fi
    log "unmounted $dir; waiting for the daemon to exit"
    wait_daemon_exit || rc=$?
    if ((rc != 0)); then
        log "daemon exit status $rc"
        return "$rc"
    fi
    ANVIL_MNT=""
    return 0
}

# anvil_check IMG: run `anvil check`, retrying for up to 10 s while the image
# is still held by a daemon that has not finished exiting.
anvil_check() {
    local img="$1" i rc out
    for ((i = 0; i < 20; i++)); do
        rc=0
        out="$("$ANVIL_BIN" check "$img" 2>&1)" || rc=$?
        if ((rc == 0)) || [[ -z "$(image_holders "$img")" ]]; then
            break
        fi
        sleep 0.5
    done
    printf '%s\n' "$out"
    if ((rc != 0)); then
        log "anvil check $img failed (exit $rc)"
    fi
    return "$rc"
}

# stop_jobs: stop this shell's background jobs (and their direct children),
# except the anvil daemon, which anvil_teardown stops after unmounting.
stop_jobs() {
    local pid
    for pid in $(jobs -p); do
        [[ "$pid" == "$ANVIL_PID" ]] && continue
        pkill -TERM -P "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
}

# anvil_teardown: best effort, for traps. Unmounts (lazily if needed) and
# stops the daemon if it does not exit by itself.
anvil_teardown() {
    local i
    if [[ -n "$ANVIL_MNT" ]] && is_mounted "$ANVIL_MNT"; then
        log "cleanup: unmounting $ANVIL_MNT"
        umount "$ANVIL_MNT" 2>/dev/null || umount -l "$ANVIL_MNT" 2>/dev/null || true
    fi
    if [[ -n "$ANVIL_PID" ]] && pid_alive "$ANVIL_PID"; then
        for ((i = 0; i < 100; i++)); do
            pid_alive "$ANVIL_PID" || break
            sleep 0.1
        done
        if pid_alive "$ANVIL_PID"; then
            log "cleanup: stopping daemon $ANVIL_PID"
            kill -TERM "$ANVIL_PID" 2>/dev/null || true
            sleep 2
            kill -KILL "$ANVIL_PID" 2>/dev/null || true
        fi
    fi
    if [[ -n "$ANVIL_PID" ]] && ((ANVIL_PID_IS_CHILD)); then
        wait "$ANVIL_PID" 2>/dev/null || true
    fi
    ANVIL_PID=""
    ANVIL_MNT=""
}
