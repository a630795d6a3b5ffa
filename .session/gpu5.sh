export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u
timeout 330 python3 benchmarks/lm_step.py --out $OUT/lm-step-h200.json --models kla,attention --shapes 8x2048,2x8192,1x32768,1x131072 2>&1 | grep -v -i warn | tail -40
date -u
timeout 200 python3 -m pytest -q -m "slow or not slow" -p no:cacheprovider -n 15 tests/test_cuda_kla_chunked.py tests/test_cuda_resources.py tests/test_kla_lm_tuning.py -rf 2>&1 | tail -8 | tee $OUT/gpu-tests-kla-chunked-h200.log
date -u
