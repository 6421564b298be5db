#!/usr/bin/env bash
# Packs ray[data] and its dependencies, pruned, as .ray/ray-pack.tar.xz (under the device tool's 64 MiB carry), for a
# machine without network: `bash benchmarks/pack_ray.sh [PYTHON_VERSION (3.12)] [TARGET_DIR (for a test unpacked)]`.
# There: `mkdir -p /tmp/site && tar -xJf .ray/ray-pack.tar.xz -C /tmp/site` and put /tmp/site first on PYTHONPATH
# (benchmarks/device_run.sh does both where .ray is carried).
# NO_TAR=1 only installs and prunes into TARGET_DIR (to try the pruned packages here with the local Python's version).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
keep_site="${2:-}"  # without it, the unpacked packages are removed once packed
site="${keep_site:-$(mktemp -d)/site}"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"; [ -n "$keep_site" ] || rm -rf "$(dirname "$site")"' EXIT
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
target_args=(--only-binary=:all: --python-version "$version" --implementation cp "${platforms[@]/#/--platform=}")
python3 -m pip download -q -d "$wheels" "${target_args[@]}" "ray[data]>=2.60"
python3 -m pip install -q --no-index --find-links "$wheels" --no-compile --ignore-requires-python --target "$site" \
  "${target_args[@]}" "ray[data]>=2.60"

# What predict_dataset never loads: Java, RLlib, Serve, LLM, the dashboard's web pages, Arrow Flight and S3
# (pyarrow.fs goes on without it), C++ headers and every package's tests; and numpy, which the GPU machine has (its
# OpenCV needs it). The raylet, GCS server, dashboard agent and runtime-env agent stay.
cd "$site"
rm -rf ray/jars ray/rllib ray/serve ray/llm ray/dashboard/client/build pyarrow/include pyarrow/libarrow_flight.so* \
  pyarrow/_flight*.so pyarrow/libarrow_s3.so* pyarrow/_s3fs*.so \
  numpy numpy.libs numpy-*.dist-info bin
find . -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
find . -name "*.pyx" -o -name "*.pxd" -o -name "*.pyi" | xargs rm -f
cd - > /dev/null
[ "${NO_TAR:-0}" = 1 ] && { echo "$(du -sh "$site" | cut -f1) unpacked in $site"; exit 0; }
mkdir -p .ray
tar -cf - -C "$site" . | xz -T0 -9 > .ray/ray-pack.tar.xz
echo "$(du -sh "$site" | cut -f1) unpacked in $site; $(du -h .ray/ray-pack.tar.xz | cut -f1) packed:" \
  ".ray/ray-pack.tar.xz"
