#!/usr/bin/env python3
"""unit_check: the settings mapflowd.service must keep (deploy/README.md, "security").

    unit_check.py UNIT_FILE         exit 0 and print what was checked, else exit 1

Parses systemd unit syntax (sections, comments, line continuations; a later
assignment of a key wins, an empty one resets it) and checks the policy below. It is
not a replacement for `systemd-analyze verify`, which the test also runs where present.
"""
import re
import sys

TRUE = {"1", "yes", "true", "on"}


def parse_unit(text):
    """Returns {section: {key: [values in order]}}; raises ValueError on bad syntax."""
    units, section, pending = {}, None, ""
    for n, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        m = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if m:
            section = units.setdefault(m.group(1), {})
            continue
        if section is None or "=" not in line:
            raise ValueError(f"line {n}: not 'Key=value' inside a [Section]: {raw!r}")
        key, value = line.split("=", 1)
        section.setdefault(key.strip(), []).append(value.strip())
    return units


def last(units, section, key):
    vals = units.get(section, {}).get(key, [])
    return vals[-1] if vals else None


def check(units):
    """Returns (checked, errors): lists of human-readable lines."""
    ok, errs = [], []

    def need(cond, what, why):
        (ok if cond else errs).append(what if cond else f"{what}: {why}")

    svc = "Service"
    need(last(units, svc, "Type") == "notify", "Type=notify",
         f"got {last(units, svc, 'Type')!r} (the daemon sends READY/RELOADING/STOPPING)")
    start = last(units, svc, "ExecStart") or ""
    need(re.match(r"^\S*/mapflowd -c /\S*/mapflowd\.conf(\s|$)", start) is not None,
         "ExecStart runs mapflowd -c SYSCONFDIR/mapflowd.conf", f"got {start!r}")
    reload_ = last(units, svc, "ExecReload") or ""
    need(re.search(r"kill\s+-(HUP|SIGHUP|s\s+HUP)\s+\$MAINPID", reload_) is not None,
         "ExecReload sends SIGHUP to $MAINPID", f"got {reload_!r}")
    user = last(units, svc, "User")
    need(bool(user) and user not in ("root", "0") and last(units, svc, "DynamicUser") not in TRUE,
         "dedicated User=", f"got User={user!r}")
    need(last(units, svc, "StateDirectory") == "mapflowd", "StateDirectory=mapflowd (SSD tier)",
         f"got {last(units, svc, 'StateDirectory')!r}")
    need(last(units, svc, "RuntimeDirectory") == "mapflowd", "RuntimeDirectory=mapflowd (socket)",
         f"got {last(units, svc, 'RuntimeDirectory')!r}")
    need(last(units, svc, "LimitMEMLOCK") == "infinity", "LimitMEMLOCK=infinity",
         f"got {last(units, svc, 'LimitMEMLOCK')!r} (the host arena is pinned)")
    nofile = last(units, svc, "LimitNOFILE") or ""
    need(nofile == "infinity" or (nofile.split(":")[0].isdigit() and int(nofile.split(":")[0]) >= 4096),
         "LimitNOFILE>=4096", f"got {nofile!r}")
    pdev = (last(units, svc, "PrivateDevices") or "no").lower()
    need(pdev not in TRUE, "no PrivateDevices=yes",
         f"PrivateDevices={pdev} hides /dev/nvidia* and /dev/infiniband")
    need(last(units, svc, "DevicePolicy") in (None, "", "auto"), "DevicePolicy unset",
         "a device policy needs DeviceAllow= for nvidia and infiniband; see README")
    need((last(units, svc, "NoNewPrivileges") or "").lower() in TRUE, "NoNewPrivileges=yes",
         "missing")
    need(last(units, svc, "ProtectSystem") in ("strict", "full"), "ProtectSystem=strict|full",
         f"got {last(units, svc, 'ProtectSystem')!r}")
    need(last(units, "Install", "WantedBy") is not None, "[Install] WantedBy=", "missing")
    return ok, errs


def main(argv):
    if len(argv) != 2:
        print("usage: unit_check.py UNIT_FILE", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            units = parse_unit(f.read())
    except (OSError, ValueError) as e:
        print(f"{argv[1]}: {e}", file=sys.stderr)
        return 1
    ok, errs = check(units)
    for e in errs:
        print(f"{argv[1]}: FAIL {e}", file=sys.stderr)
    if errs:
        return 1
    print(f"{argv[1]}: ok ({len(ok)} checks: {'; '.join(ok)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
