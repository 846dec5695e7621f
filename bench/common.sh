# Sourced by the report scripts in bench/: strict mode, the repository root,
# dependencies and a build, bench/out, and one BLAS thread per process.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/bootstrap.sh >&2
out=bench/out
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
