export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv
date -u
timeout 330 python3 benchmarks/kla_lm_tuning.py --shape 2x8192 --out $OUT/kla-lm-maps-2x8192.json --variants '[{}, {"maps.NS":2,"tangent.NS":2}, {"maps.NS":3,"tangent.NS":3}, {"tangent.unroll":8}, {"tangent.unroll":8,"tangent.NS":2}, {"maps.unroll":4,"maps.NS":2}]' 2>&1 | grep -v Warning
date -u
timeout 200 python3 benchmarks/kla_lm_tuning.py --shape 1x32768 --out $OUT/kla-lm-maps-1x32768.json --variants '[{}, {"CHUNKS":64}, {"maps.NS":2,"tangent.NS":2}]' 2>&1 | grep -v Warning
date -u
