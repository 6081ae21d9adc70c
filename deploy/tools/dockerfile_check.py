#!/usr/bin/env python3
"""dockerfile_check: the container image recipe against the README and the binaries.

    dockerfile_check.py [--needed-to|--needed-from JSON] DOCKERFILE README [BINARY...]

Exit 0 when all pass, else 1. --needed-to saves the binaries' {package: [libraries]}
(dpkg is slow), --needed-from reuses it instead of BINARY arguments.

Checks (each printed):
  * multi-stage on Debian 12: the first stage FROM debian:12 / bookworm, the last
    FROM its -slim variant, the last copies from an earlier stage;
  * the build stage's `make` commands equal the ones in the README block that follows
    the marker `<!-- build-steps -->` (same targets in the same order; `sudo`,
    VAR=value arguments and -jN may differ, e.g. PREFIX/DESTDIR for staging);
  * the runtime stage: a non-root USER, a HEALTHCHECK through `mapflowctl ... health`,
    no -dev packages or compilers;
  * the version: a global `ARG MAPFLOW_VERSION=X.Y.Z`, which the build stage compares
    with `make -s version` (the sources' one version) and the runtime stage writes into
    the org.opencontainers.image.version label;
  * with BINARY arguments (built mapflowd, mapflowctl): every DT_NEEDED library of
    theirs comes from a package the runtime stage installs (or that debian:12-slim
    already has), and every package it installs is needed by one of them.
"""
import json
import os
import re
import shlex
import subprocess
import sys

BASE_SLIM = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libzstd1", "liblzma5",
             "libselinux1", "libpcre2-8-0", "libacl1", "libattr1", "libbz2-1.0"}
TOOLCHAIN = re.compile(r"(-dev$|^gcc|^g\+\+|^clang|^build-essential$|^make$|^cpp$)")


def instructions(text):
    """[(KEYWORD, args)] with continuations joined and comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):
            continue
        cur += (" " if cur else "") + s.rstrip("\\").strip()
        if not s.endswith("\\"):
            kw, _, rest = cur.partition(" ")
            out.append((kw.upper(), rest.strip()))
            cur = ""
    return out


def commands(run_args):
    """Shell commands of one RUN (shell or exec form), split on && and ;."""
    if run_args.startswith("["):
        run_args = " ".join(json.loads(run_args))
    return [c.strip() for c in re.split(r"&&|;|\|\|", run_args) if c.strip()]


def make_targets(cmd):
    """('deps',) for `sudo make deps PREFIX=/usr -j4`; None when cmd is not make."""
    try:
        words = shlex.split(cmd.split("#", 1)[0])
    except ValueError:
        return None
    while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
        words = words[1:]
    if not words or words[0] != "make":
        return None
    return tuple(w for w in words[1:] if not w.startswith("-") and "=" not in w)


def apt_packages(cmd):
    words = cmd.split()
    if "apt-get" not in words or "install" not in words:
        return []
    return [w for w in words[words.index("install") + 1:] if not w.startswith("-")]


def stages(instrs):
    out = []
    for kw, args in instrs:
        if kw == "FROM":
            out.append({"from": args, "instrs": []})
        elif out:
            out[-1]["instrs"].append((kw, args))
    return out


def readme_make_steps(text):
    m = re.search(r"<!--\s*build-steps\s*-->\s*```[a-z]*\n(.*?)```", text, re.S)
    if not m:
        return None
    steps = []
    for line in m.group(1).splitlines():
        for c in re.split(r"&&|;", line):
            t = make_targets(c.strip())
            if t is not None:
                steps.append(t)
    return steps


def needed_packages(binaries):
    """{package: [libs]} for the DT_NEEDED entries of the binaries (one dpkg call)."""
    wanted = {}   # path -> lib
    unresolved = set()
    for binary in binaries:
        r = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True)
        # ldd gives the path the loader picks (right architecture); dpkg -S names its owner.
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        paths = dict(re.findall(r"^\s*(\S+) => (/\S+)", out, re.M))
        # The dynamic loader (NEEDED once a library uses TLS, e.g. __tls_get_addr) is
        # listed by its path alone, without "=>".
        for path in re.findall(r"^\s*(/\S*/(ld-linux[^/\s]*))\s", out, re.M):
            paths.setdefault(path[1], path[0])
        for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout):
            path = paths.get(lib)
            if not path:
                unresolved.add(lib)
                continue
            for cand in (path, os.path.realpath(path), "/usr" + path):
                wanted[cand] = lib
    pkgs = {}
    found = set()
    q = subprocess.run(["dpkg", "-S"] + sorted(wanted), capture_output=True, text=True)
    for line in q.stdout.splitlines():
        owner, _, path = line.partition(": ")
        lib = wanted.get(path.strip())
        if lib and lib not in found:
            found.add(lib)
            pkgs.setdefault(owner.split(":")[0].split(",")[0].strip(), []).append(lib)
    for lib in sorted(unresolved | (set(wanted.values()) - found)):
        pkgs.setdefault(f"?{lib}", []).append(lib)
    return pkgs


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    needed_json = None
    if argv[1] in ("--needed-from", "--needed-to"):
        needed_json, mode, argv = argv[2], argv[1], argv[:1] + argv[3:]
    dockerfile, readme, binaries = argv[1], argv[2], argv[3:]
    with open(dockerfile, encoding="utf-8") as f:
        instrs = instructions(f.read())
    st = stages(instrs)
    with open(readme, encoding="utf-8") as f:
        readme_text = f.read()
    errs, ok = [], []

    def need(cond, what, why):
        (ok if cond else errs).append(what if cond else f"{what}: {why}")

    need(len(st) >= 2, "multi-stage", f"{len(st)} stage(s)")
    if len(st) < 2:
        print(f"FAIL {errs[-1]}", file=sys.stderr)
        return 1
    first, last = st[0], st[-1]
    need(re.match(r"debian:(12|bookworm)(\s|$)", first["from"]) is not None,
         "build stage FROM debian:12", f"got FROM {first['from']}")
    need(re.match(r"debian:(12|bookworm)-slim(\s|$)", last["from"]) is not None,
         "runtime stage FROM debian:12-slim", f"got FROM {last['from']}")
    need(any(kw == "COPY" and "--from=" in a for kw, a in last["instrs"]),
         "runtime stage copies from the build stage", "no COPY --from=")

    build_cmds = [c for kw, a in first["instrs"] if kw == "RUN" for c in commands(a)]
    docker_steps = [t for t in map(make_targets, build_cmds) if t is not None]
    readme_steps = readme_make_steps(readme_text)
    need(readme_steps is not None, "README has a <!-- build-steps --> code block", "marker missing")
    if readme_steps is not None:
        fmt = lambda steps: " ; ".join("make " + " ".join(t) if t else "make" for t in steps)
        need(docker_steps == readme_steps and docker_steps,
             f"build steps match the README ({fmt(docker_steps)})",
             f"Dockerfile runs [{fmt(docker_steps)}], README says [{fmt(readme_steps)}]")

    pre = [a for kw, a in instrs[:next((i for i, (k, _) in enumerate(instrs) if k == "FROM"),
                                        len(instrs))] if kw == "ARG"]
    ver = next((a.split("=", 1)[1] for a in pre if a.startswith("MAPFLOW_VERSION=")), None)
    need(ver is not None and re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", ver) is not None,
         f"global ARG MAPFLOW_VERSION={ver}", "no ARG MAPFLOW_VERSION=X.Y.Z before the first FROM")
    need(any(kw == "RUN" and "make -s version" in a and "$MAPFLOW_VERSION" in a
             for kw, a in first["instrs"]) and ("ARG", "MAPFLOW_VERSION") in first["instrs"],
         "build stage checks MAPFLOW_VERSION against make version",
         "no ARG MAPFLOW_VERSION + RUN comparing it with `make -s version`")
    labels = " ".join(a for kw, a in last["instrs"] if kw == "LABEL")
    need(("ARG", "MAPFLOW_VERSION") in last["instrs"] and
         re.search(r'org\.opencontainers\.image\.version="?\$\{?MAPFLOW_VERSION', labels),
         "runtime label org.opencontainers.image.version = $MAPFLOW_VERSION",
         "no ARG MAPFLOW_VERSION + LABEL org.opencontainers.image.version=\"$MAPFLOW_VERSION\"")

    users = [a for kw, a in last["instrs"] if kw == "USER"]
    user = users[-1].split(":")[0] if users else "root"
    need(user not in ("root", "0"), "runtime USER is not root", f"USER {user}")
    hc = [a for kw, a in last["instrs"] if kw == "HEALTHCHECK"]
    need(bool(hc) and "mapflowctl" in hc[-1] and "health" in hc[-1],
         "HEALTHCHECK runs mapflowctl health", f"got {hc[-1] if hc else 'none'}")

    runtime_pkgs = [p for kw, a in last["instrs"] if kw == "RUN" for c in commands(a)
                    for p in apt_packages(c)]
    bad = [p for p in runtime_pkgs if TOOLCHAIN.search(p)]
    need(not bad, "runtime stage installs no -dev packages or compilers", f"it installs {bad}")

    needed = None
    if needed_json and mode == "--needed-from":
        with open(needed_json, encoding="utf-8") as f:
            needed = json.load(f)
    elif binaries:
        needed = needed_packages(binaries)
        if needed_json:
            with open(needed_json, "w", encoding="utf-8") as f:
                json.dump(needed, f)
    if needed is not None:
        missing = {p: sorted(l) for p, l in needed.items()
                   if p not in runtime_pkgs and p not in BASE_SLIM}
        need(not missing, f"runtime packages cover the binaries' libraries ({len(needed)} packages)",
             "missing " + ", ".join(f"{p} ({' '.join(l)})" for p, l in sorted(missing.items())))
        extra = sorted(set(runtime_pkgs) - set(needed))
        need(not extra, "runtime stage installs nothing the binaries do not load",
             f"unneeded: {extra}")
    else:
        ok.append("runtime libraries not compared (no binaries given)")

    for e in errs:
        print(f"{dockerfile}: FAIL {e}", file=sys.stderr)
    for o in ok:
        print(f"{dockerfile}: ok {o}")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
