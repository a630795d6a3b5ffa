export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u
timeout 120 python3 benchmarks/lm_step.py --out $OUT/lm-step-carry-h200.json --models kla,attention --shapes 2x8192,1x32768 2>&1 | grep -v -i warn | tail -6
date -u
timeout 130 python3 -m pytest -q -m "slow or not slow" -p no:cacheprovider -n 15 tests/test_cuda_kla_chunked.py -rf 2>&1 | tail -4 | tee $OUT/gpu-tests-kla-chunked-carry-h200.log
date -u
