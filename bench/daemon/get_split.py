#!/usr/bin/env python3
"""Where a bench phase's Get time goes: the daemon's side of each mapflow-bench-daemon phase.

Runs the bench command given after the daemon's /metrics URL and pid, and at each RESULT
line (the end of a phase) prints, for that phase, the client's p50, the daemon's mean Get
time (mapflowd_request_duration_seconds{op="get"}: arrival to reply queued, before the
reply is encoded) and the daemon's CPU time per Get (utime + stime of the pid: Get, reply
encoding, Release, socket writes). The rest of the client's time is the client's own
(reply decode, row checks) and the transfers.

    python3 bench/daemon/get_split.py http://127.0.0.1:PORT/metrics DAEMON_PID \\
        build/bin/mapflow-bench-daemon --daemon unix:SOCK --only prefix ...
"""
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    url, pid, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    tck = os.sysconf("SC_CLK_TCK")

    def sample():
        t = urllib.request.urlopen(url, timeout=10).read().decode()
        pat = r'^mapflowd_request_duration_seconds_%s\{op="get"\} (\S+)'
        s = float(re.search(pat % "sum", t, re.M).group(1))
        c = float(re.search(pat % "count", t, re.M).group(1))
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        return s, c, (int(st[11]) + int(st[12])) / tck

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []

    def read():
        for line in p.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    last, seen = sample(), 0
    while p.poll() is None or seen < len(lines) or reader.is_alive():
        time.sleep(0.05)
        while seen < len(lines):
            line = lines[seen]
            seen += 1
            if "populated" in line:  # the populate's Gets are not a phase's
                last = sample()
            if not line.startswith("RESULT"):
                continue
            cur = sample()
            n = max(cur[1] - last[1], 1)
            op = re.search(r"op=(\S+)", line).group(1)
            p50 = float(re.search(r"p50_us=(\S+)", line).group(1)) / 1000
            print(f"{op}\tclient p50 {p50:.1f} ms\tdaemon Get mean "
                  f"{1000 * (cur[0] - last[0]) / n:.2f} ms\tdaemon CPU per Get "
                  f"{1000 * (cur[2] - last[2]) / n:.2f} ms\t({int(n)} Gets)", flush=True)
            last = cur
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
