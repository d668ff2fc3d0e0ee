#!/usr/bin/env python3
"""How long this machine's fsync takes: 4 KiB writes, each followed by an fsync, for SECS
seconds (default 15) in DIR (default /tmp: put it on MariaDB's disk). A Director's group
commit is one fsync of the redo log, so a stall here holds every job of that commit: a latency
table's p99 is worth reading beside the stalls of the same sitting.

    scripts/bench/fsync.py [SECS] [DIR]
"""
import os
import sys
import tempfile
import time

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
where = sys.argv[2] if len(sys.argv) > 2 else "/tmp"
fd, path = tempfile.mkstemp(dir=where, prefix="fsync-probe-")
try:
    block = b"x" * 4096
    took = []
    end = time.monotonic() + secs
    while time.monotonic() < end:
        os.pwrite(fd, block, (len(took) % 256) * 4096)
        start = time.perf_counter()
        os.fsync(fd)
        took.append(time.perf_counter() - start)
finally:
    os.close(fd)
    os.unlink(path)
took.sort()
n = len(took)
ms = lambda q: took[min(n - 1, int(n * q))] * 1e3
print(
    f"{n} fsyncs in {secs:.0f} s: p50 {ms(0.5):.2f} ms, p99 {ms(0.99):.2f} ms, "
    f"p99.9 {ms(0.999):.2f} ms, max {took[-1] * 1e3:.1f} ms; "
    f"over 10 ms: {sum(t > 0.01 for t in took)}, over 100 ms: {sum(t > 0.1 for t in took)}"
)
