#!/usr/bin/env python3
"""Turns mapflow-bench-daemon's RESULT/INFO lines into the comparison table.

Every point may be repeated (several RESULT lines with one key): the table shows the
median ops/s, p50 and p99, GB/s as min / median / max, and ratios of medians. Prints the
table (with ratios against the baselines of the same run and the issue's goals) and, with
--out, writes bench/results/daemon.md: the exact command, machine
info, the INFO lines, the table, and bench/daemon/analysis.md (hand-written profile notes)
appended as is. Standard library only.
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys

def parse(path):
    res, info = {}, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "INFO":
                info.append("\t".join(parts[1:]))
            elif parts[0] == "RESULT":
                kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
                key = (kv["system"], kv["op"], int(kv["clients"]))
                for k in ("ops", "bytes", "errors"):
                    kv[k] = int(kv[k])
                for k in ("wall_s", "ops_s", "gbps", "p50_us", "p99_us", "mean_us"):
                    kv[k] = float(kv[k])
                res.setdefault(key, []).append(kv)
    return {k: summarise(v) for k, v in res.items()}, info


def summarise(reps):
    """One row from the repetitions of a point: medians, GB/s min and max, errors summed."""
    med = lambda k: statistics.median(r[k] for r in reps)
    out = dict(reps[-1])
    for k in ("ops_s", "gbps", "p50_us", "p99_us", "mean_us", "wall_s"):
        out[k] = med(k)
    out["gbps_min"] = min(r["gbps"] for r in reps)
    out["gbps_max"] = max(r["gbps"] for r in reps)
    out["reps"] = len(reps)
    out["errors"] = sum(r["errors"] for r in reps)
    out["err"] = next((r["err"] for r in reps if r.get("err")), "")
    return out


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kb = int(f.readline().split()[1])
            mem = "%.1f GiB" % (kb / 1048576)
    except (OSError, ValueError, IndexError):
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False).stdout.strip()
    except OSError:
        rev = "?"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem": mem,
        "kernel": platform.release(),
        "commit": rev or "?",
    }


class Row:
    def __init__(self, label, clients, r, base_label=None, base=None, metric="gbps",
                 goal=None):
        self.label, self.clients, self.r = label, clients, r
        self.base_label, self.base, self.metric, self.goal = base_label, base, metric, goal

    def ratio(self):
        if not self.r or not self.base or not self.base.get(self.metric):
            return None
        return self.r[self.metric] / self.base[self.metric]


def fmt(v, nd=2):
    if v is None:
        return "-"
    if v >= 1000:
        return "%.0f" % v
    return ("%%.%df" % nd) % v


def build_rows(res):
    """One block per measurement, its client counts in order."""
    g = lambda s, o, c: res.get((s, o, c))
    ops = sorted({o for (s, o, c) in res if s == "mapflow"})
    lookups = [o for o in ops if o.startswith("lookup_")]
    prefixes = [o for o in ops if o.startswith("prefix_")]
    copy_goal = (">= 0.70", 0.70)
    redis_goal = lambda c: (">= 5x at 16", 5.0) if c == 16 else None
    blocks = [
        lambda c: Row("memcpy (ceiling)", c, g("memcpy", "copy", c)),
        lambda c: Row("row verify (checksum)", c, g("memcpy", "verify", c), "memcpy",
                      g("memcpy", "copy", c)),
        lambda c: Row("get_copy", c, g("mapflow", "get_copy", c), "memcpy",
                      g("memcpy", "copy", c), goal=copy_goal),
        lambda c: Row("get_copy (verify header)", c, g("mapflow", "get_copy_hdr", c), "memcpy",
                      g("memcpy", "copy", c), goal=copy_goal),
        lambda c: Row("get_copy (no arena: socket)", c, g("mapflow", "get_copy_sock", c),
                      "memcpy", g("memcpy", "copy", c)),
        lambda c: Row("get_lease", c, g("mapflow", "get_lease", c), "memcpy",
                      g("memcpy", "copy", c)),
        lambda c: Row("get_lease_copy", c, g("mapflow", "get_lease_copy", c), "memcpy",
                      g("memcpy", "copy", c)),
    ]
    # Redis: the default server and the one with io-threads, every ratio against both.
    # Socket to socket (like for like): mapflowd with the arena off, rows copied over its
    # unix socket, against GET over Redis's unix socket. The arena rows are mapflowd's
    # shared-memory path: Redis has no shared-memory client path, so those ratios are
    # against a socket and are labelled so (memcpy above is their like-for-like ceiling).
    for sysname, lbl in (("redis", "redis GET"), ("redis-io", "redis-io GET")):
        setl = lbl.replace("GET", "SET")
        blocks += [
            lambda c, s=sysname, l=lbl: Row(l, c, g(s, "get_copy", c)),
            lambda c, s=sysname, l=lbl: Row("get_copy (no arena: socket) [socket vs socket]",
                                            c, g("mapflow", "get_copy_sock", c), l,
                                            g(s, "get_copy", c)),
            lambda c, s=sysname, l=lbl: Row("get_copy (arena) [shm vs socket]", c,
                                            g("mapflow", "get_copy", c), l,
                                            g(s, "get_copy", c), goal=redis_goal(c)),
            lambda c, s=sysname, l=lbl: Row("get_lease (arena) [shm vs socket]", c,
                                            g("mapflow", "get_lease", c), l,
                                            g(s, "get_copy", c), goal=redis_goal(c)),
            lambda c, s=sysname, l=setl: Row(l, c, g(s, "put", c)),
            lambda c, s=sysname, l=setl: Row("put", c, g("mapflow", "put", c), l,
                                             g(s, "put", c)),
            lambda c, s=sysname, l=setl: Row("put (write_through off)", c,
                                             g("mapflow", "put_wt_off", c), l, g(s, "put", c)),
        ]
    blocks += [
        lambda c: Row("rocksdb get (direct, one pass)", c, g("rocksdb", "ssd_get", c)),
        lambda c: Row("ssd_get", c, g("mapflow", "ssd_get", c), "rocksdb get",
                      g("rocksdb", "ssd_get", c), goal=(">= 0.80", 0.80)),
        lambda c: Row("ssd_get (verify header)", c, g("mapflow", "ssd_get_hdr", c),
                      "rocksdb get", g("rocksdb", "ssd_get", c), goal=(">= 0.80", 0.80)),
        lambda c: Row("rocksdb get (use_direct_reads, one pass)", c,
                      g("rocksdb", "ssd_get_odirect", c)),
        lambda c: Row("ssd_get", c, g("mapflow", "ssd_get", c), "rocksdb O_DIRECT",
                      g("rocksdb", "ssd_get_odirect", c)),
    ]
    for o in lookups:
        blocks.append(lambda c, o=o: Row(o, c, g("mapflow", o, c), metric="p99",
                                         goal=("p99 < 200 us", 200.0)
                                         if o.startswith("lookup_512x") and c == 16 else None))
    for o in prefixes:
        blocks.append(lambda c, o=o: Row(o, c, g("mapflow", o, c), "memcpy",
                                         g("memcpy", "copy", c)))
    blocks.append(lambda c: Row("mixed", c, g("mapflow", "mixed", c)))
    for k in ("put", "lookup", "prefix_lease", "get_copy"):
        blocks.append(lambda c, k=k: Row("  mixed: " + k, c, g("mapflow", "mixed/" + k, c)))
    counts = sorted({c for (_, _, c) in res})
    rows = []
    for make in blocks:
        rows += [r for r in (make(c) for c in counts) if r.r]
    return rows


def verdict(row):
    if not row.goal:
        return ""
    text, thr = row.goal
    if row.metric == "p99":
        ok = row.r["p99_us"] < thr
        return "%s: %s" % (text, "PASS" if ok else "MISS")
    rt = row.ratio()
    if rt is None:
        return "%s: no baseline" % text
    return "%s: %s" % (text, "PASS" if rt >= thr else "MISS")


HEAD = ["measurement", "clients", "reps", "ops/s", "GB/s min", "GB/s med", "GB/s max",
        "p50 us", "p99 us", "vs", "ratio", "goal"]
LEFT = (0, 9, 11)  # text columns


def cells(row):
    r = row.r
    gb = r["bytes"] > 0
    rt = row.ratio()
    err = " (%d errors)" % r["errors"] if r["errors"] else ""
    extra = ""
    if "ssd_rows" in r:
        extra = " [ssd rows %s]" % r["ssd_rows"]
    return [row.label + err + extra, str(row.clients), str(r["reps"]), fmt(r["ops_s"], 1),
            fmt(r["gbps_min"] if gb else None), fmt(r["gbps"] if gb else None),
            fmt(r["gbps_max"] if gb else None),
            fmt(r["p50_us"], 0), fmt(r["p99_us"], 0), row.base_label or "",
            ("%.2fx" % rt) if rt is not None else "", verdict(row)]


def text_table(rows):
    data = [HEAD] + [cells(r) for r in rows]
    w = [max(len(d[i]) for d in data) for i in range(len(HEAD))]
    out = []
    for n, d in enumerate(data):
        out.append("  ".join(s.ljust(w[i]) if i in LEFT else s.rjust(w[i])
                             for i, s in enumerate(d)).rstrip())
        if n == 0:
            out.append("  ".join("-" * x for x in w))
    return "\n".join(out)


def md_table(rows):
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in rows:
        out.append("| " + " | ".join(c.strip() for c in cells(r)) + " |")
    return "\n".join(out)


def goals(rows):
    lines = []
    for r in rows:
        if r.goal:
            v = verdict(r)
            if r.metric == "p99":
                detail = "p99 %.0f us" % r.r["p99_us"]
            else:
                rt = r.ratio()
                detail = "%.2fx %s" % (rt, r.base_label) if rt is not None else "no baseline"
            lines.append("- %s at %d clients: %s (%s)" % (r.label, r.clients, v, detail))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True)
    ap.add_argument("--command", default="bench/daemon/run.sh")
    ap.add_argument("--redis-version", default="?")
    ap.add_argument("--host-bytes", default="?")
    ap.add_argument("--cpus", default="all")
    ap.add_argument("--redis-io-threads", default="?")
    ap.add_argument("--cold", default="?", help="yes: page cache dropped before SSD passes")
    ap.add_argument("--out")
    ap.add_argument("--commit", help="commit the binaries were built from (default: HEAD now)")
    ap.add_argument("--date", help="when the run started (default: now)")
    a = ap.parse_args()
    res, info = parse(a.results)
    if not res:
        print("report.py: no RESULT lines in %s" % a.results, file=sys.stderr)
        return 1
    rows = build_rows(res)
    m = machine()
    print()
    print(text_table(rows))
    print()
    print("goals:")
    print("\n".join(goals(rows)) or "  (no goal rows measured)")
    if not a.out:
        return 0
    when = a.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [
        "# mapflowd against memcpy, Redis and RocksDB (issue 13)",
        "",
        "Generated by `bench/daemon/run.sh` (bench/daemon/report.py); do not edit by hand —",
        "the analysis at the end comes from bench/daemon/analysis.md.",
        "",
        "- command: `%s`" % a.command,
        "- date: %s, commit %s" % (when, a.commit or m["commit"]),
        "- machine: %s CPUs (nproc), %s, %s RAM, kernel %s" % (m["nproc"], m["cpu"], m["mem"],
                                                            m["kernel"]),
        "- pinned to CPUs: %s (see the load-average line under Workload: a 1-min load above "
        "the CPUs used means other jobs shared them)" % a.cpus,
        "- mapflowd: host tier %s, write_through async (default), unix socket; "
        "redis-server %s: unix socket, no persistence, two servers: defaults (\"redis\") and "
        "io-threads %s with io-threads-do-reads yes (\"redis-io\")" % (
            a.host_bytes, a.redis_version, a.redis_io_threads),
        "- SSD passes (mapflowd ssd_get, rocksdb get): page cache dropped before each: %s"
        % a.cold,
        "- every point repeated (reps column); ops/s, p50, p99 and ratios are medians "
        "(ratio = median / median), GB/s min / median / max",
        "- clients are threads of one process, each with its own connection; GB/s = 1e9 B/s",
        "",
        "## Workload",
        "",
    ]
    md += ["- " + i for i in info]
    md += ["", "## Goals", ""] + (goals(rows) or ["(none measured)"])
    md += ["", "## Table", "", md_table(rows), ""]
    errs = ["- %s at %d clients: %s" % (r.label.strip(), r.clients, r.r["err"])
            for r in rows if r.r.get("err")]
    if errs:
        md += ["Errors (first message of the first failing client):", ""] + errs + [""]
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "analysis.md")
    if os.path.exists(notes):
        md += ["", open(notes, encoding="utf-8").read().rstrip(), ""]
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    print("\nwrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
