#!/usr/bin/env bash
# Installs what shoal needs from Debian's packages (only what is missing),
# then configures and builds it in ./build.
#
#   scripts/bootstrap.sh --main     # what the main job needs: the library and the shoal command
#   scripts/bootstrap.sh            # everything: also the tests, benchmarks, Python package and docs checks
#   SHOAL_EXTRA_PACKAGES="ucx-utils" scripts/bootstrap.sh   # and any other package
set -euo pipefail
cd "$(dirname "$0")/.."

main_only=false
case "${1:-}" in
  --main) main_only=true ;;
  "") ;;
  *) echo "usage: scripts/bootstrap.sh [--main]" >&2; exit 2 ;;
esac

# The library and the shoal command.
packages=(
  cmake ninja-build g++ ccache pkg-config
  libopenblas0-pthread  # before libtorch-dev: otherwise apt's BLAS is Netlib's reference one, ~15x slower
  libtorch-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev libcairo2-dev
  libucx-dev  # the data plane (transport/ucx/)
  prometheus-cpp-dev  # /metrics (telemetry/prometheus_metrics.h)
  dataset-fashion-mnist
)
# The rest: tests, benchmarks, the Python package, the docs site.
if ! $main_only; then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    python3-torch  # PyTorch for /usr/bin/python3: the examples (examples/pytorch/) and the benchmarks' peers
    python3-dev python3-pybind11 python3-pytest  # the Python package (python/) and its tests
    ucx-utils  # UCX's own ceiling in the benchmarks (ucx_perftest)
    python3-protobuf  # the test that reads TensorBoard's event files back without shoal
    iproute2  # the network-partition test (ip netns)
    libblas3  # Netlib's reference BLAS, only for the test of the slow-BLAS warning (OpenBLAS stays the system's)
    mkdocs mkdocs-material  # the docs site, built --strict by a test
  )
fi
# shellcheck disable=SC2206
packages+=(${SHOAL_EXTRA_PACKAGES:-})

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

# `--main` configures without the parts whose packages it did not install;
# a later full bootstrap turns them on in the same build folder, and
# ninja and ccache keep what was compiled.
parts=ON
targets=()
if $main_only; then
  parts=OFF
  targets=(--target shoal_cli)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSHOAL_BUILD_TESTS=$parts -DSHOAL_BUILD_BENCH=$parts -DSHOAL_BUILD_PYTHON=$parts >/dev/null
cmake --build build -j "${SHOAL_BUILD_JOBS:-2}" "${targets[@]}"
