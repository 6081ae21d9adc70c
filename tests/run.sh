#!/usr/bin/env bash
# Runs every test program and script given on the command line and ends with
# "N passed, N failed". cmocka binaries count their individual tests; a script or a
# corpus replay counts as one test. Each program has a time limit so nothing hangs CI.
set -u
pass=0; fail=0; failed_names=()
limit=${MF_TEST_TIMEOUT:-300}
for t in "$@"; do
  name=$t
  case "$t" in
    replay:*)
      n=${t#replay:}; name="replay $n"
      cmd=("$MF_BIN/tests/replay_$n" "tests/fuzz/corpus/$n") ;;
    *.py) cmd=("${PYTHON:-python3}" "$t") ;;
    *.sh) cmd=(bash "$t") ;;
    *) cmd=("$t") ;;
  esac
  echo "=== $name"
  out=$(timeout --kill-after=10 "$limit" "${cmd[@]}" 2>&1); rc=$?
  printf '%s\n' "$out"
  # cmocka's stdout and stderr interleave, so match its summary anywhere in a line.
  p=$(printf '%s\n' "$out" | grep -o '\[  PASSED  \] [0-9]* test' | awk '{s+=$(NF-1)} END {print s+0}')
  f=$(printf '%s\n' "$out" | grep -o '\[  FAILED  \] [0-9]* test' | awk '{s+=$(NF-1)} END {print s+0}')
  if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
    if [ $rc -eq 0 ]; then p=1; else f=1; fi
  elif [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1   # crashed or timed out after its tests reported
  fi
  [ $rc -eq 124 ] && echo "*** $name: timed out after ${limit}s"
  pass=$((pass + p)); fail=$((fail + f))
  [ "$f" -gt 0 ] && failed_names+=("$name")
done
echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
