#!/usr/bin/env bash
# No circle between daemon/ modules (issue 23): include_graph.py on daemon/, with the
# layering rules that keep the handlers below the daemon (admin, peer, rows never reach
# server / dispatch; http never sees the server struct). First the checker itself: a
# made-up folder with a circle (a.c -> b.h, b.c -> a.h) must fail, one without must pass.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
CHECK="$ROOT/tests/integration/include_graph.py"
fail() { echo "FAIL: $*"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/circle" "$tmp/tree"
printf '#include "b.h"\n' >"$tmp/circle/a.c"; : >"$tmp/circle/a.h"
printf '#include "a.h"\n' >"$tmp/circle/b.c"; : >"$tmp/circle/b.h"
printf '#include "b.h"\n#include "c.h"\n' >"$tmp/tree/a.c"; : >"$tmp/tree/a.h"
printf '#include "c.h"\n' >"$tmp/tree/b.h"; : >"$tmp/tree/c.h"
out=$("$PY" "$CHECK" "$tmp/circle") && fail "a circle a -> b -> a passed: $out"
case "$out" in *"a -> b -> a"*) ;; *) fail "circle not named: $out" ;; esac
"$PY" "$CHECK" "$tmp/tree" >/dev/null || fail "a tree was reported as a circle"
"$PY" "$CHECK" "$tmp/tree" --forbid a:c >/dev/null && fail "--forbid a:c passed (a includes c.h)"
"$PY" "$CHECK" "$tmp/tree" --forbid c:a >/dev/null || fail "--forbid c:a failed (c includes nothing)"

"$PY" "$CHECK" "$ROOT/daemon" --print \
  --forbid admin:server --forbid admin:dispatch --forbid admin:rows \
  --forbid peer:server --forbid peer:dispatch --forbid peer:rows \
  --forbid rows:server --forbid rows:dispatch \
  --forbid conn:lease --forbid conn:listen --forbid conn:rows --forbid conn:peer \
  --forbid http:conn --forbid http:server \
  || fail "daemon/ include graph (above)"
echo "test_include_graph: ok"
