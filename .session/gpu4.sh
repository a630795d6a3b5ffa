export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u
V='[{}, {"tangent.slots":2}, {"maps.slots":4}, {"fwd_slots":2}, {"ck":4,"bwd_rerun":false}]'
timeout 230 python3 benchmarks/kla_lm_tuning.py --shape 2x8192 --out $OUT/kla-lm-slots-2x8192.json --variants "$V" 2>&1 | grep -v -i warn
date -u
timeout 150 python3 benchmarks/kla_lm_tuning.py --shape 1x32768 --out $OUT/kla-lm-slots-1x32768.json --variants "$V" 2>&1 | grep -v -i warn
date -u
