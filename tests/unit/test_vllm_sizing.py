"""vLLM sized from the run (`pipeline.engines.vllm.sizing`): max_model_len from the longest sequence, the CPU KV space
from a batch of them within the machine's memory, options taken as given, and a one-line error naming the options."""
from __future__ import annotations

import pytest

from pipeline.engines.vllm.options import VLLMOptions
from pipeline.engines.vllm.sizing import GIB, KVCacheTooLarge, kv_bytes_per_token, size

# The text config of the tiny Kimi-K2.5 (tiny-k25-bf16): 61 MLA layers, Kimi-K2.5's context.
K25 = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 4,
       "hidden_size": 256, "max_position_embeddings": 262144, "dtype": "bfloat16"}
LLAMA = {"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "hidden_size": 256, "max_position_embeddings": 4096, "dtype": "bfloat16"}
PLENTY = 64 * GIB


def sized(checkpoint=K25, **kw):
    args = dict(dtype="float32", tp_size=1, batch_size=8, longest=None, max_model_len=None, kv_cache_space_gib=None,
                on_cpu=True, available_bytes=PLENTY)
    return size(checkpoint, **{**args, **kw})


def test_kv_bytes_match_what_vllm_reported_for_the_recipe():
    # vLLM: "max seq len (8192), 1.07 GiB KV cache is needed" for the tiny K2.5 in float32
    assert round(8192 * kv_bytes_per_token(K25, "float32") / GIB, 2) == 1.07
    assert kv_bytes_per_token(K25, "bfloat16") == 61 * 576 * 2
    assert kv_bytes_per_token(LLAMA, "auto") == 6 * 2 * 2 * 64 * 2  # auto: the checkpoint's dtype
    assert kv_bytes_per_token(LLAMA, "float32", tp_size=2) == 6 * 2 * 1 * 64 * 4  # KV heads split across ranks


def test_the_longest_sequence_sets_max_model_len_and_a_batch_of_them_the_kv_space():
    s = sized(longest=512)
    assert (s.max_model_len, s.kv_cache_space_gib) == (513, 1)  # 8 x 768 tokens x 140,544 B = 0.80 GiB
    s = sized(longest=8192)
    assert (s.max_model_len, s.kv_cache_space_gib) == (8193, 9)  # 8 x 8448 tokens x 140,544 B = 8.85 GiB
    assert s.max_model_len_by.startswith("the run's longest")


def test_without_the_run_the_checkpoint_context_capped_at_8192():
    assert sized().max_model_len == 8192 and sized().max_model_len_by == "the checkpoint"
    assert sized(LLAMA).max_model_len == 4096


def test_the_memory_bounds_the_batch_but_never_below_one_sequence():
    s = sized(longest=8192, available_bytes=6 * GIB)  # half of it: 3 GiB, room for a few sequences
    assert s.kv_cache_space_gib == 3
    s = sized(longest=8192, available_bytes=int(2.5 * GIB))  # 1.25 GiB: one sequence (1.11 GiB) fits, in 2 GiB
    assert s.kv_cache_space_gib == 2


def test_one_sequence_that_cannot_fit_names_the_options():
    with pytest.raises(KVCacheTooLarge) as e:
        sized(longest=8192, available_bytes=2 * GIB)
    message = str(e.value)
    assert "\n" not in message and "max_model_len=8193" in message and "1.11 GiB" in message
    assert "options.max_model_len" in message and "options.kv_cache_space_gib" in message


def test_options_that_are_set_are_taken_as_given():
    s = sized(longest=512, max_model_len=8192, kv_cache_space_gib=1, available_bytes=1)
    assert (s.max_model_len, s.kv_cache_space_gib) == (8192, 1)  # vLLM itself then says it does not fit
    assert (s.max_model_len_by, s.kv_cache_space_by) == ("engine.options.max_model_len",
                                                         "engine.options.kv_cache_space_gib")


def test_off_cpu_no_kv_space_is_set():
    s = sized(longest=512, on_cpu=False)
    assert (s.max_model_len, s.kv_cache_space_gib) == (513, None)


def test_the_option_defaults_leave_both_to_the_run():
    opts = VLLMOptions.parse({})
    assert (opts.max_model_len, opts.kv_cache_space_gib) == (None, None)
