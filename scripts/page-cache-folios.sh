#!/usr/bin/env bash
# How the kernel caches a file: how many of its cached pages are order-0 folios and how
# many belong to large folios (as ext4 and XFS use on Linux 6.x). Reads the file whole
# through a private mapping, then looks each page up in /proc/self/pagemap and
# /proc/kpageflags (needs root).
#
#   scripts/page-cache-folios.sh FILE [FILE...]
#
# Used to find why reads served from the page cache run at a third to a half of ext4's
# speed through any FUSE mount on this kernel (docs/benchmarks.md, eighth session).
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 FILE [FILE...]" >&2; exit 2; }
[[ -r /proc/kpageflags ]] || { echo "page-cache-folios: /proc/kpageflags is not readable (run as root)" >&2; exit 1; }
for file in "$@"; do
python3 - "$file" <<'PY'
import ctypes, mmap, os, struct, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = min(os.fstat(fd).st_size, 1 << 30)
if size == 0:
    print(f"{path}: empty"); sys.exit(0)
# Private and writable only so that ctypes can take its address; nothing is written.
m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
for off in range(0, size, 4096):
    m[off]
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
small = heads = tails = missing = 0
with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
    for i in range(size // 4096):
        pm.seek(((base >> 12) + i) * 8)
        entry = struct.unpack("Q", pm.read(8))[0]
        if not (entry >> 63) & 1:
            missing += 1
            continue
        kf.seek((entry & ((1 << 55) - 1)) * 8)
        flags = struct.unpack("Q", kf.read(8))[0]
        if flags & (1 << 15):
            heads += 1
        elif flags & (1 << 16):
            tails += 1
        else:
            small += 1
large = heads + tails
print(f"{path}: {small} pages in order-0 folios, {large} in {heads} large folios"
      + (f", {missing} not resident" if missing else ""))
PY
done
