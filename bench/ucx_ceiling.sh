#!/usr/bin/env bash
# UCX's own ceiling on this machine, measured by ucx_perftest (Debian's
# ucx-utils): active-message ping-pong (ucp_am_lat, the exchange closest to
# shoal's push then pull) at 1 KiB and 1 MiB, over TCP and over shared
# memory, both in UCX's default busy-polling mode and in the event-driven
# mode shoal uses (-E sleep). Prints one JSON object: per direction GB/s
# (size / one-way time) and round trips per second; and two TCP ping-pongs
# at once in event mode (their sum: per direction GB/s counting each byte
# once, and round trips per second).
#
#   bench/ucx_ceiling.sh > bench/out/ucx_ceiling.json
set -euo pipefail
port=$((20000 + RANDOM % 20000))
pair_a=$(mktemp) pair_b=$(mktemp)
trap 'rm -f "$pair_a" "$pair_b"' EXIT

# run TLS SIZE MODE -> "bandwidth_MiB_per_s round_trips_per_s"
run() {
  local tls=$1 size=$2 mode=$3 iterations=2000
  [ "$size" -le 4096 ] && iterations=20000
  local extra=()
  [ "$mode" = sleep ] && extra=(-E sleep)
  UCX_TLS=$tls ucx_perftest -p "$port" -t ucp_am_lat -s "$size" -n "$iterations" "${extra[@]}" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  local line
  line=$(UCX_TLS=$tls timeout 60 ucx_perftest 127.0.0.1 -p "$port" -t ucp_am_lat -s "$size" -n "$iterations" \
    "${extra[@]}" 2>/dev/null | grep '^Final:' || true)
  wait "$server" || true
  port=$((port + 1))
  # Final: iterations typical avg overall(usec, one way) bw_avg bw_overall(MiB/s) rate_avg rate_overall(msgs/s)
  echo "$line" | awk '{ if (NF >= 9) printf "%s %s\n", $7, 1e6 / (2 * $5); else print "0 0" }'
}

echo "{"
first=1
for tls in tcp posix,cma,self; do
  name=$([ "$tls" = tcp ] && echo tcp || echo shm)
  for mode in busy sleep; do
    for size in 1024 1048576; do
      read -r mib rtps < <(run "$tls" "$size" "$mode")
      [ $first -eq 1 ] || echo ","
      first=0
      gbps=$(awk -v m="$mib" 'BEGIN { printf "%.3f", m * 1048576 / 1e9 }')
      printf '  "%s_%s_%s": {"gb_per_s_per_direction": %s, "round_trips_per_s": %.0f}' \
        "$name" "$mode" "$size" "$gbps" "$rtps"
    done
  done
done
echo ","
# Two 1 MiB ping-pongs over TCP at once, event mode: what UCX gives shoal's
# 1 MiB calls over TCP when two run side by side (as the transport bench's
# best of 1-8 in flight may), counted as one exchange per round trip (each
# byte once per direction).
run tcp 1048576 sleep > "$pair_a" &
first_pair=$!
port=$((port + 1))
run tcp 1048576 sleep > "$pair_b"
wait "$first_pair"
read -r _ rtps_a < "$pair_a"
read -r _ rtps_b < "$pair_b"
awk -v a="$rtps_a" -v b="$rtps_b" 'BEGIN {
  printf "  \"tcp_sleep_1048576_two_at_once\": {\"gb_per_s_per_direction\": %.3f, \"round_trips_per_s\": %.0f}\n",
    (a + b) * 1048576 / 1e9, a + b }'
echo "}"
