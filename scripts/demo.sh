#!/usr/bin/env bash
# anvil's main job on a fresh machine: install what it needs, build, make a volume, mount
# it, change a file, and read the earlier version back from history.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
ANVIL="$ROOT/target/release/anvil"
WORK="${ANVIL_DEMO_DIR:-/tmp/anvil-demo}"
IMG="$WORK/demo.img"
MNT="$WORK/mnt"
mkdir -p "$MNT"
mountpoint -q "$MNT" && umount "$MNT"
say() { printf '\n$ %s\n' "$*"; }

say anvil mkfs "$IMG" --size 8G --force
"$ANVIL" mkfs "$IMG" --size 8G --force
say anvil mount "$IMG" "$MNT"
"$ANVIL" mount "$IMG" "$MNT"

say 'echo "the first draft" > notes.txt; anvil synctid'
echo "the first draft" > "$MNT/notes.txt"
cp -r "$ROOT/docs" "$MNT/docs"
FIRST=$("$ANVIL" synctid "$MNT")
echo "$FIRST"

say 'echo "the rewrite" > notes.txt; rm -r docs; anvil synctid'
echo "the rewrite" > "$MNT/notes.txt"
rm -r "$MNT/docs"
"$ANVIL" synctid "$MNT"
ls -l "$MNT"
df -h "$MNT"
say "cat notes.txt@@$FIRST   # any path, as of any commit"
cat "$MNT/notes.txt@@$FIRST"
say "ls docs@@$FIRST"
ls "$MNT/docs@@$FIRST"
say anvil history "$MNT/notes.txt"
"$ANVIL" history "$MNT/notes.txt"
say anvil info "$MNT"
"$ANVIL" info "$MNT"

say umount "$MNT"
umount "$MNT"
for _ in $(seq 100); do "$ANVIL" check "$IMG" >/dev/null 2>&1 && break; sleep 0.1; done

say anvil cat "$IMG" /notes.txt
"$ANVIL" cat "$IMG" /notes.txt
say anvil cat "$IMG" /notes.txt --at "$FIRST"
"$ANVIL" cat "$IMG" /notes.txt --at "$FIRST"
say anvil ls "$IMG" /docs --at "$FIRST"
"$ANVIL" ls "$IMG" /docs --at "$FIRST"
say anvil check "$IMG"
"$ANVIL" check "$IMG"
