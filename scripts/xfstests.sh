#!/usr/bin/env bash
# xfstests (fstests) against anvil over FUSE, and against ext4 on a loop device for comparison.
#
#   scripts/xfstests.sh --out DIR [--fs anvil|ext4|both] [--anvil BIN]
#                       [--tests 'generic/001 generic/002' | --group quick]
#                       [--exclude FILE] [--timeout SECS] [--deadline MINUTES] [--no-setup]
#
# Installs xfstests' build dependencies (Debian), fetches xfstests at a pinned commit into
# $XFSTESTS_CACHE (default /var/cache/anvil/xfstests), builds it, creates the fsgqa users and
# groups the tests run as, and then runs the generic tests one at a time, each under a time
# limit, against each file system asked for. Results go to DIR/<fs>/: check.log and the
# results directory of xfstests, results.tsv (test, status, seconds), and summary.txt with the
# counts run / passed / failed / not run.
#
# --group G picks the generic tests of group G (default quick); --tests takes a list instead.
# --exclude FILE names tests to leave out, one per line (`#` comments): by default
# tests/xfstests/exclude-anvil.txt for anvil and none for ext4. --timeout is per test
# (default 300 s); a test over it is killed and counted as failed ("timeout"). --deadline stops
# starting tests after that many minutes (per file system); the rest count as "notreached".
#
# anvil runs as FSTYP=fuse with FUSE_SUBTYP=.anvil: TEST_DEV and SCRATCH_DEV are two anvil
# image files. For the run, /sbin/mount.fuse.anvil is a wrapper that runs BIN (default
# target/release/anvil) as mount(8)'s helper (remounts go through it too, found by the type
# the kernel shows, fuse.anvil); the previous helper is put back at the end. For FSTYP=fuse
# xfstests does not re-make the scratch file system, it empties it. ext4 uses two sparse image
# files on loop devices.
#
# Environment: XFSTESTS_REPO (git URL or local clone to fetch from), XFSTESTS_COMMIT,
# XFSTESTS_CACHE, XFSTESTS_WORK (images and mount points, default /var/tmp/anvil-xfstests),
# XFSTESTS_IMG_SIZE (default 8G per image), ANVIL_MOUNT_OPTIONS (extra `-o` options for anvil).
# Needs root. Not part of CI: the quick group takes the better part of an hour per file system.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
XFSTESTS_REPO="${XFSTESTS_REPO:-https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git}"
# v2026.01.27
XFSTESTS_COMMIT="${XFSTESTS_COMMIT:-69cd20bd0498f8d112623be88ce855c063091f19}"
XFSTESTS_CACHE="${XFSTESTS_CACHE:-/var/cache/anvil/xfstests}"
WORK="${XFSTESTS_WORK:-/var/tmp/anvil-xfstests}"
IMG_SIZE="${XFSTESTS_IMG_SIZE:-8G}"
HELPER=/sbin/mount.fuse.anvil
HELPER_SAVED="$HELPER.before-xfstests"

APT_PACKAGES=(
    acl attr automake bc dbench dump e2fsprogs fio gawk gcc git indent libacl1-dev
    libaio-dev libcap-dev libgdbm-dev libgdbm-compat-dev libtool libtool-bin liburing-dev
    libuuid1 make psmisc python3 quota sed uuid-dev uuid-runtime xfsprogs xfslibs-dev
    xfsdump sqlite3 keyutils dmsetup fuse3
)

log() { printf 'xfstests: %s\n' "$*" >&2; }
die() { printf 'xfstests: error: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

FS=both
TESTS=""
GROUP=quick
OUT=""
EXCLUDE=""
TIMEOUT=300
DEADLINE=0
SETUP=1
ANVIL_BIN="$ROOT/target/release/anvil"
while (($# > 0)); do
    case "$1" in
        --fs) FS="$2"; shift 2 ;;
        --tests) TESTS="$2"; shift 2 ;;
        --group) GROUP="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --exclude) EXCLUDE="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --deadline) DEADLINE="$2"; shift 2 ;;
        --anvil) ANVIL_BIN="$2"; shift 2 ;;
        --no-setup) SETUP=0; shift ;;
        -h|--help) usage 0 ;;
        *) usage ;;
    esac
done
[[ -n "$OUT" ]] || usage
[[ "$FS" =~ ^(anvil|ext4|both)$ ]] || die "--fs must be anvil, ext4 or both"
((EUID == 0)) || die "needs root"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SRC="$XFSTESTS_CACHE/src"

is_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

install_deps() {
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        is_installed "$pkg" || missing+=("$pkg")
    done
    ((${#missing[@]} == 0)) && return
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

fetch_and_build() {
    mkdir -p "$XFSTESTS_CACHE"
    if [[ ! -d "$SRC/.git" ]]; then
        log "cloning xfstests from $XFSTESTS_REPO"
        git clone -q "$XFSTESTS_REPO" "$SRC"
    fi
    if [[ "$(git -C "$SRC" rev-parse HEAD)" != "$XFSTESTS_COMMIT" ]]; then
        git -C "$SRC" cat-file -e "$XFSTESTS_COMMIT^{commit}" 2>/dev/null ||
            git -C "$SRC" fetch -q "$XFSTESTS_REPO"
        git -C "$SRC" checkout -q -f "$XFSTESTS_COMMIT"
        rm -f "$SRC/.anvil-built"
    fi
    # xfstests only knows the fuse subtypes glusterfs and ceph-fuse by name: df shows
    # "fuse.anvil", and the sanity check that TEST_DEV is mounted as $FSTYP wants "fuse".
    if ! grep -q 's/fuse.anvil/fuse/' "$SRC/common/rc"; then
        sed -i "s|-e 's/fuse.ceph-fuse/ceph-fuse/'|& -e 's/fuse.anvil/fuse/'|" "$SRC/common/rc"
        grep -q 's/fuse.anvil/fuse/' "$SRC/common/rc" || die "could not patch _fs_type in common/rc"
    fi
    if [[ ! -f "$SRC/.anvil-built" ]]; then
        log "building xfstests $(git -C "$SRC" describe --tags --always)"
        (cd "$SRC" && make -j"$(nproc)" >"$XFSTESTS_CACHE/build.log" 2>&1) ||
            die "xfstests build failed (see $XFSTESTS_CACHE/build.log)"
        touch "$SRC/.anvil-built"
    fi
}

make_users() {
    getent group fsgqa >/dev/null || groupadd fsgqa
    getent passwd fsgqa >/dev/null || useradd -m -g fsgqa fsgqa
    getent passwd 123456-fsgqa >/dev/null || useradd -m -g fsgqa 123456-fsgqa
    getent group fsgqa2 >/dev/null || groupadd fsgqa2
    getent passwd fsgqa2 >/dev/null || useradd -m -g fsgqa2 fsgqa2
}

# The tests to run: --tests as given, else the generic tests of --group, less the exclusions.
test_list() {
    local fs="$1" exclude="$EXCLUDE"
    if [[ -z "$exclude" && "$fs" == anvil ]]; then
        exclude="$ROOT/tests/xfstests/exclude-anvil.txt"
    fi
    {
        if [[ -n "$TESTS" ]]; then
            printf '%s\n' $TESTS
        else
            awk -v g="$GROUP" '!/^#/ && NF > 1 {
                for (i = 2; i <= NF; i++) if ($i == g) { print "generic/" $1; break }
            }' "$SRC/tests/generic/group.list"
        fi
    } | if [[ -n "$exclude" && -f "$exclude" ]]; then
        grep -vxF -f <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$exclude" | grep .)
    else
        cat
    fi
}

# Everything mounted under the work dir, innermost first.
unmount_all() {
    local fs="$1" m
    for m in $(findmnt -rn -o TARGET | grep "^$WORK/$fs/" | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}

# Waits until no process holds an anvil image (a daemon finishes its last commit after
# umount returns).
wait_released() {
    local img i
    for img in "$@"; do
        for ((i = 0; i < 120; i++)); do
            flock -n -x "$img" true 2>/dev/null && break
            sleep 0.5
        done
    done
}

setup_anvil() {
    local dir="$WORK/anvil"
    [[ -x "$ANVIL_BIN" ]] || die "anvil binary $ANVIL_BIN not found (cargo build --release)"
    ANVIL_BIN="$(cd "$(dirname "$ANVIL_BIN")" && pwd)/$(basename "$ANVIL_BIN")"
    unmount_all anvil
    mkdir -p "$dir/test" "$dir/scratch"
    wait_released "$dir/test.img" "$dir/scratch.img" 2>/dev/null || true
    "$ANVIL_BIN" mkfs "$dir/test.img" --size "$IMG_SIZE" --force >/dev/null
    "$ANVIL_BIN" mkfs "$dir/scratch.img" --size "$IMG_SIZE" --force >/dev/null
    # mount(8) runs /sbin/mount.fuse.<subtype>; anvil acts as the helper when called
    # mount.fuse.anvil. The helper waits for an image that a daemon still holds after a
    # umount (xfstests mounts again at once) and keeps each daemon's log.
    if [[ -e "$HELPER" || -L "$HELPER" ]] && [[ ! -e "$HELPER_SAVED" && ! -L "$HELPER_SAVED" ]]; then
        mv "$HELPER" "$HELPER_SAVED"
    fi
    trap restore_helper EXIT
    cat >"$HELPER" <<EOF
#!/bin/bash
# Written by anvil's scripts/xfstests.sh.
# A remount keeps its daemon (which holds the image); a mount waits for the last one to exit.
if [[ "\$*" != *remount* ]]; then
    for ((i = 0; i < 60; i++)); do
        flock -n -x "\$1" true 2>/dev/null && break
        sleep 0.5
    done
fi
exec -a mount.fuse.anvil "$ANVIL_BIN" "\$@" -o "log=$OUT/anvil/daemon.log"
EOF
    chmod 0755 "$HELPER"
    # umount(8) for xfstests (it takes the first umount on PATH): retries "target is busy"
    # for up to 3 s and logs each retry. A statfs or lookup in flight from another process
    # (df walking all mounts, say) holds the mount for as long as the daemon takes to answer.
    mkdir -p "$dir/bin"
    cat >"$dir/bin/umount" <<EOF
#!/bin/bash
# Written by anvil's scripts/xfstests.sh.
err=\$(mktemp)
for ((i = 0; i < 10; i++)); do
    /usr/bin/umount "\$@" 2>"\$err" && { rm -f "\$err"; exit 0; }
    rc=\$?
    grep -q "target is busy" "\$err" || break
    echo "\$(date +%T) busy: umount \$*" >>"$OUT/anvil/umount-busy.log"
    sleep 0.3
done
cat "\$err" >&2
rm -f "\$err"
exit \$rc
EOF
    chmod 0755 "$dir/bin/umount"
    PATH_PREFIX="$dir/bin:"
    cat >"$OUT/anvil/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.anvil
export TEST_DEV=$dir/test.img
export TEST_DIR=$dir/test
export SCRATCH_DEV=$dir/scratch.img
export SCRATCH_MNT=$dir/scratch
export TEST_FS_MOUNT_OPTS="${ANVIL_MOUNT_OPTIONS:+-o $ANVIL_MOUNT_OPTIONS}"
export MOUNT_OPTIONS="${ANVIL_MOUNT_OPTIONS:+-o $ANVIL_MOUNT_OPTIONS}"
export RESULT_BASE=$OUT/anvil/results
EOF
}

teardown_anvil() {
    unmount_all anvil
    wait_released "$WORK/anvil/test.img" "$WORK/anvil/scratch.img"
    local img
    for img in test scratch; do
        if "$ANVIL_BIN" check "$WORK/anvil/$img.img" >"$OUT/anvil/check-$img.txt" 2>&1; then
            log "anvil check $img.img: clean"
        else
            log "anvil check $img.img: FAILED (see $OUT/anvil/check-$img.txt)"
        fi
    done
    restore_helper
}

# Puts back the mount helper that was there before the run (or none).
restore_helper() {
    if grep -qs "Written by anvil's scripts/xfstests.sh" "$HELPER"; then
        rm -f "$HELPER"
        if [[ -e "$HELPER_SAVED" || -L "$HELPER_SAVED" ]]; then
            mv "$HELPER_SAVED" "$HELPER"
        fi
    fi
}

setup_ext4() {
    local dir="$WORK/ext4" img dev
    unmount_all ext4
    mkdir -p "$dir/test" "$dir/scratch"
    for img in test scratch; do
        for dev in $(losetup -j "$dir/$img.img" -O NAME -n 2>/dev/null); do losetup -d "$dev"; done
        rm -f "$dir/$img.img"
        truncate -s "$IMG_SIZE" "$dir/$img.img"
    done
    EXT4_TEST_DEV="$(losetup -f --show "$dir/test.img")"
    EXT4_SCRATCH_DEV="$(losetup -f --show "$dir/scratch.img")"
    mkfs.ext4 -q -F "$EXT4_TEST_DEV"
    cat >"$OUT/ext4/local.config" <<EOF
export FSTYP=ext4
export TEST_DEV=$EXT4_TEST_DEV
export TEST_DIR=$dir/test
export SCRATCH_DEV=$EXT4_SCRATCH_DEV
export SCRATCH_MNT=$dir/scratch
export RESULT_BASE=$OUT/ext4/results
EOF
}

teardown_ext4() {
    unmount_all ext4
    losetup -d "$EXT4_TEST_DEV" "$EXT4_SCRATCH_DEV" 2>/dev/null || true
}

# Runs each test alone under `timeout`, so one hang costs at most --timeout; the status
# comes from check's closing lines (Ran / Not run / Failures).
run_fs() {
    local fs="$1" t start secs status rc out tests stop_at=0
    mkdir -p "$OUT/$fs"
    PATH_PREFIX=""
    "setup_$fs"
    tests="$(test_list "$fs")"
    log "$fs: $(wc -w <<<"$tests") tests, per-test limit ${TIMEOUT}s, results in $OUT/$fs"
    : >"$OUT/$fs/results.tsv"
    : >"$OUT/$fs/check.out"
    ((DEADLINE > 0)) && stop_at=$(($(date +%s) + DEADLINE * 60))
    for t in $tests; do
        start=$(date +%s)
        if ((stop_at > 0 && start >= stop_at)); then
            printf '%s\tnotreached\t0\n' "$t" >>"$OUT/$fs/results.tsv"
            continue
        fi
        rc=0
        out="$(cd "$SRC" && PATH="${PATH_PREFIX:-}$PATH" HOST_OPTIONS="$OUT/$fs/local.config" \
            timeout -k 30 "$TIMEOUT" ./check "$t" 2>&1)" || rc=$?
        secs=$(($(date +%s) - start))
        printf '%s\n' "$out" >>"$OUT/$fs/check.out"
        if ((rc == 124 || rc == 137)); then
            status=timeout
            # A killed test can leave its mounts and processes behind.
            unmount_all "$fs"
            [[ "$fs" == anvil ]] && wait_released "$WORK/anvil/test.img" "$WORK/anvil/scratch.img"
        elif grep -q "^Not run:.* $t\b" <<<"$out"; then
            status=notrun
        elif grep -q "^Failures:.* $t\b" <<<"$out"; then
            status=failed
        elif grep -q "^Passed all 1 tests" <<<"$out"; then
            status=passed
        else
            status=error
        fi
        printf '%s\t%s\t%s\n' "$t" "$status" "$secs" | tee -a "$OUT/$fs/results.tsv" >&2
    done
    "teardown_$fs"
    summarize "$fs"
}

summarize() {
    local fs="$1" f="$OUT/$1/results.tsv"
    {
        printf 'fs: %s\nxfstests: %s\ndate: %s\n' "$fs" "$XFSTESTS_COMMIT" "$(date -u +%F)"
        awk -F'\t' '
            { n++; c[$2]++ }
            END {
                run = n - c["notrun"] - c["notreached"]
                failed = c["failed"] + c["timeout"] + c["error"]
                printf "selected: %d\nrun: %d\npassed: %d\nfailed: %d (of which timeout %d, error %d)\nnotrun: %d\nnotreached: %d\n",
                    n, run, c["passed"], failed, c["timeout"], c["error"], c["notrun"], c["notreached"]
            }' "$f"
        printf 'failed tests:'
        awk -F'\t' '$2 == "failed" || $2 == "timeout" || $2 == "error" { printf " %s", $1 }' "$f"
        printf '\n'
    } >"$OUT/$fs/summary.txt"
    cat "$OUT/$fs/summary.txt" >&2
}

if ((SETUP)); then
    install_deps
fi
fetch_and_build
make_users
modprobe loop 2>/dev/null || true
case "$FS" in
    both) run_fs anvil; run_fs ext4 ;;
    *) run_fs "$FS" ;;
esac
