"""KV sizing, the P:D ratio and the D pool of P/D inference; no emulation.

The 002 text's sections 3 and 4, from `traffic.kvcache`: KV bytes per
token of the model, per request and per card at the scenario's prompt
length; section 3's KV table (32K / 128K / 200K) against the text; the P:D
ratio of the scenario's workload; section 4's four profiles (0.64, 1.27,
2.55, 1.15 at h = 1) next to the text's numbers and with the scenario's
headroom; and N_D = max(compute, KV memory, KV ingress) with the term that
binds.  Section 5's ZCube cell table: per cell size its nodes, balanced k,
ports and switches, the P/D node split of ``cell_pd_ratio`` (3:2) in eighths
of the cell and the equivalent ROFT GPUs at ``roft_gain`` (+15%), beside the
text's 80P/48D, 320P/192D, 1280P/768D and ~1178 / ~4710 / ~18,842
(`topologies.zcube.cell_table`).  Everything goes to result.json's metrics
(and so report.md).
"""

from __future__ import annotations

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import zcube
from topologies.fabric import FabricError
from traffic import kvcache

SECTION = "pd_calc"
SUMMARY = "KV per token/request/card, P:D ratio (text's table) and N_D sizing; no emulation"
FIELDS = {
    "model": Field(str, "glm-5.1", "model config (KV layout and dtype)",
                   choices=sorted(kvcache.MODELS)),
    "prompt_tokens": Field(int, 24576, "mean prompt (input) tokens per request", minimum=1),
    "output_tokens": Field(int, 6144, "mean generated tokens per request", minimum=1),
    "hit_ratio": Field(float, 0.0, "cache-hit ratio H of the prompt tokens",
                       minimum=0.0, maximum=1.0),
    "headroom": Field(float, 1.0, "TTFT/SLO headroom h (text: 1.1-1.2 on ZCube, its table "
                      "uses 1.0)", minimum=0.1, maximum=10.0),
    "tp": Field(int, 8, "tensor-parallel size of a P or D instance", minimum=1),
    "request_rate": Field(float, 20.0, "requests per second the pool serves", minimum=1e-6),
    "decode_tokens_per_s": Field(float, 3000.0, "output tokens/s one D instance sustains",
                                 minimum=1e-3),
    "prefill_tokens_per_s": Field(float, 0.0, "prompt tokens/s one P instance sustains "
                                  "(0 = 3.14 x decode_tokens_per_s, the text's price proxy)",
                                  minimum=0.0),
    "stream_tokens_per_s": Field(float, 30.0, "decode speed of one request (tokens/s)",
                                 minimum=1e-3),
    "keepalive_s": Field(float, 0.0, "seconds a finished session's KV stays on its D",
                         minimum=0.0),
    "kv_memory_gb": Field(float, 256.0, "GB of one D instance's HBM left for KV",
                          minimum=1e-3),
    "ingress_gbps": Field(float, 3200.0, "KV ingress Gbit/s of one D instance (8 x 400G)",
                          minimum=1e-3),
    "ingress_utilization": Field(float, 0.5, "share of ingress_gbps KV may use on average",
                                 minimum=0.01, maximum=1.0),
    "cells": Field(list, list(zcube.TEXT_CELLS), "GPUs of the ZCube cells of the section-5 "
                   "table (square, whole 8-GPU nodes in eighths)", item=int, minimum=16),
    "cell_pd_ratio": Field(float, zcube.TEXT_PD_RATIO, "P:D of the cell table's node split "
                           "(text: 3:2 = 1.5)", minimum=0.01, maximum=100.0),
    "roft_gain": Field(float, zcube.ROFT_THROUGHPUT_GAIN, "ZCube throughput per GPU over ROFT "
                       "(text: +15% = 1.15)", minimum=0.01, maximum=10.0),
}


def check(scenario) -> None:
    """Beyond the schema's bounds: each cell of the cell table must be a ZCube(n, 2)."""
    settings = scenario.section
    for gpus in settings["cells"]:
        try:
            zcube.cell_row(gpus, settings["cell_pd_ratio"])
        except FabricError as error:
            raise ValueError(f"pd_calc.cells has {gpus}: {error}") from None


def _gb(value: float) -> str:
    return f"{value / kvcache.GB:.2f} GB"


def _size(value: float) -> str:
    return _gb(value) if value >= kvcache.GB else f"{value / kvcache.MB:.0f} MB"


def _text_size(gb: float) -> str:
    """A size as the text prints it: 2.94 GB, 370 MB."""
    return f"{gb:g} GB" if gb >= 1 else f"{gb * 1000:g} MB"


def _kv_rows(config, tp: int):
    rows = []
    for row in kvcache.TEXT_KV_TABLE:
        request = kvcache.kv_bytes_per_request(config, row.tokens)
        card = kvcache.kv_bytes_per_card(config, row.tokens, tp)
        rows.append({"prompt": row.label, "tokens_count": row.tokens, "request_bytes": request,
                     "card_bytes": card, "text_request_bytes": row.text_request_gb * kvcache.GB,
                     "text_card_bytes": row.text_card_gb * kvcache.GB})
    return rows


def _profile_rows(headroom: float):
    return [{"profile": p.name, "input_tokens_count": p.input_tokens,
             "output_tokens_count": p.output_tokens, "hit_ratio": p.hit_ratio,
             "pd_ratio": p.ratio(), "text_pd_ratio": p.text_ratio,
             "pd_with_headroom_ratio": p.ratio(headroom), "recommended": p.recommended}
            for p in kvcache.TEXT_PROFILES]


def _cell_rows(ctx: Context, cells, pd_ratio: float, roft_gain: float):
    """Section 5's ZCube cell table, logged with the text's figures in brackets."""
    rows = zcube.cell_table(cells, pd_ratio=pd_ratio, roft_gain=roft_gain)
    ctx.log(f"ZCube cell table (section 5; P:D {pd_ratio:g}:1 in eighths of the cell, "
            f"ROFT-equivalent at x{roft_gain:g}; text in brackets):")
    out = []
    for row in rows:
        text = (f" ({row['text_p_nodes']}P / {row['text_d_nodes']}D)"
                if "text_p_nodes" in row else "")
        roft = f" (~{row['text_roft_gpus']:,})" if "text_roft_gpus" in row else ""
        ctx.log(f"  {row['gpus']:>6,} GPUs: {row['nodes']:,} nodes, k = {row['balanced_k']}, "
                f"{row['ports_per_switch']} ports x {row['switches']} switches, "
                f"{row['p_nodes']}P / {row['d_nodes']}D{text}, "
                f"equivalent ROFT GPUs {row['roft_gpus']:,.0f}{roft}")
        item = {"gpus_count": row["gpus"], "nodes_count": row["nodes"],
                "balanced_k_count": row["balanced_k"],
                "ports_per_switch_count": row["ports_per_switch"],
                "switches_count": row["switches"], "p_nodes_count": row["p_nodes"],
                "d_nodes_count": row["d_nodes"], "roft_gpus_count": row["roft_gpus"],
                "zcube_gpus_for_roft_count": row["zcube_gpus_for_roft"]}
        if "text_p_nodes" in row:
            item.update(text_p_nodes_count=row["text_p_nodes"],
                        text_d_nodes_count=row["text_d_nodes"],
                        text_roft_gpus_count=row["text_roft_gpus"],
                        roft_gpus_error_pct=100 * (row["roft_gpus"] / row["text_roft_gpus"] - 1))
        out.append(item)
    return out


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    config = kvcache.model(s["model"])
    per_token = config.kv_bytes_per_token()
    request = kvcache.kv_bytes_per_request(config, s["prompt_tokens"])
    card = kvcache.kv_bytes_per_card(config, s["prompt_tokens"], s["tp"])
    eff = kvcache.effective_input_tokens(s["prompt_tokens"], s["hit_ratio"])
    ratio = kvcache.pd_ratio(s["prompt_tokens"], s["output_tokens"], s["hit_ratio"],
                             s["headroom"])
    pool = kvcache.d_pool(config, s["request_rate"], s["prompt_tokens"], s["output_tokens"],
                          s["hit_ratio"], s["headroom"], s["decode_tokens_per_s"],
                          s["prefill_tokens_per_s"] or None, s["stream_tokens_per_s"],
                          s["keepalive_s"], s["kv_memory_gb"], s["ingress_gbps"],
                          s["ingress_utilization"])
    kv_rows, profiles = _kv_rows(config, s["tp"]), _profile_rows(s["headroom"])

    ctx.log(f"{config.name}: {config.formula} = {per_token:,} B of KV per token "
            f"(text, GLM-5.1 BF16: {kvcache.GLM_5_1.kv_bytes_per_token():,})")
    ctx.log(f"KV at {s['prompt_tokens']:,} prompt tokens: {_size(request)} per request, "
            f"{_size(card)} per card at TP={s['tp']}")
    ctx.log(f"KV table (section 3, text in brackets, TP={s['tp']}):")
    for row in kv_rows:
        text = next(r for r in kvcache.TEXT_KV_TABLE if r.label == row["prompt"])
        ctx.log(f"  {row['prompt']:>4} ({row['tokens_count']:,} tokens): "
                f"{_size(row['request_bytes'])} (~{_text_size(text.text_request_gb)}), per card "
                f"{_size(row['card_bytes'])} (~{_text_size(text.text_card_gb)})")
    ctx.log(f"P:D for {s['prompt_tokens']:,} in / {s['output_tokens']:,} out, "
            f"H = {s['hit_ratio']:.0%}, h = {s['headroom']:g}: I_eff = {eff:,.0f} tokens, "
            f"P/D = {ratio:.2f}:1")
    with_h = s["headroom"] != 1.0
    ctx.log("profiles (section 4; the formula at h = 1 vs the text"
            + (f", then at h = {s['headroom']:g}):" if with_h else "):"))
    for row, item in zip(profiles, kvcache.TEXT_PROFILES):
        headroom = f", h={s['headroom']:g}: {row['pd_with_headroom_ratio']:.2f}:1" if with_h else ""
        ctx.log(f"  {item.label:<48} {row['pd_ratio']:.2f}:1 (text {item.text_ratio:.2f}:1)"
                f"{headroom}, start {item.recommended}")
    terms = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in pool.terms.items())
    ctx.log(f"D pool at {s['request_rate']:g} req/s: {terms} -> N_D = {pool.n_d} "
            f"({pool.binding.replace('_', ' ')} binds); N_P = {pool.n_p}")
    cells = _cell_rows(ctx, s["cells"], s["cell_pd_ratio"], s["roft_gain"])
    return Outcome(metrics={
        "cells_max_abs_error_pct": max((abs(row["roft_gpus_error_pct"]) for row in cells
                                        if "roft_gpus_error_pct" in row), default=0.0),
        "zcube_cells": cells,
        "kv_per_token_bytes": per_token,
        "kv_per_request_bytes": request,
        "kv_per_card_bytes": card,
        "effective_input_tokens_count": eff,
        "pd_ratio": ratio,
        "profiles_max_abs_error_ratio": max(abs(round(r["pd_ratio"], 2) - r["text_pd_ratio"])
                                            for r in profiles),
        "n_d_count": pool.n_d,
        "n_d_compute_count": pool.n_d_compute,
        "n_d_kv_memory_count": pool.n_d_kv_memory,
        "n_d_kv_ingress_count": pool.n_d_kv_ingress,
        "n_d_binding": pool.binding,
        "n_p_count": pool.n_p,
        "resident_kv_bytes": pool.resident_kv_bytes,
        "kv_ingress_gbps": pool.ingress_gbps,
        "kv_table": kv_rows,
        "profiles": profiles,
    })


EXPERIMENT = Experiment(kind="pd-calc", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.NONE)
