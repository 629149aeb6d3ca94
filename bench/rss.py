"""Peak memory of a process, sampled every 20 ms until it exits (bench/run runs one beside
each ztserve it starts). VmHWM is the kernel's own peak of the resident set, but that counts
pages of memory-mapped model files, which belong to the page cache and are shared; so the
anonymous part (RssAnon: heap, decode cache, buffers) is sampled too. After each sample the
file OUT holds "peak_anon_bytes": read it at any time.

usage: python3 rss.py PID OUT
"""
import os
import sys
import time

pid, out = sys.argv[1], sys.argv[2]
peak = 0
while True:
    try:
        with open(f"/proc/{pid}/status") as status:
            anon = next((int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:")), None)
    except FileNotFoundError:
        break
    if anon is None:  # a zombie: the process has exited
        break
    if anon > peak:
        peak = anon
        with open(out + ".tmp", "w") as f:
            f.write(str(peak))
        os.replace(out + ".tmp", out)
    time.sleep(0.02)
