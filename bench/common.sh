# Sourced by the report scripts in bench/: strict mode, the repository root,
# dependencies and a build, bench/out. shoal sets its own compute threads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/bootstrap.sh >&2
out=bench/out
mkdir -p "$out"

# The generated click log with a planted model (bench/criteo_gen.py) in
# $out/criteo: $1 training examples (default 400,000) and 100,000 held out,
# made unless that log is there already.
click_log() {
  local examples=${1:-400000}
  mkdir -p "$out/criteo"
  if ! grep -q "\"examples\": $examples," "$out/criteo/planted.json" 2>/dev/null; then
    /usr/bin/python3 bench/criteo_gen.py --examples "$examples" --out "$out/criteo/train.tsv" \
      --test_out "$out/criteo/test.tsv" --test_examples 100000 > "$out/criteo/planted.json"
  fi
}
