#!/usr/bin/env bash
# Installs shoal from the build folder $1 into a fresh prefix, then builds
# and runs the out-of-tree example (source tree $2, examples/cpp/) against
# it, and imports the installed Python package.
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/shoal-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/shoal/shoal.h include/shoal/module.h lib/libshoal.so lib/cmake/shoal/shoalConfig.cmake bin/shoal; do
  [ -e "$prefix/$f" ] || { echo "install_test: $f was not installed"; exit 1; }
done
# The public headers expose torch and the standard library only.
if grep -rnE '#include "(absl|grpc|google|shoal/(core|client|server|session|strategy|transport|config|model|data|cluster))' \
    "$prefix/include/shoal"; then
  echo "install_test: a public header includes an internal one"
  exit 1
fi

cmake -S "$src/examples/cpp" -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/example" -j 2 >/dev/null
"$work/example/train_my_net" --max_steps 400 | tee "$work/out.txt"
accuracy=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$work/out.txt")
awk -v a="$accuracy" 'BEGIN { exit !(a > 60) }' || { echo "install_test: accuracy '$accuracy' is not above 60%"; exit 1; }

"$prefix/bin/shoal" train --max_steps 50 --quiet >/dev/null
PYTHONPATH="$prefix/lib/python3/dist-packages" /usr/bin/python3 -c '
import shoal
report = shoal.train(config={"training": {"max_steps": 50}, "data": {"train_examples": 2000, "test_examples": 500}})
assert report["global_step"] >= 50, report
print("installed Python package: trained", report["global_step"], "steps")
'
echo "install_test: passed"
