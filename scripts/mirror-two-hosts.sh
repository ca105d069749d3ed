#!/usr/bin/env bash
# Mirroring between two "hosts" through real ssh: a private sshd on 127.0.0.1:2222 (its own
# host key, a fresh client key, nothing of the machine's ssh setup touched) stands for the
# backup host. A master volume is mounted here; the slave is mounted "there" and reached as
# root@127.0.0.1:/path through `--via 'ssh -p 2222 ...'`.
#
#   scripts/mirror-two-hosts.sh [ANVIL_BIN]     (needs root, /dev/fuse, openssh-server)
#
# Checks: the first copy and incremental copies give equal `tar | sha256sum` at every TID;
# mirror-stream follows a steady writer (prints the median lag behind the master's commit);
# an ssh connection killed in the middle of a copy leaves the slave at its previous TID and
# the next copy resumes from it; prune on the master leaves the slave's history; the slave
# checks clean.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ANVIL="$(realpath "${1:-$ROOT/target/release/anvil}")"
WRITE_SECONDS="${WRITE_SECONDS:-20}"
SSHD=/usr/sbin/sshd
[[ -x "$SSHD" ]] || { echo "mirror-two-hosts: $SSHD missing (scripts/setup.sh installs openssh-server)" >&2; exit 1; }
((EUID == 0)) || { echo "mirror-two-hosts: needs root (mounts, sshd)" >&2; exit 1; }

WORK="$(mktemp -d /tmp/anvil-mirror.XXXXXX)"
M="$WORK/master" S="$WORK/slave"
mkdir -p "$M" "$S"
SSHD_PID=""
cleanup() {
    [[ -n "${STREAM_PID:-}" ]] && kill "$STREAM_PID" 2>/dev/null || true
    [[ -n "${WRITER_PID:-}" ]] && kill "$WRITER_PID" 2>/dev/null || true
    [[ -n "$SSHD_PID" ]] && kill "$SSHD_PID" 2>/dev/null || true
    for d in "$M" "$S"; do mountpoint -q "$d" && umount "$d"; done
    sleep 0.5
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "mirror-two-hosts: FAILED: $*" >&2; exit 1; }

# --- the "remote host": a private sshd ---
ssh-keygen -q -t ed25519 -N '' -f "$WORK/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/client_key"
printf 'environment="PATH=%s:/usr/sbin:/usr/bin:/sbin:/bin" %s\n' \
    "$(dirname "$ANVIL")" "$(cat "$WORK/client_key.pub")" >"$WORK/authorized_keys"
chmod 600 "$WORK/authorized_keys"
cat >"$WORK/sshd_config" <<EOF
Port 2222
ListenAddress 127.0.0.1
HostKey $WORK/host_key
AuthorizedKeysFile $WORK/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitUserEnvironment yes
UsePAM no
StrictModes no
PidFile $WORK/sshd.pid
EOF
mkdir -p /run/sshd
start_sshd() {
    "$SSHD" -D -f "$WORK/sshd_config" -E "$WORK/sshd.log" &
    SSHD_PID=$!
    for _ in $(seq 50); do
        ssh -p 2222 -i "$WORK/client_key" -o StrictHostKeyChecking=no \
            -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes \
            root@127.0.0.1 true 2>/dev/null && return
        sleep 0.1
    done
    cat "$WORK/sshd.log" >&2
    fail "sshd did not start"
}
start_sshd
VIA="ssh -p 2222 -i $WORK/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
REMOTE="root@127.0.0.1:$S"

# --- two volumes ---
"$ANVIL" mkfs "$WORK/master.img" --size 2G >/dev/null
"$ANVIL" mkfs "$WORK/slave.img" --size 2G >/dev/null
"$ANVIL" mount "$WORK/master.img" "$M" >/dev/null
"$ANVIL" mount "$WORK/slave.img" "$S" >/dev/null

tid_of() { printf '0x%016x' "$1"; }
sum_at() { (cd "$1" && tar -c --sort=name --numeric-owner "src@@$(tid_of "$2")" | sha256sum | cut -c1-16); }
last_tid() { "$ANVIL" mirror-status "$REMOTE" --via "$VIA" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_tid"])'; }
compare_range() {
    local from=$1 to=$2 t
    for ((t = from; t <= to; t++)); do
        [[ "$(sum_at "$M" "$t")" == "$(sum_at "$S" "$t")" ]] || fail "TID $t differs"
    done
    echo "  TIDs $from..$to: tar | sha256sum equal on master and slave"
}

echo "== first copy, then incremental copies, through ssh =="
cp -a "$ROOT/crates" "$M/src"
"$ANVIL" synctid "$M" >/dev/null
FIRST=$(python3 -c "print(int('$("$ANVIL" synctid "$M")', 16))")
"$ANVIL" snapshot "$M" --label day-1 >/dev/null
"$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA"
for round in 1 2 3; do
    mapfile -t sources < <(find "$M/src" -name '*.rs' | sort)
    for f in "${sources[@]:0:$((round * 20))}"; do echo "// round $round" >>"$f"; done
    rm -rf "$M/src/anvil-bench/src/workloads/nightly.rs"
    mv "$M/src/anvil-fuse" "$M/src/fuse-$round" 2>/dev/null || mv "$M/src/fuse-$((round - 1))" "$M/src/fuse-$round"
    "$ANVIL" synctid "$M" >/dev/null
    "$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA"
done
HELD=$(last_tid)
compare_range "$FIRST" "$HELD"
[[ -d "$S/.snapshots/day-1" ]] || fail "the snapshot did not reach the slave"

echo "== a connection killed in the middle of a copy =="
head -c 300M /dev/urandom >"$M/src/big"
"$ANVIL" synctid "$M" >/dev/null
"$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA" >"$WORK/killed.out" 2>&1 &
COPY_PID=$!
sleep 1.5
pkill -f "sshd: root@notty" || true
pkill -f "anvil mirror-write $S" || true
wait "$COPY_PID" && fail "the interrupted copy reported success" || true
[[ "$(last_tid)" == "$HELD" ]] || fail "the slave moved after a broken connection"
echo "  the slave still holds TID $HELD after the broken copy"
"$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA"
cmp "$M/src/big" "$S/src/big" || fail "the resumed copy differs"
rm "$M/src/big"
"$ANVIL" synctid "$M" >/dev/null
"$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA" >/dev/null
HELD=$(last_tid)

echo "== mirror-stream under a steady writer ($WRITE_SECONDS s) =="
(
    i=0
    end=$((SECONDS + WRITE_SECONDS))
    while ((SECONDS < end)); do
        mkdir -p "$M/src/stream/d$((i % 20))"
        head -c $((1000 + (i * 7919) % 60000)) /dev/urandom >"$M/src/stream/d$((i % 20))/f$i"
        ((i % 5 == 0)) && rm -f "$M/src/stream/d$(((i + 7) % 20))/f$((i - 40))"
        i=$((i + 1))
        sleep 0.02
    done
) &
WRITER_PID=$!
"$ANVIL" mirror-stream "$M" "$REMOTE" --via "$VIA" --interval-ms 500 >"$WORK/stream.out" 2>&1 &
STREAM_PID=$!
wait "$WRITER_PID"
WRITER_PID=""
sleep 2
kill "$STREAM_PID"
wait "$STREAM_PID" 2>/dev/null || true
STREAM_PID=""
"$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA" >/dev/null
NEWEST=$(last_tid)
compare_range "$HELD" "$NEWEST"
python3 - "$WORK/stream.out" <<'PY'
import re, statistics, sys
lags = [float(m.group(1)) for m in re.finditer(r"([0-9.]+) s behind", open(sys.argv[1]).read())]
if not lags:
    sys.exit("mirror-two-hosts: FAILED: mirror-stream printed no rounds")
print(f"  mirror-stream: {len(lags)} rounds, lag behind the master's commit: "
      f"median {statistics.median(lags):.2f} s, max {max(lags):.2f} s")
PY

echo "== prune on the master: the slave keeps the history it has =="
OLD_SUM=$(sum_at "$S" "$HELD")
"$ANVIL" prune-everything "$M" >/dev/null
echo "after the prune" >"$M/src/after-prune"
"$ANVIL" synctid "$M" >/dev/null
"$ANVIL" mirror-copy "$M" "$REMOTE" --via "$VIA" 2>&1 | tail -2
LATEST=$(last_tid)
compare_range "$LATEST" "$LATEST"
[[ "$(sum_at "$S" "$HELD")" == "$OLD_SUM" ]] || fail "the slave lost history the master pruned"
echo "  TID $HELD still reads the same on the slave"

umount "$S"
"$ANVIL" check "$WORK/slave.img" | tail -1
"$ANVIL" mount "$WORK/slave.img" "$S" >/dev/null
echo "mirror-two-hosts: all checks passed"
