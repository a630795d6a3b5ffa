#!/usr/bin/env bash
# Every GPU figure of the docs, on a CUDA machine, from the repository root:
#
#   bash benchmarks/gpu_suite.sh [PART...] [--out DIR]
#
# PART: tests-xdist (every CUDA test, the tuning sweep included, in one pytest run over the
# machine's cores with pytest-xdist: about 6 minutes on the H200's 16 cores, where compiling the
# kernel variants is most of the time; needs the pytest-xdist and execnet wheels, which are pure
# Python and can be carried to a machine without network), tests (the CUDA tests at GPU sizes
# but the KLA tuning sweep, in three parts that each
# fit a 10-minute job: tests-filter, the filter and dense lean-loop tests; tests-kla-a, the KLA
# float64 shapes and tile loads; tests-kla-b, the other KLA tests), tuning (that sweep at
# L = 5: about 45 KLA tuning variants compiled and checked in float64, ~8 min),
# tuning2 (the same at L = 1003, from triton's cache of the compiled variants), kernels
# (benchmarks/gpu.py: the four
# shapes of the kernel issue, tuning variants, torch peer, then benchmarks/kla_kernel_time.py,
# ~5 min), reliability (benchmarks/reliability_gpu.py, ~2 min), dense (benchmarks/dense_gpu.py
# with an 8-minute budget; its first section times the fused Triton dense filter against the JAX
# associative scan), public (benchmarks/gpu.py --only public,fit: ks.filter, ks.smooth,
# ks.loglik and its gradient, fit_ou, ~2 min), lm (benchmarks/lm_step.py, the KLA LM's training
# step against attention, then benchmarks/kla_chunked.py, the op in time chunks, ~2.5 min),
# conv (the KLA glue tests with both conv backwards, then benchmarks/kla_conv_bwd.py --walk: the
# one-pass conv backward against the two passes; ~1 min), suite-a / suite-b (the whole default
# test suite in two halves, tests/test_[b-k]*.py and tests/test_[l-z]*.py, over the machine's
# cores; each writes every test's outcome as it finishes to gpu-suite-a.txt / gpu-suite-b.txt
# through benchmarks/pytest_progress.py, so that a run cut by a job limit still names its
# failures and unfinished tests: `python benchmarks/pytest_progress.py F`; on the H200 the
# first half takes 5.7 minutes and the second 3, with --dist worksteal spreading the slowest
# tests over the workers), or all (default). Each part writes its log and results under DIR
# (default benchmarks/results) by the stable names that benchmarks/results/README.md indexes
# (h200.json, kla-kernel-time.json, reliability-h200.json, dense-gpu.json, gpu-tests.log, ...),
# replacing the previous result: git keeps history. Parts are separate commands so that each fits
# a 10-minute job limit.
set -u -o pipefail
out=benchmarks/results
parts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    tests) parts+=(tests-filter tests-kla-a tests-kla-b); shift ;;
    tests-xdist|tests-filter|tests-kla-a|tests-kla-b|tuning|tuning2|kernels|reliability|dense|public|lm|conv|suite-a|suite-b|all) parts+=("$1"); shift ;;
    *) echo "gpu_suite.sh: unknown argument '$1' (expected tests-xdist, tests, tests-filter, tests-kla-a, tests-kla-b, tuning, tuning2, kernels, reliability, dense, public, lm, conv, suite-a, suite-b, all or --out DIR)" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -eq 0 ] && parts=(all)
[ "${parts[*]}" = all ] && parts=(tests-filter tests-kla-a tests-kla-b tuning tuning2 kernels public lm conv reliability dense)
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# KLA tuning variants timed by kernel time (each checked against the default configuration first)
KLA_VARIANTS='[{"NS": 4}, {"bwd_NS": 2}, {"bwd_l2_ahead": 0}, {"bwd_l2_ahead": 32}, {"ck": 8},
 {"ck": 4}, {"bwd_slots": 2, "bwd_NS": 3}, {"bwd_slots": 4}, {"fwd_slots": 8}]'
status=0
for part in "${parts[@]}"; do
  case "$part" in
    tests-xdist) log="$out/gpu-tests.log" ;;
    kernels) log="$out/h200.log" ;;
    reliability) log="$out/reliability-h200.log" ;;
    dense) log="$out/dense-gpu.log" ;;
    public) log="$out/h200-public.log" ;;
    lm) log="$out/lm-step-h200.log" ;;
    conv) log="$out/kla-conv-walk-h200.log" ;;
    *) log="$out/gpu-$part.log" ;;
  esac
  case "$part" in
    tests-xdist) python3 -c "import xdist" 2>/dev/null || {
               echo "gpu_suite.sh tests-xdist: needs pytest-xdist (pip install pytest-xdist)"; false; } &&
             python3 -m pytest -q -m "" -p no:cacheprovider -n "$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))" \
               tests/test_cuda_kla.py tests/test_cuda_filter.py tests/test_cuda_resources.py \
               tests/test_dense_lean_loop.py tests/test_host_helpers.py tests/test_kla_op.py \
               tests/test_kla_layer.py tests/test_kla_inspect.py tests/test_kla_glue.py \
               tests/test_cuda_kla_chunked.py tests/test_cuda_dense.py --durations=15 -rfEs ;;
    tests-filter) python3 -m pytest -q -m "" -p no:cacheprovider tests/test_cuda_filter.py \
             tests/test_dense_lean_loop.py tests/test_cuda_dense.py ;;
    tests-kla-a) python3 -m pytest -q -m "" -p no:cacheprovider tests/test_cuda_kla.py \
             -k "float64" ;;
    tests-kla-b) python3 -m pytest -q -m "" -p no:cacheprovider tests/test_cuda_kla.py \
             -k "not every_tuning and not float64" ;;
    tuning) python3 -m pytest -q -m "" -p no:cacheprovider tests/test_cuda_kla.py -k "every_tuning and not 1003" ;;
    tuning2) python3 -m pytest -q -m "" -p no:cacheprovider tests/test_cuda_kla.py -k "every_tuning and 1003" ;;
    kernels) python3 benchmarks/gpu.py --out "$out/h200.json" &&
             python3 benchmarks/kla_kernel_time.py --json "$out/kla-kernel-time.json" \
               --variants "$KLA_VARIANTS" ;;
    reliability) python3 benchmarks/reliability_gpu.py --out "$out/reliability-h200.json" ;;
    dense) python3 benchmarks/dense_gpu.py --json "$out/dense-gpu.json" --budget-s 480 ;;
    public) python3 benchmarks/gpu.py --only public,fit --out "$out/h200-public.json" ;;
    lm) python3 benchmarks/lm_step.py --out "$out/lm-step-h200.json" &&
        python3 benchmarks/kla_chunked.py --shapes 8x2048,2x8192,1x32768,1x131072 \
          --out "$out/kla-chunked-h200.json" ;;
    suite-a|suite-b)
          if [ "$part" = suite-a ]; then files=(tests/test_[b-k]*.py); else files=(tests/test_[l-z]*.py); fi
          rm -f "$out/gpu-$part.txt"
          # one CPU thread a worker: 15 workers on 16 cores would each run torch's 16 threads
          KALMANSCAN_TEST_LOG="$out/gpu-$part.txt" OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider \
            -p benchmarks.pytest_progress -n "$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))" --dist worksteal -rfE \
            "${files[@]}"; rc=$?
          python3 benchmarks/pytest_progress.py "$out/gpu-$part.txt" | head -40; (exit $rc) ;;
    conv) python3 -m pytest -q -m "" -p no:cacheprovider tests/test_kla_glue.py &&
          python3 benchmarks/kla_conv_bwd.py --walk --out "$out/kla-conv-walk-h200.json" ;;
  esac 2>&1 | tee "$log" || status=1
done
exit $status
