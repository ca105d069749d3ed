#!/usr/bin/env bash
# The whole test suite: lint, unit/property/crash/model tests, then the real-mount suites
# (POSIX differential against tmpfs, pjdfstest, fsx, mirroring through ssh). CI runs
# exactly this.
#
#   scripts/test.sh            everything (needs root and /dev/fuse; installs what is missing)
#   QUICK=1 scripts/test.sh    skip pjdfstest, fsx and the two-host mirroring run
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Each step says how far into the run it starts (minutes:seconds), so a slow stage shows.
START=$SECONDS
step() {
    local t=$((SECONDS - START))
    printf '\n== [%d:%02d] %s ==\n' $((t / 60)) $((t % 60)) "$*"
}

step "setup (packages, test tools, release build)"
scripts/setup.sh

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

# A real object store for the s3:// volume tests: a three-node Garage cluster on
# 127.0.0.1 (ports 7900-7933, away from scripts/garage.sh's default), stopped on exit.
step "object store (three Garage nodes)"
GARAGE_DIR="$(mktemp -d /tmp/anvil-garage.XXXXXX)"
trap 'scripts/garage.sh stop "$GARAGE_DIR" >/dev/null 2>&1 || true; rm -rf "$GARAGE_DIR"' EXIT
GARAGE_PORT_BASE=7900 scripts/garage.sh start "$GARAGE_DIR"
export ANVIL_S3_TEST_ENV="$GARAGE_DIR/env" ANVIL_REQUIRE_S3=1

# The mount tests run once per transport the machine offers, and once more on the
# /dev/fuse transport with the kernel's writeback cache (a killed daemon is replaced there).
# FUSE over io_uring is off by default (Linux 6.14+): as root, turn it on as
# scripts/setup.sh does, so that a fresh machine tests every transport.
URING_PARAM=/sys/module/fuse/parameters/enable_uring
if [[ -w "$URING_PARAM" && "$(cat "$URING_PARAM")" != Y ]] && echo Y > "$URING_PARAM" 2>/dev/null; then
    echo "FUSE over io_uring: turned on ($URING_PARAM)"
fi
CONFIGS=(transport=classic)
if [[ "$(cat "$URING_PARAM" 2>/dev/null)" == Y ]]; then
    CONFIGS=(transport=uring transport=classic)
else
    echo "FUSE over io_uring is not offered here: mount tests run on the classic transport only"
fi
CONFIGS+=(transport=devfuse,writeback)

# Mount tests must not skip in CI: without root or FUSE they fail loudly.
for c in "${CONFIGS[@]}"; do
    if [[ "$c" == "${CONFIGS[0]}" ]]; then
        step "cargo tests (engine, crash simulation, model tests; mount tests with -o $c)"
        ANVIL_TEST_MOUNT_OPTS="$c" ANVIL_REQUIRE_FUSE=1 cargo test --workspace --locked
    else
        step "mount tests with -o $c"
        ANVIL_TEST_MOUNT_OPTS="$c" ANVIL_REQUIRE_FUSE=1 cargo test -p anvil-cli --locked
    fi
done

# One kill round per SQLite journal mode on the store (three on a local image above): each
# kill remounts from the store, and twelve of them took a minute and a half of CI.
step "POSIX differential and real clients on a volume on the object store"
ANVIL_TEST_ON_STORE=1 ANVIL_REQUIRE_FUSE=1 ANVIL_SQLITE_KILLS=1 cargo test -p anvil-cli --locked \
    --test posix_differential --test real_clients --test unlinked_open_file

if [[ "${QUICK:-0}" != 1 ]]; then
    for c in "${CONFIGS[@]}"; do
        step "pjdfstest against a real mount (-o $c)"
        ANVIL_MOUNT_OPTS="$c" scripts/run-pjdfstest.sh target/release/anvil
        # Four seeds on four files at once: the same operations in two thirds of the time.
        step "fsx: 100,000 operations against a real mount (-o $c)"
        FSX_PARALLEL=1 ANVIL_MOUNT_OPTS="$c" scripts/run-fsx.sh target/release/anvil 100000
    done
    step "mirroring between two hosts through ssh (a private sshd on 127.0.0.1:2222)"
    scripts/mirror-two-hosts.sh target/release/anvil
fi
step "all tests passed"
