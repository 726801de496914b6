"""KV sizing and the P:D ratio against the 002 text's sections 3 and 4."""

import math

import pytest

from traffic import kvcache
from traffic.kvcache import GLM_5_1, ModelConfig, SizingError


def digits(text_value):
    """Decimals the text prints a value with (2.94 -> 2, 11.5 -> 1)."""
    text = repr(text_value)
    return len(text.split(".")[1]) if "." in text else 0


# ---------------------------------------------------------------- per token
def test_glm_5_1_per_token_is_the_texts_product():
    assert GLM_5_1.kv_bytes_per_token() == 78 * (512 + 64) * 2 == 89_856
    assert GLM_5_1.formula == "78 x (512 + 64) x 2"


def test_fp8_kv_halves_it():
    assert kvcache.model("glm-5.1-fp8").kv_bytes_per_token() == 89_856 // 2


@pytest.mark.parametrize("name, expected", [
    ("llama-3-70b", 80 * 2 * 8 * 128 * 2),      # 320 KiB per token
    ("qwen2.5-14b", 48 * 2 * 8 * 128 * 2),
])
def test_gqa_models_store_k_and_v(name, expected):
    assert kvcache.model(name).kv_bytes_per_token() == expected


@pytest.mark.parametrize("kwargs", [
    {},                                                          # neither layout
    {"kv_lora_rank": 512, "kv_heads": 8, "head_dim": 128},       # both
    {"kv_heads": 8},                                             # half a GQA layout
])
def test_a_config_has_exactly_one_kv_layout(kwargs):
    with pytest.raises(SizingError, match="model m"):
        ModelConfig("m", layers=4, **kwargs)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(SizingError, match="glm-5.1"):
        kvcache.model("gpt-9")


# ---------------------------------------------------------------- per request
@pytest.mark.parametrize("row", kvcache.TEXT_KV_TABLE, ids=lambda r: r.label)
def test_kv_table_rows_within_the_texts_rounding(row):
    request_gb = kvcache.kv_bytes_per_request(GLM_5_1, row.tokens) / 1e9
    card_gb = kvcache.kv_bytes_per_card(GLM_5_1, row.tokens, tp=8) / 1e9
    assert round(request_gb, digits(row.text_request_gb)) == row.text_request_gb
    if row.text_card_gb < 1:        # "~370 MB": two significant figures
        assert round(card_gb * 1000, -1) == round(row.text_card_gb * 1000)
    else:
        assert round(card_gb, digits(row.text_card_gb)) == row.text_card_gb
    assert card_gb == pytest.approx(request_gb / 8)


@pytest.mark.parametrize("tokens, text_gb", [(32_000, 2.94), (131_072, 11.5), (200_000, 18.2)])
def test_the_other_reading_of_k_misses_the_text(tokens, text_gb):
    """Why TEXT_KV_TABLE uses 32,768, 128,000 and 202,752 tokens."""
    gb = kvcache.kv_bytes_per_request(GLM_5_1, tokens) / 1e9
    assert round(gb, digits(text_gb)) != text_gb
    assert gb == pytest.approx(text_gb, rel=0.025)


def test_per_card_is_one_tp_share():
    assert kvcache.kv_bytes_per_card(GLM_5_1, 1000, tp=4) == 89_856 * 1000 / 4
    with pytest.raises(SizingError, match="tp"):
        kvcache.kv_bytes_per_card(GLM_5_1, 1000, tp=0)


# ---------------------------------------------------------------- P:D ratio
@pytest.mark.parametrize("item", kvcache.TEXT_PROFILES, ids=lambda p: p.name)
def test_profiles_reproduce_the_table_at_no_headroom(item):
    assert round(item.ratio(), 2) == item.text_ratio
    assert item.ratio() == pytest.approx(item.text_ratio, abs=0.005)


def test_effective_input_of_the_cached_profile_is_21_6k():
    assert kvcache.effective_input_tokens(32, 0.4) == pytest.approx(21.6, abs=0.05)
    assert kvcache.CACHED_INPUT_PRICE_RATIO == pytest.approx(0.1857, abs=1e-4)


def test_headroom_scales_the_ratio():
    base = kvcache.pd_ratio(24, 6)
    for h in kvcache.ZCUBE_HEADROOM:
        assert kvcache.pd_ratio(24, 6, headroom=h) == pytest.approx(base * h)


def test_the_texts_rounded_price_ratio_matters_for_the_last_row():
    exact = kvcache.pd_ratio(32, 6, 0.4, price_ratio=4.4 / 1.4)
    assert round(exact, 2) == 1.14 and round(kvcache.pd_ratio(32, 6, 0.4), 2) == 1.15


def test_full_cache_hits_cost_the_cached_price():
    assert kvcache.effective_input_tokens(1000, 1.0) == pytest.approx(1000 * 0.26 / 1.4)


@pytest.mark.parametrize("call, match", [
    (lambda: kvcache.pd_ratio(10, 0), "output_tokens"),
    (lambda: kvcache.pd_ratio(10, 5, hit_ratio=1.5), "hit_ratio"),
    (lambda: kvcache.pd_ratio(10, 5, headroom=0), "headroom"),
    (lambda: kvcache.profile("nope"), "deep-thinking"),
])
def test_bad_ratio_inputs_are_named(call, match):
    with pytest.raises(SizingError, match=match):
        call()


# ---------------------------------------------------------------- D pool
def test_d_pool_terms_follow_their_formulas():
    pool = kvcache.d_pool(GLM_5_1, request_rate=10, input_tokens=20_000, output_tokens=5_000,
                          hit_ratio=0.5, decode_tokens_per_s=2_000, stream_tokens_per_s=50,
                          keepalive_s=60, kv_memory_gb=100, ingress_gbps=400,
                          ingress_utilization=0.5)
    per_token = 89_856
    assert pool.n_d_compute == math.ceil(10 * 5_000 / 2_000)                    # 25
    resident = per_token * (10 * 5_000 / 50 * (20_000 + 2_500) + 10 * 60 * 25_000)
    assert pool.resident_kv_bytes == pytest.approx(resident)
    assert pool.n_d_kv_memory == math.ceil(resident / 100e9)
    ingress_bps = 10 * 20_000 * 0.5 * per_token * 8
    assert pool.ingress_gbps == pytest.approx(ingress_bps / 1e9)
    assert pool.n_d_kv_ingress == math.ceil(ingress_bps / (400e9 * 0.5))
    assert pool.n_d == max(pool.terms.values())
    assert pool.binding == "kv_memory"


@pytest.mark.parametrize("overrides, binding", [
    ({}, "compute"),
    ({"kv_memory_gb": 20.0}, "kv_memory"),
    ({"ingress_gbps": 10.0}, "kv_ingress"),
])
def test_the_binding_term_moves_with_its_input(overrides, binding):
    args = dict(request_rate=20, input_tokens=24_576, output_tokens=6_144)
    assert kvcache.d_pool(GLM_5_1, **args, **overrides).binding == binding


def test_n_p_over_n_d_compute_is_the_pd_ratio_under_the_price_proxy():
    pool = kvcache.d_pool(GLM_5_1, request_rate=100, input_tokens=24_576, output_tokens=6_144,
                          headroom=1.15, decode_tokens_per_s=1_000)
    assert pool.n_p / pool.n_d_compute == pytest.approx(
        kvcache.pd_ratio(24_576, 6_144, headroom=1.15), rel=0.01)


def test_whole_instances_ignore_float_noise():
    pool = kvcache.d_pool(GLM_5_1, request_rate=0.3, input_tokens=1, output_tokens=10,
                          decode_tokens_per_s=1)
    assert pool.n_d_compute == 3        # 0.3 x 10 / 1 = 3.0000000000000004


def test_d_pool_rejects_bad_inputs():
    with pytest.raises(SizingError, match="request_rate"):
        kvcache.d_pool(GLM_5_1, 0, 100, 100)
    with pytest.raises(SizingError, match="ingress_utilization"):
        kvcache.d_pool(GLM_5_1, 1, 100, 100, ingress_utilization=0)
