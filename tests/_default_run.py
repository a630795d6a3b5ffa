"""Test cases that the default run (``pytest -q``) leaves to the slow step on a machine without
CUDA, where they repeat, more slowly, a path that another case of the same test checks in the
default run. CI's second step (``pytest -m slow``) runs every one of them; a CUDA machine runs
them in its default run (the compiled kernels take milliseconds where the Triton interpreter
takes seconds).

Each group names the case that stays in the default run. The node ids are checked against the
collected tests (``tests/test_default_run.py``), so a renamed case cannot drop out unseen.
"""

# The Triton interpreter walks every step in Python (about 0.1 s a step), so these are the
# default run's heaviest cases on a 2-core CPU: about 270 of its 1,400 worker-seconds.
REPEATS = {
    # the other flag bits in the chunks regime: z_inf (bit 2), overflow (1), decay_nan (4) stay,
    # and the other nine flags in the lanes regime (the flags are set by the same step code in
    # both)
    "tests/test_cuda_filter.py": [
        "test_flags[z_inf-2-lanes]",
        "test_flags[overflow-1-lanes]",
        "test_flags[decay_nan-4-lanes]",
        "test_flags[obs_var_zero-4-chunks]",
        "test_flags[loading_inf-4-chunks]",
        "test_flags[obs_var_nan-4-chunks]",
        "test_flags[prior_negative_v-4-chunks]",
        "test_flags[prior_info_without_precision-4-chunks]",
        "test_flags[process_var_negative-4-chunks]",
        "test_flags[prior_nan_e-4-chunks]",
        "test_flags[tiny_obs_var-4-chunks]",
        "test_flags[offset_nan-4-chunks]",
        # f64-33-5-chunks (a first, a middle and a last chunk), f32-21-3-lanes and both
        # one-step cases stay
        "test_filter_and_smoother_every_output[f32-63-5-chunks]",
        "test_filter_and_smoother_every_output[f64-63-5-chunks]",
        "test_filter_and_smoother_every_output[f32-33-5-chunks]",
        "test_filter_and_smoother_every_output[f64-21-3-lanes]",
        "test_filter_and_smoother_every_output[f64-30-2-chunks]",
        "test_filter_and_smoother_every_output[f32-30-2-chunks]",
        # f64-full-chunks, f32-full-lanes and f64-broadcast-lanes stay (each regime, each
        # layout, each dtype)
        "test_fused_loglik_adjoint[f32-broadcast-chunks]",
        "test_fused_loglik_adjoint[f32-full-chunks]",
        "test_fused_loglik_adjoint[f64-full-lanes]",
        "test_fused_loglik_adjoint[f64-broadcast-chunks]",
        "test_fused_loglik_adjoint[f32-broadcast-lanes]",
        # loglik-chunks and loglik+final-lanes stay
        "test_loglik_gradient_launched_by_the_forward[loglik+final-chunks]",
        # f64-chunks and f32-lanes stay
        "test_public_loglik_gradient[f32-chunks]",
        "test_public_loglik_gradient[f64-lanes]",
    ],
    # several series: filter-f64 and smooth-f32 stay; one series: filter-f64 and smooth-f32
    # stay (each op in each dtype between them; the smoother runs the filter's kernels first,
    # and test_trailing_gap[smooth] is a lost float64 series smoothed)
    "tests/test_cuda_dense_lost.py": [
        "test_lost_series_follows_the_cpu_rule[smooth-f64-several]",
        "test_lost_series_follows_the_cpu_rule[filter-f32-several]",
        "test_lost_series_follows_the_cpu_rule[filter-f32-one]",
        "test_lost_series_follows_the_cpu_rule[smooth-f64-one]",
    ],
    "tests/test_cuda_kla_chunked.py": [
        # B2-L24-M3-S4-C3 stays (3 chunks of 8), and B1-L27-M2-S5's 3 chunks of 9 in
        # test_map_kernel_launches_equal_reference[slots4-unroll8]
        "test_chunked_equals_reference_float64[B1-L27-M2-S5-C3-f64]",
        # p1e12-all and Lv1e10-one-channel-one-chunk stay (every lane, and one lane, walked:
        # the two of the four that fail where the walk misses a chunk's last step)
        "test_chunked_precise_observations[Lv1e10-all]",
        "test_chunked_precise_observations[Lv1e14-p50-all]",
        "test_chunked_precise_observations[Lv1e14-p50-one-channel-one-chunk]",
        "test_chunked_precise_observations[p1e12-one-channel-one-chunk]",
        # 4x1 stays (blocks in pairs and an odd last block), and the default 8x2 launch in
        # test_map_kernels_default_launch_walks_full_blocks
        "test_tangent_maps_double_buffered_equal_reference[4x2]",
        "test_tangent_maps_double_buffered_equal_reference[8x1]",
        # 1e-12 and 0 (forget) stay
        "test_chunked_small_decays[1e-06]",
        "test_chunked_small_decays[0.011]",
        # baseline, decay-0 and p-huge stay
        "test_chunked_op_regimes[kla-Lv-wide]",
        "test_chunked_op_regimes[kla-decay-1-p0]",
        "test_chunked_op_regimes[kla-decay-1-1e-6]",
    ],
    # one float32 and one float64 case of each diffuse-start test stay, between them a decay
    # whose square is 0 or subnormal (the kernels' one small-decay test, small_decay) and one
    # whose square is normal but its product over the gap underflows: f64-a1e-170 and
    # f32-a1e-12 (filter), f64-a1e-100 and f32-a1e-25 (smoother, gradient); every decay at T = 1
    "tests/test_chunked_diffuse.py": [
        "test_loglik_gradient_from_a_diffuse_start_matches_mpmath[f32-a1e-20-33]",
        "test_loglik_gradient_from_a_diffuse_start_matches_mpmath[f64-a1e-160-33]",
        "test_loglik_gradient_from_a_diffuse_start_matches_mpmath[f64-a1e-170-33]",
        "test_loglik_gradient_from_a_diffuse_start_matches_mpmath[f32-a1e-12-33]",
        "test_filter_from_a_diffuse_start_matches_mpmath[f64-a1e-100-33]",
        "test_filter_from_a_diffuse_start_matches_mpmath[f32-a1e-20-33]",
        "test_filter_from_a_diffuse_start_matches_mpmath[f64-a1e-160-33]",
        "test_filter_from_a_diffuse_start_matches_mpmath[f32-a1e-25-33]",
        "test_smoother_from_a_diffuse_start_matches_mpmath[f64-a1e-160-33]",
        "test_smoother_from_a_diffuse_start_matches_mpmath[f32-a1e-20-33]",
        "test_smoother_from_a_diffuse_start_matches_mpmath[f64-a1e-170-33]",
        "test_smoother_from_a_diffuse_start_matches_mpmath[f32-a1e-12-33]",
        # f64 stays: the carry's walk of a chunk holding the step (float32's walk, the same
        # kernel code, in test_smooth_extreme_decays.py::test_chunked_tiny_decay[f32-at30])
        "test_tiny_decay_meets_a_known_state_across_chunks[f32]",
    ],
    # the triton chunked smoother at 40 steps (3 chunks): a tiny decay in each chunk (at3 and
    # at20 in float64, at30 in float32) and one ratio past the range a dtype; every case on the
    # unchunked kernels and the other backends
    "tests/test_smooth_extreme_decays.py": [
        "test_chunked_tiny_decay[f64-at30]",
        "test_chunked_tiny_decay[f32-at3]",
        "test_chunked_tiny_decay[f32-at20]",
        "test_chunked_process_var_over_obs_var_past_the_range[f64-R1e-200-p1e+200]",
        "test_chunked_process_var_over_obs_var_past_the_range[f32-R1e-05-p1e+35]",
    ],
    # the torch scan at 5,000 steps takes the chunk levels of 1,000 (a level of chunks of 16,
    # their totals scanned in chunks again): T1000-N7 stays in each dtype and start, and the
    # smoother at 1,000 steps in each dtype
    "tests/test_core_filter.py": [
        "test_parallel_matches_sequential[diffuse-T5000-N1-f32]",
        "test_parallel_matches_sequential[prior-T5000-N1-f32]",
        "test_parallel_matches_sequential[diffuse-T5000-N1-f64]",
        "test_parallel_matches_sequential[prior-T5000-N1-f64]",
        "test_parallel_matches_sequential[diffuse-T1000-N1-f32]",
        "test_parallel_matches_sequential[prior-T1000-N1-f32]",
        "test_parallel_matches_sequential[diffuse-T1000-N1-f64]",
        "test_parallel_matches_sequential[prior-T1000-N1-f64]",
        "test_smoother_parallel_matches_sequential[5000-f32]",
        "test_smoother_parallel_matches_sequential[5000-f64]",
    ],
    # the sequential backend (a Python loop, 0.4-4 s a case here): torch and native run every
    # regime by default, sequential obs_var 1e-155 and the explosive gradient; its held states
    # (variances past 2**64) against mpmath in test_extreme_scalar_gradients.py
    "tests/test_regimes.py": [
        "test_scalar_regime[p=0 a=0.9577 c=0.4 T=1000-sequential]",
        "test_scalar_regime[OU theta=0.5 sigma2=0, 2000 steps-sequential]",
        "test_scalar_regime[process_var 1e155, a=0.9-sequential]",
        "test_scalar_regime[diffuse, first 50 missing, a=0.95 p=0-sequential]",
        "test_loglik_gradient[grad-p=0 a=0.9577 c=0.4 T=1000-sequential]",
        "test_loglik_gradient[grad-process_var 1e155, a=0.9-sequential]",
        "test_loglik_gradient[grad-obs_var 1e-155, a=0.9 p=1-sequential]",
    ],
    # the fused glue at 7 tokens in silu with the variance: silu with it at L1, and L7's masked
    # tail in every other L7 case; K = 4 over 19 tokens: K = 4 (the default) over several
    # programs in B2-L2BT (4 programs of 8), a masked tail over several programs at K1, K2, K5
    "tests/test_kla_glue.py": [
        "test_fused_glue_matches_eager[conv-one-pass-B2-L7-D16-S4-silu-var]",
        "test_fused_glue_matches_eager[conv-one-pass-B2-L19-K4]",
    ],
    "tests/test_cuda_dense.py": [
        # n2-d1-T7-f32, n3-d2-T7-f64 and the fullR cases stay (the larger interpreted cases
        # are marked slow in the file)
        "test_matches_sequential[n2-d1-T7-f64]",
        "test_matches_sequential[n3-d2-T7-f32]",
        # each model's other output (filter or smooth) stays, and exact-entry-pins-sum's both
        "test_auto_known_directions_take_the_rule[llt-slope-known-smooth]",
        "test_auto_known_directions_take_the_rule[llt-seasonal4-known-smooth]",
        "test_auto_known_directions_take_the_rule[rank1-noise-sum-known-filter]",
        "test_auto_known_directions_take_the_rule[ar1-padded-state-smooth]",
        # the row's first 5 steps stay (1e6-s3-T5, T5): the same regime at every step
        "test_near_noise_free_whole_state[1e6-s3]",
        "test_auto_near_noise_free_takes_triton[whole]",
    ],
    "tests/test_cuda_kla.py": [
        "test_channel_sums_atomic_or_deterministic[16]",  # [4] stays
        # several blocks, intervals and a tail by default: the many-lanes configuration (8-step
        # intervals rerun, 4 slots a thread; no L2 prefetch at M = 3 channels) at L = 13 in
        # test_rerun_backward_is_exact[B2-L13-M3-S4], and _many_lanes[B1-L9-M3-S16] stays
        "test_forward_backward_float64[B2-L63-M3-S4]",
        "test_forward_backward_float64_many_lanes[B2-L63-M3-S4]",
        "test_without_variance[S32-f32-G8]",  # S16-f32-G4 and S16-f64 stay
        "test_scatter_outputs_float32[2-16]",  # 4-8 and 4-16 stay
        "test_default_initial_state[many-lanes]",  # few-lanes stays
        # bfloat16 without the L2 prefetch and float16 with it stay: each half dtype, each
        # prefetch setting
        "test_half_inputs_compute_in_float32[l2-prefetch-torch.bfloat16]",
        "test_half_inputs_compute_in_float32[no-prefetch-torch.float16]",
    ],
    # the triton backend's adjoint over a diffuse gap: every decay over 3 steps (G3) stays, and
    # over one step float64's underflowing square (f64-a1e-300); every decay a regime and gap on
    # the other backends (the file's default decays)
    "tests/test_diffuse_gap_gradients.py": [
        "test_triton_loglik_gradient_over_a_diffuse_gap[f64-a1e-160-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f64-a1e-100-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f64-a1e-10-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f64-a0-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f32-a1e-40-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f32-a1e-22-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f32-a1e-12-G1]",
        "test_triton_loglik_gradient_over_a_diffuse_gap[f32-a0-G1]",
        # each decay with one prior (each prior twice) stays
        "test_loglik_gradient_with_a_proper_prior[triton-1e-170-P2]",
        "test_loglik_gradient_with_a_proper_prior[triton-1e-100-P1e100]",
        "test_loglik_gradient_with_a_proper_prior[triton-1e-10-P2]",
        "test_loglik_gradient_with_a_proper_prior[triton-0.0-P1e100]",
        # an underflowing square and 0 stay (triton's smoother gradient is the torch backend's)
        "test_smoother_gradient_over_a_diffuse_gap[triton-1e-160]",
        "test_smoother_gradient_over_a_diffuse_gap[triton-1e-100]",
        "test_smoother_gradient_over_a_diffuse_gap[triton-1e-10]",
        # float64 at both places and float32 "later" stay
        "test_tiny_decay_meets_a_known_state[triton-f64-a1e-160-prior]",
        "test_tiny_decay_meets_a_known_state[triton-f32-a1e-25-prior]",
    ],
    # the triton backend's rows that repeat a regime another of its rows checks (the comments
    # above each test in the file); every row on the other backends
    "tests/test_underflow_regimes.py": [
        "test_loglik_gradient_over_a_diffuse_gap_of_tiny_decays[1e-160-float64-triton]",
        "test_loglik_gradient_over_a_diffuse_gap_of_tiny_decays[1e-20-float32-triton]",
        "test_tiny_information_at_a_diffuse_lanes_first_observation_is_refused"
        "[1e-150-1e+20-float64-triton]",
        "test_tiny_information_at_a_diffuse_lanes_first_observation_is_refused"
        "[1e-20-1.0-float32-triton]",
        "test_tiny_loading_elsewhere_matches_mpmath[1e-20-1.0-1.0-where6-float32-triton]",
        "test_tiny_loading_elsewhere_matches_mpmath[1e-20-1e-30-1.0-where7-float32-triton]",
        "test_tiny_loading_loglik_gradient_matches_mpmath[1e-160-1e-300-1.0-triton]",
    ],
    # the triton backend on tiny arrays: per-step (three lanes of three scales, per-step and
    # per-lane arrays) and f32-1e-20 stay, 1e-200 as test_tiny_arrays_off_the_host_match_mpmath
    # [triton] (the same model against mpmath) and a tiny loading array and proper prior as
    # test_tiny_variances_and_a_tiny_loading[triton]; every model on the other backends
    "tests/test_tiny_variances_device_arrays.py": [
        "test_tiny_arrays_off_the_host_equal_the_host_path[1e-200-triton]",
        "test_tiny_arrays_off_the_host_equal_the_host_path[1e-150-triton]",
        "test_tiny_arrays_off_the_host_equal_the_host_path[loading-array-triton]",
        # the ordinary arrays on triton: f64 stays (and f32 on the other backends; triton's
        # float32 kernels flagged and run in units: [f32-1e-20-triton] above)
        "test_ordinary_arrays_are_not_flagged[f32-triton]",
    ],
    "tests/test_lost_loglik.py": ["test_lost_lane_chunked_triton[f32]"],  # f64 stays
    # the triton backend on every variance tiny: the API carries each scale's lane in its unit
    # (filter._run, _in_units) before any backend runs, so the kernels see inputs of order 1 at
    # every scale (|z| 5-10, obs_var 0.5-1.9); diffuse-1e-80 and proper-1e-150 stay, and every
    # scale and prior on the other backends (the units' mapping is the same code for all)
    "tests/test_tiny_variances.py": [
        "test_every_variance_tiny_matches_mpmath[diffuse-1e-100-triton]",
        "test_every_variance_tiny_matches_mpmath[diffuse-1e-150-triton]",
        "test_every_variance_tiny_matches_mpmath[proper-1e-80-triton]",
        "test_every_variance_tiny_matches_mpmath[proper-1e-100-triton]",
    ],
    # CPU paths repeated at larger sizes: T1000-N7 (sequential) and T3000-N64 (torch) stay
    "tests/test_memory.py": [
        "test_repeated_runs_are_bitwise_identical[T3000-N64-f64-sequential]",
        "test_peak_memory_is_linear_in_the_data[filter-one-lane-f64]",  # one-lane-f32 stays
    ],
    # random extreme lanes against mpmath: the first draw stays (the same in
    # test_extreme_scalar_gradients.py, below)
    "tests/test_native_extreme_variances.py": [
        "test_random_extreme_lanes_match_mpmath[2]",
        "test_random_extreme_lanes_match_mpmath[3]",
    ],
    # the sequential backend (a Python loop over the steps, the reference of most tests) on
    # extreme lanes whose native and torch cases stay
    "tests/test_smooth_forget_extreme_grad.py": [
        "test_smoothed_variance_gradient_before_a_forget[P1e300-forget40-T70-f64-sequential]",
    ],
    "tests/test_extreme_scalar_gradients.py": [
        "test_random_extreme_lanes_match_mpmath[2]",
        "test_random_extreme_lanes_match_mpmath[3]",
        "test_smoothed_mean_gradient_matches_mpmath[decay-growth-gap-f64-sequential]",
        "test_loglik_gradient_matches_mpmath[decay-growth-gap-f64-sequential]",
    ],
    # subprocess runs of the command line: version and help stay, and the open pipe
    "tests/test_small_fixes_cli_pipe.py": ["test_closed_pipe_exits_quietly[filter-nile-fit]"],
    # a pytest run in a subprocess: the run on one process ([0]) stays
    "tests/test_pytest_progress.py": [
        "test_a_run_writes_every_outcome_and_the_summary_names_them[2]",
    ],
}

NODE_IDS = frozenset(f"{path}::{case}" for path, cases in REPEATS.items() for case in cases)
