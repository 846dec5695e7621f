#!/usr/bin/env bash
# The default test suite (what guards behaviour), then what it left out:
# the tests labelled `long` (soak-like: many kills, long runs), which
# `ctest --test-dir build -L long` runs.
#
#   scripts/run_tests.sh             # the default suite
#   scripts/run_tests.sh --all       # and the long tests
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${SHOAL_TEST_JOBS:-2}"
if [ "${1:-}" = "--all" ]; then
  exec ctest --test-dir build --output-on-failure -j "$jobs"
fi
status=0
ctest --test-dir build --output-on-failure -j "$jobs" -LE long || status=$?
left_out=$(ctest --test-dir build -N -L long | sed -n 's/^ *Test *#[0-9]*: //p' | sed 's/  # GetParam().*//')
count=$(printf '%s\n' "$left_out" | grep -c . || true)
echo
echo "run_tests: left out ${count} long test(s), labelled 'long':"
printf '%s\n' "$left_out" | sed 's/^/  /'
echo "run_tests: run them with: ctest --test-dir build --output-on-failure -j ${jobs} -L long"
echo "           (or everything: scripts/run_tests.sh --all)"
exit "$status"
