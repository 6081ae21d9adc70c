#!/usr/bin/env python3
"""daemon_check: runs the real mapflowd the way the deployment files do, in a temp dir.

    daemon_check.py --mapflowd BIN --config CONF [--notify] [--health-cmd JSON --bin-dir DIR]

Starts `BIN -c CONF` with the socket, data_dir and http overridden into a temporary
directory (small tiers), then:
  --notify      plays systemd for Type=notify: NOTIFY_SOCKET is a datagram socket here;
                expects READY=1 after start, RELOADING=1 with MONOTONIC_USEC= and then
                READY=1 after SIGHUP (what ExecReload sends), STOPPING=1 after SIGTERM;
  --health-cmd  runs a health-check command given as a JSON list (the Dockerfile's
                HEALTHCHECK), with /run/mapflowd/mapflowd.sock replaced by the temp
                socket and its program looked up in --bin-dir; it must exit 0.
Always: SIGTERM must end the daemon with exit status 0. Every wait is bounded.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

START_LIMIT_S = 30
STOP_LIMIT_S = 30


class Failure(Exception):
    pass


def wait_for_socket(path, proc, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise Failure(f"mapflowd exited with {proc.returncode} before listening")
        if os.path.exists(path):
            return
        time.sleep(0.05)
    raise Failure(f"no socket at {path} after {limit}s")


def read_notify(sock, want, limit, seen):
    """Collects notify datagrams until one carries `want`; returns that message."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            msg = sock.recv(4096).decode("utf-8", "replace")
        except socket.timeout:
            break
        seen.append(msg)
        if want in msg.split("\n"):
            return msg
    raise Failure(f"no {want} within {limit}s; got {seen}")


def run(args, tmp):
    sock_path = os.path.join(tmp, "mapflowd.sock")
    cmd = [args.mapflowd, "-c", args.config, "--socket", sock_path,
           "--data_dir", os.path.join(tmp, "data"), "--http", "127.0.0.1:0",
           "--host_bytes", "16mb", "--ssd_bytes", "64mb"]
    env = dict(os.environ)
    notify = None
    if args.notify:
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(os.path.join(tmp, "notify.sock"))
        env["NOTIFY_SOCKET"] = os.path.join(tmp, "notify.sock")
    log = open(os.path.join(tmp, "mapflowd.log"), "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    seen = []
    try:
        if notify:
            msg = read_notify(notify, "READY=1", START_LIMIT_S, seen)
            status = [m for m in seen if "STATUS=" in m]
            print(f"notify: READY=1 after start{' with ' + repr(status[-1].strip()) if status else ''}")
        wait_for_socket(sock_path, proc, START_LIMIT_S)
        mode = os.stat(sock_path).st_mode & 0o777
        if mode != 0o660:
            raise Failure(f"socket mode {oct(mode)}, the deployment docs promise 0660")
        print("socket: listening, mode 0660")
        if args.health_cmd:
            hc = json.loads(args.health_cmd)
            hc = [a.replace("/run/mapflowd/mapflowd.sock", sock_path) for a in hc]
            if "/" not in hc[0]:
                hc[0] = os.path.join(args.bin_dir, hc[0])
            r = subprocess.run(hc, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise Failure(f"health command {hc} exited {r.returncode}: {r.stdout}{r.stderr}")
            print(f"health command ok: {' '.join(hc[1:])}")
        if notify:
            seen.clear()
            proc.send_signal(signal.SIGHUP)
            msg = read_notify(notify, "RELOADING=1", START_LIMIT_S, seen)
            if "MONOTONIC_USEC=" not in msg:
                raise Failure(f"RELOADING=1 without MONOTONIC_USEC= in the same message: {msg!r}")
            read_notify(notify, "READY=1", START_LIMIT_S, seen)
            print("notify: SIGHUP -> RELOADING=1 + MONOTONIC_USEC, then READY=1")
            seen.clear()
        proc.send_signal(signal.SIGTERM)
        if notify:
            read_notify(notify, "STOPPING=1", STOP_LIMIT_S, seen)
            print("notify: SIGTERM -> STOPPING=1")
        rc = proc.wait(timeout=STOP_LIMIT_S)
        if rc != 0:
            raise Failure(f"mapflowd exited {rc} after SIGTERM")
        print("SIGTERM: exit 0")
    except (Failure, subprocess.TimeoutExpired) as e:
        log.seek(0)
        print(f"FAIL {e}\n--- mapflowd log:\n{log.read()[-3000:]}", file=sys.stderr)
        return 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        if notify:
            notify.close()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--mapflowd", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--notify", action="store_true")
    ap.add_argument("--health-cmd")
    ap.add_argument("--bin-dir", default=".")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        return run(args, tmp)


if __name__ == "__main__":
    sys.exit(main())
