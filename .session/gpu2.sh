export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u
timeout 200 python3 benchmarks/kla_lm_tuning.py --shape 2x8192 --out $OUT/kla-lm-unroll-2x8192.json --variants '[{"tangent.unroll":8}, {}, {"tangent.unroll":16}, {"tangent.unroll":8,"maps.unroll":16}]' 2>&1 | grep -v -i warn
date -u
timeout 200 python3 benchmarks/kla_lm_tuning.py --shape 1x32768 --out $OUT/kla-lm-unroll-1x32768.json --variants '[{"tangent.unroll":8}, {"tangent.unroll":8,"CHUNKS":64}, {"tangent.unroll":16,"CHUNKS":64}, {"tangent.unroll":8,"maps.unroll":16,"CHUNKS":64}, {}]' 2>&1 | grep -v -i warn
date -u
timeout 150 python3 benchmarks/kla_lm_tuning.py --shape 1x131072 --out $OUT/kla-lm-unroll-1x131072.json --variants '[{"tangent.unroll":8}, {"tangent.unroll":8,"CHUNKS":64}, {}]' 2>&1 | grep -v -i warn
date -u
