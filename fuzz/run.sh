#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (Debian's clang, libFuzzer included)
# in build-fuzz/ and runs each for a bounded time, starting from valid seeds.
# Prints how long each ran and whether it found a crash (a crash stops it
# and leaves the input in build-fuzz/crash-*).
#
#   fuzz/run.sh [SECONDS_EACH]     # default 60
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
scripts/bootstrap.sh >&2
command -v clang++ > /dev/null || apt-get install -y --no-install-recommends clang >&2
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCH=OFF -DSHOAL_FUZZ=ON > /dev/null
ninja -C build-fuzz -j2 wire_decode_fuzz checkpoint_shard_fuzz table_checkpoint_fuzz variable_service_fuzz >&2
status=0
for target in wire_decode_fuzz checkpoint_shard_fuzz table_checkpoint_fuzz variable_service_fuzz; do
  corpus=build-fuzz/corpus_$target
  mkdir -p "$corpus"
  "build-fuzz/fuzz/$target" --write_seeds="$corpus"
  start=$(date +%s)
  if (cd build-fuzz && ASAN_OPTIONS=detect_leaks=0 "fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 \
        -timeout=10 "corpus_$target" 2> "$target.log"); then
    echo "$target: ran $(( $(date +%s) - start )) s, $(grep -o 'stat::number_of_executed_units: [0-9]*' "build-fuzz/$target.log" | grep -o '[0-9]*$' || echo '?') inputs, no crash"
  else
    echo "$target: FOUND A CRASH after $(( $(date +%s) - start )) s; see build-fuzz/$target.log"
    status=1
  fi
done
exit $status
