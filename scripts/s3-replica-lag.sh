#!/usr/bin/env bash
# How long a change takes to show on a read-only replica of an s3:// volume: the writer
# writes and fsyncs a file, the replica (mount --replica, following every second) is read
# until it shows it. The issue's target: a median under the commit interval plus 1 s.
#
#   . DIR/env   # an object store: scripts/garage.sh start DIR
#   scripts/s3-replica-lag.sh [ANVIL] [ROUNDS]
set -euo pipefail
ANVIL="${1:-target/release/anvil}"
ROUNDS="${2:-10}"
die() { echo "s3-replica-lag: $*" >&2; exit 1; }
[[ -x "$ANVIL" ]] || die "no anvil binary at $ANVIL"
[[ -n "${AWS_ENDPOINT_URL:-}" && -n "${ANVIL_S3_BUCKET:-}" ]] ||
    die "no object store in the environment (scripts/garage.sh start DIR; . DIR/env)"
VOLUME="s3://$ANVIL_S3_BUCKET/replica-lag-$(date +%s)"
W="$(mktemp -d /tmp/anvil-writer.XXXXXX)"
R="$(mktemp -d /tmp/anvil-replica.XXXXXX)"
trap 'umount "$R" 2>/dev/null || true; umount "$W" 2>/dev/null || true; rmdir "$W" "$R"' EXIT
"$ANVIL" mkfs "$VOLUME" --size 8G >/dev/null
"$ANVIL" mount "$VOLUME" "$W" >/dev/null
"$ANVIL" mount "$VOLUME" "$R" --replica >/dev/null
lags=()
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round" > "$W/probe"
    sync "$W/probe"
    t0=$(date +%s.%N)
    until [[ "$(cat "$R/probe" 2>/dev/null)" == "round $round" ]]; do sleep 0.02; done
    t1=$(date +%s.%N)
    lags+=("$(echo "$t1 - $t0" | bc)")
    echo "round $round: seen after ${lags[-1]} s"
    sleep 0.3
done
median=$(printf '%s\n' "${lags[@]}" | sort -n | sed -n "$(( (ROUNDS + 1) / 2 ))p")
echo "median replica lag: $median s ($ROUNDS rounds, follow interval 1 s)"
