export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 110 python3 benchmarks/lm_step.py --out $OUT/lm-step-carry-h200.json --models kla,attention --shapes 2x8192,1x32768 2>&1 | grep -v -i warn | tail -4
