#!/usr/bin/env bash
# One GPU run for the kernels the families share outside their own layers: the rotary tables of
# every Llama-form rotary module (tilegym.transformers.rope_tables), Qwen3.5/Qwen3-Next's sigmoid
# gates and the post-norm add (OLMo 2/3): their GPU tests, the patched rotary modules against
# upstream's on the GPU, inventory parity of the Solutions that name them, and the patched
# models' GPU equality tests.
#
# Usage (repo root, on a GPU host with the cuTile toolchain):
#   bash benchmarks/ops/gpu_check_tables_gates.sh               (< 3 min with a warm cache)
# Env: TEST_TIMEOUT (240 s per test process).
# Outputs in $OUT (default ./gpu_check_out): tables_gates_env.txt, tables_gates_summary.txt,
# tables_gates_tests_*.txt (one per pytest shard).
FAMILY=tables_gates
TT="${TEST_TIMEOUT:-240}"
WARM=0
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"

shard tables tests/ops/test_rotary_tables.py tests/transformers/test_rope_tables.py
shard gates tests/ops/test_sigmoid_gate.py
shard norm_add tests/ops/test_norm_unit_offset.py
# the patched models in two processes: on a cold compile cache the 18 tests took over 270 s in one
shard models_own tests/transformers/test_patch_models.py -k "own_kernels and (qwen3 or gpt_oss or olmo or gemma3)"
shard models_all tests/transformers/test_patch_models.py -k "all_flags and (qwen3 or gpt_oss or olmo or gemma3)"
parity "$KS"/qwen3/kernel_solutions/qwen3_rope_tables.json \
    "$KS"/gpt_oss/kernel_solutions/gpt_oss_rope_tables.json \
    "$KS"/deepseek_v2/kernel_solutions/deepseek_v2_rotary_tables.json \
    "$KS"/qwen3_5/kernel_solutions/qwen3_5_attn_output_gate.json \
    "$KS"/olmo3/kernel_solutions/olmo3_post_norm_add.json
finish_step1
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/${FAMILY}_summary.txt"
exit $status
