#!/usr/bin/env bash
# One call on the GPU machine: install the carried Ultralytics wheel, build the operators, run the test suite
# (CUDA tests included; PYTEST_ARGS is shell words, so -k 'not slow' keeps its quotes), then the benchmarks named
# as arguments (e.g. "decode --predict"; separate with ';').
# Logs go to $OUT (the device tool's return folder) when set. A carried .ray/ray-pack.tar.xz (benchmarks/pack_ray.sh)
# is unpacked into /tmp/site first, for bench scale and the Ray tests.
set -o pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [ -f .ray/ray-pack.tar.xz ] && [ ! -d /tmp/site/ray ]; then
  mkdir -p /tmp/site && tar -xJf .ray/ray-pack.tar.xz -C /tmp/site || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16 YOLO_FASTDETECT_CACHE=/tmp/yfd_cache
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=false ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS=1 YOLO_VERBOSE=false
export YOLO_CONFIG_DIR=/tmp/yolo_config
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m yolo_fastdetect build 2>&1 | tail -5 || exit 1
python3 -m yolo_fastdetect info
eval timeout ${PYTEST_TIMEOUT:-600} python3 -m pytest -q ${PYTEST_ARGS:-tests} -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -40
IFS=';' read -ra benches <<< "$*"
for bench in "${benches[@]}"; do
  name=$(echo $bench | awk '{print $1}')
  [ -n "$name" ] && timeout ${BENCH_TIMEOUT:-300} python3 -m yolo_fastdetect bench $bench 2>&1 | tee "$OUT/bench_$name.md"
done
