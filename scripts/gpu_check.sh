#!/usr/bin/env bash
# The checks that need a CUDA GPU, for a machine that has one (CI has none). Run from the repository root:
#   bash scripts/gpu_check.sh [OUTDIR]
# 1. tests/test_cuda.py: every fxforge feature on a model already on the GPU (docs/gpu.md's table);
# 2. one command-line pipeline run on NCCL with the stage on the GPU;
# 3. the rest of the suite on that machine's own torch (often older than the pinned one), as evidence for the
#    torch range pyproject.toml accepts. Browser and notebook tests are left out (they need Chromium/Jupyter).
# Uses the python3 that holds torch there (PYTHON=... to choose another); installs fxforge itself without
# dependencies, so it needs no network.
set -u
out=${1:-${OUT:-/tmp/fxforge-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
{
  nvidia-smi -L
  $py -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/machine.txt"
$py -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$out/install.log" 2>&1 || export PYTHONPATH=$PWD/src

$py -m pytest -q -p no:cacheprovider -rs ${CUDA_TESTS:-tests/test_cuda.py} 2>&1 | tee "$out/cuda.log" | tail -n 30

[ -n "${SKIP_PIPELINE:-}" ] || {
work=$(mktemp -d)
$py -m fxforge split torchvision:resnet18 -i 4x3x64x64 --stages 1 -o "$work/split" > "$out/pipeline.log" 2>&1 &&
  $py -m fxforge run-pipeline "$work/split" -i 8x3x64x64 --device cuda --microbatches 2 \
    >> "$out/pipeline.log" 2>&1
echo "run-pipeline on nccl: exit $?" | tee -a "$out/pipeline.log"
tail -n 25 "$out/pipeline.log"
}

# -v names each failure as it happens, so a run stopped by the timeout still says which; the failures found are
# then run again one by one for their tracebacks
timeout "${SUITE_SECONDS:-330}" $py -m pytest -v --tb=no -p no:cacheprovider -n "${WORKERS:-14}" ${SUITE_MARK:+-m "$SUITE_MARK"} \
  --ignore=tests/visual --ignore=tests/test_cuda.py ${SUITE_PATHS:-tests} > "$out/suite.log" 2>&1
grep -oE " (PASSED|FAILED|ERROR|SKIPPED) tests/" "$out/suite.log" | sort | uniq -c
failed=$(grep -oE "(FAILED|ERROR) tests/[^ ]+" "$out/suite.log" | awk '{print $2}' | sort -u)
echo "$failed" | tee "$out/failed.txt"
[ -n "$failed" ] && timeout "${RERUN_SECONDS:-90}" $py -m pytest -q --tb=short -p no:cacheprovider $failed \
  > "$out/failed.log" 2>&1
[ -f "$out/failed.log" ] && grep -E "^E |^(FAILED|ERROR)" "$out/failed.log" | head -n 80
