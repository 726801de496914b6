"""KV-cache sizing and the P:D ratio of prefill/decode-disaggregated inference.

Everything here is arithmetic from the 002 text (ZCube / P-D inference):

* **KV bytes per token** (section 3, "KV Cache Per-Token Estimation"): an
  MLA model stores one latent per layer, ``layers x (kv_lora_rank +
  qk_rope_head_dim) x dtype_bytes``; GLM-5.1 in BF16 gives
  78 x (512 + 64) x 2 = 89,856 B.  A GQA/MHA model stores K and V:
  ``layers x 2 x kv_heads x head_dim x dtype_bytes``.
* **KV per request and per card** (section 3's table): 32K -> ~2.94 GB,
  128K -> ~11.5 GB, 200K -> ~18.2 GB; one eighth per card at TP=8.  The
  text's three rows use three different readings of "K" (see `TEXT_KV_TABLE`):
  32K is 32,768 tokens, 128K is 128,000 tokens and 200K is 202,752 tokens
  (198 x 1024, the ``max_position_embeddings`` of GLM's published config);
  GB is 10^9 bytes.
* **P:D ratio** (section 4)::

      P/D ~ I_eff / (3.14 x O) x h,    I_eff = I x ((1 - H) + H x 0.26 / 1.4)

  3.14 is the output/input price ratio (4.4 / 1.4 rounded as in the text),
  0.26 / 1.4 the cached-input/input price ratio, H the cache-hit ratio and h
  the TTFT/SLO headroom.  The text's table (`TEXT_PROFILES`: 0.64, 1.27,
  2.55, 1.15) is the formula with **h = 1**: no headroom.  The recommended
  h under ZCube is 1.1-1.2, and the table's "recommended starting config"
  column (1:1, 3:2, 2:1-5:2, 4:3-3:2) is where that headroom and rounding to
  whole tiles go.  With the unrounded 4.4 / 1.4 = 3.1429 the last row would
  round to 1.14, so the text's 3.14 is kept.
* **D pool size** (section 4, "The D Pool Isn't Just About Compute")::

      N_D = max(N_D_compute, N_D_KV_memory, N_D_KV_ingress)

  with the three terms of `d_pool` (formulas in its docstring).  The text
  gives the structure, not the inputs: request rate, decode speed, KV
  memory and ingress bandwidth per D instance are parameters here.

A "node" or "instance" is one TP group (8 GPUs at TP=8, the text's minimal
inference unit); P and D counts are in instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

#: Output/input price ratio of GLM-5.1 (4.4 / 1.4 $/MTok), as the text rounds it.
OUTPUT_INPUT_PRICE_RATIO = 3.14
#: Cached-input/input price ratio (0.26 / 1.4 $/MTok).
CACHED_INPUT_PRICE_RATIO = 0.26 / 1.4
#: Headroom the text recommends under ZCube (higher under ROFT).
ZCUBE_HEADROOM = (1.1, 1.2)
#: Large KV streams a D accepts at once (section 7, "KV Transfer Credit").
D_INGRESS_STREAMS = (2, 4)

GB = 1e9
MB = 1e6


class SizingError(ValueError):
    """A sizing input is out of range; the message names it."""


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise SizingError(f"{name} must be > 0, got {value}")


def _fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise SizingError(f"{name} must be within [0, 1], got {value}")


def _ceil(value: float) -> int:
    """Whole instances: ceil, without counting float noise as one more."""
    return max(0, math.ceil(value - 1e-9))


# ------------------------------------------------------------------ models
@dataclass(frozen=True)
class ModelConfig:
    """The KV-relevant part of a model config.

    Either MLA (``kv_lora_rank`` and ``qk_rope_head_dim``: one latent per
    layer and token) or GQA/MHA (``kv_heads`` and ``head_dim``: K and V per
    layer and token), never both.
    """

    name: str
    layers: int
    dtype_bytes: float = 2.0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    kv_heads: int = 0
    head_dim: int = 0

    def __post_init__(self):
        if self.layers < 1:
            raise SizingError(f"model {self.name}: layers must be >= 1, got {self.layers}")
        _positive(f"model {self.name}: dtype_bytes", self.dtype_bytes)
        mla = self.kv_lora_rank > 0 or self.qk_rope_head_dim > 0
        gqa = self.kv_heads > 0 or self.head_dim > 0
        if mla == gqa:
            raise SizingError(f"model {self.name}: give either kv_lora_rank/qk_rope_head_dim "
                              "(MLA) or kv_heads/head_dim (GQA/MHA)")
        if gqa and not (self.kv_heads > 0 and self.head_dim > 0):
            raise SizingError(f"model {self.name}: GQA needs both kv_heads and head_dim")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0 or self.qk_rope_head_dim > 0

    @property
    def formula(self) -> str:
        """The per-token product, as the text writes it."""
        dtype = f"{self.dtype_bytes:g}"
        if self.is_mla:
            return f"{self.layers} x ({self.kv_lora_rank} + {self.qk_rope_head_dim}) x {dtype}"
        return f"{self.layers} x 2 x {self.kv_heads} x {self.head_dim} x {dtype}"

    def kv_bytes_per_token(self) -> int:
        if self.is_mla:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.kv_heads * self.head_dim
        return int(round(self.layers * per_layer * self.dtype_bytes))


GLM_5_1 = ModelConfig("glm-5.1", layers=78, kv_lora_rank=512, qk_rope_head_dim=64)

#: Models by name.  GLM-5.1 is the text's; FP8 KV "roughly halves" it
#: (section 3).  Qwen2.5-14B is the RL text's (000) model, Llama-3-70B a
#: familiar GQA check (320 KiB per token).
MODELS: Dict[str, ModelConfig] = {
    "glm-5.1": GLM_5_1,
    "glm-5.1-fp8": ModelConfig("glm-5.1-fp8", layers=78, kv_lora_rank=512,
                               qk_rope_head_dim=64, dtype_bytes=1.0),
    "qwen2.5-14b": ModelConfig("qwen2.5-14b", layers=48, kv_heads=8, head_dim=128),
    "llama-3-70b": ModelConfig("llama-3-70b", layers=80, kv_heads=8, head_dim=128),
}


def model(name: str) -> ModelConfig:
    try:
        return MODELS[name]
    except KeyError:
        raise SizingError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def kv_bytes_per_request(config: ModelConfig, tokens: int) -> int:
    """P -> D KV of one request: every prompt token's KV (section 3's table)."""
    if tokens < 0:
        raise SizingError(f"tokens must be >= 0, got {tokens}")
    return config.kv_bytes_per_token() * tokens


def kv_bytes_per_card(config: ModelConfig, tokens: int, tp: int = 8) -> float:
    """One TP rank's share: TP rank i of P sends 1/tp of the KV to rank i of D."""
    if tp < 1:
        raise SizingError(f"tp must be >= 1, got {tp}")
    return kv_bytes_per_request(config, tokens) / tp


@dataclass(frozen=True)
class KvRow:
    """One row of section 3's KV table and the token count that reproduces it."""

    label: str
    tokens: int
    text_request_gb: float
    text_card_gb: float


TEXT_KV_TABLE: Tuple[KvRow, ...] = (
    KvRow("32K", 32_768, 2.94, 0.370),     # 32,000 tokens would give 2.88 GB
    KvRow("128K", 128_000, 11.5, 1.4),     # 131,072 tokens would give 11.78 GB
    KvRow("200K", 202_752, 18.2, 2.3),     # 200,000 tokens would give 17.97 GB
)


# ------------------------------------------------------------------ P:D ratio
def effective_input_tokens(input_tokens: float, hit_ratio: float = 0.0,
                           cached_price_ratio: float = CACHED_INPUT_PRICE_RATIO) -> float:
    """I_eff = I x ((1 - H) + H x 0.26 / 1.4): cache hits cost 0.26/1.4 of a miss."""
    _fraction("hit_ratio", hit_ratio)
    if input_tokens < 0:
        raise SizingError(f"input_tokens must be >= 0, got {input_tokens}")
    return input_tokens * ((1.0 - hit_ratio) + hit_ratio * cached_price_ratio)


def pd_ratio(input_tokens: float, output_tokens: float, hit_ratio: float = 0.0,
             headroom: float = 1.0, price_ratio: float = OUTPUT_INPUT_PRICE_RATIO,
             cached_price_ratio: float = CACHED_INPUT_PRICE_RATIO) -> float:
    """P/D ~ I_eff / (price_ratio x O) x h (section 4); h = 1 reproduces the table."""
    _positive("output_tokens", output_tokens)
    _positive("headroom", headroom)
    _positive("price_ratio", price_ratio)
    eff = effective_input_tokens(input_tokens, hit_ratio, cached_price_ratio)
    return eff / (price_ratio * output_tokens) * headroom


@dataclass(frozen=True)
class Profile:
    """A workload profile of section 4's table (token counts in thousands)."""

    name: str
    label: str
    input_tokens: int
    output_tokens: int
    hit_ratio: float
    text_ratio: float
    recommended: str

    def ratio(self, headroom: float = 1.0) -> float:
        return pd_ratio(self.input_tokens, self.output_tokens, self.hit_ratio, headroom)


K = 1024
TEXT_PROFILES: Tuple[Profile, ...] = (
    Profile("deep-thinking", "Deep thinking / long output, 16K in / 8K out",
            16 * K, 8 * K, 0.0, 0.64, "1:1, or 2:3"),
    Profile("coding-agent", "Typical coding agent, 24K in / 6K out",
            24 * K, 6 * K, 0.0, 1.27, "3:2"),
    Profile("repo-heavy", "Repo-heavy long context, 32K in / 4K out",
            32 * K, 4 * K, 0.0, 2.55, "2:1-5:2"),
    Profile("cached-coding", "32K/6K with 40% cache hit (I_eff ~21.6K)",
            32 * K, 6 * K, 0.4, 1.15, "4:3-3:2"),
)


def profile(name: str) -> Profile:
    for item in TEXT_PROFILES:
        if item.name == name:
            return item
    raise SizingError(f"unknown profile {name!r}; known: "
                      f"{', '.join(p.name for p in TEXT_PROFILES)}")


# ------------------------------------------------------------------ pool sizes
@dataclass(frozen=True)
class PoolSize:
    """N_D's three terms, which one binds, and the matching N_P."""

    n_d_compute: int
    n_d_kv_memory: int
    n_d_kv_ingress: int
    n_p: int
    resident_kv_bytes: float
    ingress_gbps: float

    @property
    def terms(self) -> Dict[str, int]:
        return {"compute": self.n_d_compute, "kv_memory": self.n_d_kv_memory,
                "kv_ingress": self.n_d_kv_ingress}

    @property
    def n_d(self) -> int:
        return max(self.terms.values())

    @property
    def binding(self) -> str:
        """The term that sets N_D (the first of compute, kv_memory, kv_ingress on a tie)."""
        return max(self.terms, key=lambda name: self.terms[name])


def d_pool(config: ModelConfig, request_rate: float, input_tokens: float,
           output_tokens: float, hit_ratio: float = 0.0, headroom: float = 1.0,
           decode_tokens_per_s: float = 3000.0, prefill_tokens_per_s: Optional[float] = None,
           stream_tokens_per_s: float = 30.0, keepalive_s: float = 0.0,
           kv_memory_gb: float = 256.0, ingress_gbps: float = 3200.0,
           ingress_utilization: float = 0.5,
           price_ratio: float = OUTPUT_INPUT_PRICE_RATIO) -> PoolSize:
    """N_D = max(compute, KV memory, KV ingress) for a steady request stream.

    With lambda = ``request_rate`` (requests/s), I and O the mean prompt
    and output tokens, H the cache-hit ratio and kv = KV bytes per token:

    * compute: ``N_D_compute = ceil(lambda x O / R_dec)``, R_dec =
      ``decode_tokens_per_s`` the output tokens one D instance sustains
      (batched).
    * KV memory: by Little's law ``lambda x O / r`` requests decode at once
      (r = ``stream_tokens_per_s``, one request's decode speed), each holding
      on average I + O/2 tokens of KV; sessions kept warm for
      ``keepalive_s`` after their last token add ``lambda x keepalive_s``
      requests of I + O tokens.  ``N_D_KV_memory = ceil(resident /
      M_kv)``, M_kv = ``kv_memory_gb`` of one D instance's HBM left for KV.
    * KV ingress: only the prompt tokens D does not already hold travel
      (delta KV, cache hits on D_home), ``lambda x I x (1 - H) x kv`` bytes/s;
      ``N_D_KV_ingress = ceil(that x 8 / (B_in x u))`` with B_in =
      ``ingress_gbps`` of one D instance (8 x 400G) and u =
      ``ingress_utilization`` (headroom for bursts, which credits meter).

    N_P = ceil(h x lambda x I_eff / R_pre).  R_pre = ``prefill_tokens_per_s``
    defaults to ``price_ratio x R_dec``: the text's price proxy (an output
    token costs 3.14 input tokens), which makes N_P / N_D_compute the
    `pd_ratio` up to rounding.  The default rates are illustrative, not the
    text's: measure them for a real deployment.
    """
    for name, value in (("request_rate", request_rate), ("output_tokens", output_tokens),
                        ("decode_tokens_per_s", decode_tokens_per_s),
                        ("stream_tokens_per_s", stream_tokens_per_s),
                        ("kv_memory_gb", kv_memory_gb), ("ingress_gbps", ingress_gbps),
                        ("headroom", headroom), ("price_ratio", price_ratio)):
        _positive(name, value)
    if input_tokens < 0 or keepalive_s < 0:
        raise SizingError("input_tokens and keepalive_s must be >= 0")
    _fraction("hit_ratio", hit_ratio)
    if not 0 < ingress_utilization <= 1:
        raise SizingError(f"ingress_utilization must be within (0, 1], got {ingress_utilization}")
    if prefill_tokens_per_s is None:
        prefill_tokens_per_s = price_ratio * decode_tokens_per_s
    _positive("prefill_tokens_per_s", prefill_tokens_per_s)
    per_token = config.kv_bytes_per_token()

    compute = request_rate * output_tokens / decode_tokens_per_s
    decoding = request_rate * output_tokens / stream_tokens_per_s
    kept = request_rate * keepalive_s
    resident = per_token * (decoding * (input_tokens + output_tokens / 2)
                            + kept * (input_tokens + output_tokens))
    ingress_bps = request_rate * input_tokens * (1 - hit_ratio) * per_token * 8
    prefill = headroom * request_rate * effective_input_tokens(input_tokens, hit_ratio) \
        / prefill_tokens_per_s
    return PoolSize(n_d_compute=_ceil(compute),
                    n_d_kv_memory=_ceil(resident / (kv_memory_gb * GB)),
                    n_d_kv_ingress=_ceil(ingress_bps / (ingress_gbps * 1e9 * ingress_utilization)),
                    n_p=_ceil(prefill), resident_kv_bytes=resident,
                    ingress_gbps=ingress_bps / 1e9)
