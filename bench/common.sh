# Sourced by the report scripts in bench/: strict mode, the repository root,
# dependencies and a build, bench/out. shoal sets its own compute threads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/bootstrap.sh >&2
out=bench/out
mkdir -p "$out"
