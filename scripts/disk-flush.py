#!/usr/bin/env python3
"""How long this machine's disk takes to make one small write durable.

A `tools/call` in the default durability (`power_cut`) waits for one such flush before
its request leaves, so this is the floor under its overhead. Four ways of flushing are
timed, each back to back and with an idle gap between writes (as between the calls of a
sequential caller):

- a 4 KiB write, then fsync (what SQLite's WAL commit does as runwarden builds it);
- a 4 KiB write, then fdatasync (what a build with HAVE_FDATASYNC would do);
- a 4 KiB write to a file opened O_DSYNC;
- the same with O_DIRECT, past the page cache.

Usage: python3 scripts/disk-flush.py [DIR] [ROUNDS]
DIR is where the probe file is written (default: the current directory; use the store's
directory). The file is 4 MiB, overwritten in place, and removed at the end.
"""

import mmap
import os
import sys
import time

WRITES = 400
GAPS_MS = (0, 2)
FILE_SIZE = 4 << 20
BLOCK = 4096


def device_flags(path):
    """The block device's write cache mode and FUA support, where sysfs tells."""
    dev = os.stat(path).st_dev
    sys_dev = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    queue = os.path.join(sys_dev, "queue")
    if not os.path.isdir(queue):  # a partition: its disk holds the queue
        queue = os.path.join(sys_dev, "..", "queue")
    found = {}
    for name in ("write_cache", "fua"):
        try:
            with open(os.path.join(queue, name)) as f:
                found[name] = f.read().strip()
        except OSError:
            found[name] = "unknown"
    return found


def percentiles(samples):
    samples.sort()
    n = len(samples)
    return samples[n // 2], samples[n * 9 // 10], samples[n * 99 // 100]


def timed_writes(path, open_flags, after_write, gap_s):
    """Microseconds per durable write, each timed from the write to its flush's end."""
    fd = os.open(path, os.O_RDWR | open_flags)
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT asks
    buf.write(os.urandom(BLOCK))
    took, offset = [], 0
    try:
        for _ in range(WRITES):
            start = time.perf_counter_ns()
            os.pwritev(fd, [buf], offset)
            if after_write:
                after_write(fd)
            took.append((time.perf_counter_ns() - start) / 1000)
            offset = (offset + BLOCK) % FILE_SIZE
            if gap_s:
                time.sleep(gap_s)
    finally:
        os.close(fd)
    return percentiles(took)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    path = os.path.join(directory, f".disk-flush-probe-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.pwrite(fd, b"\0" * FILE_SIZE, 0)
    os.fsync(fd)
    os.close(fd)
    ways = (
        ("write + fsync", 0, os.fsync),
        ("write + fdatasync", 0, os.fdatasync),
        ("O_DSYNC write", os.O_DSYNC, None),
        ("O_DIRECT | O_DSYNC write", os.O_DIRECT | os.O_DSYNC, None),
    )
    flags = device_flags(path)
    print(f"{directory}: write cache {flags['write_cache']}, FUA {flags['fua']}")
    print(f"{WRITES} writes of {BLOCK} bytes each; microseconds")
    print(f"{'round':>5}  {'way':<26}{'gap':>6}{'p50':>8}{'p90':>8}{'p99':>8}")
    try:
        for rnd in range(1, rounds + 1):
            for gap_ms in GAPS_MS:
                for name, open_flags, after_write in ways:
                    p50, p90, p99 = timed_writes(path, open_flags, after_write, gap_ms / 1000)
                    print(f"{rnd:>5}  {name:<26}{gap_ms:>4}ms{p50:>8.0f}{p90:>8.0f}{p99:>8.0f}")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
