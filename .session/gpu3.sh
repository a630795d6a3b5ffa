export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u
timeout 150 python3 benchmarks/kla_lm_tuning.py --shape 1x8192 --out $OUT/kla-lm-chunks-1x8192.json --variants '[{}, {"CHUNKS":32}, {"CHUNKS":8}]' 2>&1 | grep -v -i warn
date -u
timeout 200 python3 benchmarks/kla_lm_tuning.py --shape 1x32768 --out $OUT/kla-lm-bwd-1x32768.json --variants '[{}, {"bwd_NS":2}, {"bwd_NS":4}, {"bwd_l2_ahead":32}, {"NS":4}, {"NS":6}, {"bwd_slots":2}]' 2>&1 | grep -v -i warn
date -u
timeout 200 python3 benchmarks/kla_lm_tuning.py --shape 2x8192 --out $OUT/kla-lm-bwd-2x8192.json --variants '[{}, {"bwd_NS":2}, {"bwd_NS":4}, {"bwd_l2_ahead":32}, {"NS":4}, {"NS":6}]' 2>&1 | grep -v -i warn
date -u
