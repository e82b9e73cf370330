"""Study: the anatomy of real keys and values (SmolLM2-135M-Instruct and Gemma 3 270M over the shipped public-domain
text).

    python studies/kv_anatomy.py --scale quick|paper [--scheduler ADDR]

Writes (data beside each figure in figures/data/):
  figures/kv_anatomy_channels[_gemma3].png  mean |k| and mean |v| per head-dim channel, layer × channel heatmaps
                                   (each layer divided by its median channel), as in QJL's figure 2
  figures/kv_anatomy_outliers[_gemma3].png  max/median channel magnitude per layer, keys and values
  figures/kv_anatomy_wht[_gemma3].png       coordinates of unit keys before and after a random-sign Walsh–Hadamard
                                   rotation, against the sphere law f_d (Beta((d−1)/2, (d−1)/2) on [−1, 1])
  figures/kv_anatomy_ks.png        KS distance of raw and rotated key coordinates to f_d, per layer, both models
  figures/data/kv_anatomy_channels.csv   model, layer, tensor, channel, mean_abs, ratio_to_median
  figures/data/kv_anatomy_outliers.csv   model, layer, tensor, top channels, max/median ratio
  figures/data/kv_anatomy_ks.csv         model, layer, KS statistic and p-value of raw and rotated coordinates

quick: 1024 tokens; paper: 2048 tokens, per model (kvstats.study.models.REAL_MODELS: a model whose package is
missing gets a row saying so). The captures are cached (kvstats.hf.capture.load_default_capture), so only the first
run loads the models. Each (model, layer) is a kvstats.study.sweep cell (channel magnitudes, KS distances,
histograms), run and stored like every study's; every claim is judged on each model, and a last row lists where the
two models' verdicts differ.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from kvstats import study
from kvstats.hf.capture import load_default_capture  # noqa: E402
from kvstats.hf.models import GEMMA3, SHIPPED_MODELS, SMOLLM2  # noqa: E402
from kvstats.measure import verdicts  # noqa: E402
from kvstats.measure.stats import wilcoxon  # noqa: E402
from kvstats.quant.quantizers import quantizer  # noqa: E402
from kvstats.quant.rotations import fwht  # noqa: E402
from kvstats.study import plots
from kvstats.study.claims import Claim, SampleSize  # noqa: E402
from kvstats.study.models import available_models, file_suffix, model_claim_id, per_model_claims  # noqa: E402
from kvstats.study.paths import figure_path  # noqa: E402
from kvstats.study.sample_plans import PairedCell, ks_equivalence_sample, paired_sample  # noqa: E402
from kvstats.study.sweep import grid  # noqa: E402

STUDY = "kv_anatomy"
VERSION = "3"
SCALE = {"quick": {"tokens": 1024}, "paper": {"tokens": 2048}, "full": {"tokens": 2048}}  # full: + the second model
HIST_LAYERS = {SMOLLM2: (0, 1, 7, 15, 22, 29), GEMMA3: (0, 1, 5, 9, 11, 17)}  # first, early, middle, global, last
HIST_BINS = np.linspace(-0.6, 0.6, 81)
POSITION = 20  # place in figures/REPORT.md (kvstats.study.report.study_order)
ALPHA = 0.05
#: "follows f_d" on real keys: the true Kolmogorov distance below 0.04, the finest margin 6,144 draws per layer can
#: decide (Kolmogorov's 95% band is ±0.017) and below every raw layer's distance (0.047–0.100 at paper scale)
KS_MARGIN = 0.04
KEY_RANGE, VALUE_RANGE = (3.0, 5.6), (1.7, 3.8)  # max/median channel magnitude quoted in docs/references.md §8
EXPECTED_CHANNELS = (22, 23, 24, 54, 55, 56)
OUTLIER_RATIO = 2.5  # a layer "has an outlier channel" when max/median channel magnitude exceeds this
FIRST_LAYERS = 2  # "the first layers" of QJL's statement
# QJL's outlier sketch on real keys: equal sign bits (2 per coordinate), the OUTLIER_CHANNELS channels of largest
# mean |k| of the layer in their own sketch with ROWS_PER_OUTLIER rows each; the last QUERY_TOKENS queries of every
# query head against its KV head's keys; Gaussian rows
OUTLIER_CHANNELS, ROWS_PER_OUTLIER, SIGN_BITS, QUERY_TOKENS = 4, 8, 2, 32
#: The outlier sketch's effect of interest (issue 50): a mean squared error 10% below the single sketch's, the smallest
#: gain worth a second sketch and norm per key (QJL gives no number for it)
SKETCH_EFFECT = 0.10
#: The sample of the claims read from the channel magnitudes: every layer, channel and token of the capture
EXACT_CAPTURE = ("none planned: every layer's channel magnitudes are computed over the whole capture (a fixed text, "
                 "every token and head), not sampled; the bound rules read them as exact values")


def _sphere_ks(x: np.ndarray, d: int):
    """KS test of x against the sphere law f_d: kvstats.quant.sphere.goodness_of_fit when present, else scipy."""
    try:
        from kvstats.quant.sphere import goodness_of_fit
    except ImportError:
        a = (d - 1) / 2
        res = stats.kstest(x, stats.beta(a, a, loc=-1, scale=2).cdf)
        return float(res.statistic), float(res.pvalue)
    res = goodness_of_fit(x, d, method="ks")
    return float(res.statistic), float(res.pvalue)


@functools.lru_cache(maxsize=2)
def _capture(tokens: int, model: str = SMOLLM2):
    return load_default_capture(tokens, model=model, verbose=False)



def qjl_outlier_errors(cap, layer: int, d: int, seed: int) -> dict:
    """Mean squared error of QJL's Prod(q, k) − ⟨q, k⟩ on one layer's real queries and keys, one sketch of
    SIGN_BITS·d rows vs the outlier split at the same sign bits (module constants)."""
    k = cap.keys(layer).double()[0]  # [kv_heads, T, d]
    q = cap.queries(layer).double()[0, :, -QUERY_TOKENS:]  # [q_heads, n, d]
    q = q.reshape(k.shape[0], -1, d)  # query heads grouped by their KV head (GQA: consecutive heads share one)
    ref = q @ k.transpose(-1, -2)
    idx = torch.argsort(k.abs().mean(dim=(0, 1)), descending=True)[:OUTLIER_CHANNELS].tolist()
    m_total, m_out = SIGN_BITS * d, ROWS_PER_OUTLIER * OUTLIER_CHANNELS
    out = {}
    for name, kw in (("single", {"m": m_total}),
                     ("split", {"m": m_total - m_out, "outliers": idx, "outlier_m": m_out})):
        quant = quantizer("qjl", dim=d, rows="gaussian", seed=seed + 1000 * layer + (name == "split"), **kw)
        out[f"qjl_mse_{name}"] = float((quant.inner(q, quant.encode(k)).double() - ref).pow(2).mean())
    out["qjl_ref_ms"] = float(ref.pow(2).mean())
    return out


def qjl_outlier_sample(single: np.ndarray, split: np.ndarray) -> SampleSize:
    """The outlier sketch claim's sample size: one paired Wilcoxon cell over the layers (α = ALPHA) for a mean
    squared error SKETCH_EFFECT below the single sketch's (kvstats.study.sample_plans.paired_sample)."""
    single, split = np.asarray(single, float), np.asarray(split, float)
    cell = PairedCell.from_differences(split - single, abs(float(single.mean())))
    sample = paired_sample([cell], effect=SKETCH_EFFECT, alpha=ALPHA, unit="layers",
                           effect_words=f"the split sketch's error {SKETCH_EFFECT:.0%} below the single sketch's")
    return replace(sample, mde_of="shift as a fraction of the single sketch's mean error")


def qjl_outlier_verdict(single: np.ndarray, split: np.ndarray, name: str = "SmolLM2") -> verdicts.Verdict:
    """The outlier sketch lowers the inner-product error on real keys: direction rule, one cell, Wilcoxon paired
    by layer (split error lower)."""
    w = wilcoxon(np.asarray(split, float), np.asarray(single, float))
    return verdicts.direction([verdicts.cell_direction(w.pvalue, w.effect_size, expected_sign=-1, alpha=ALPHA)],
                              what=f"models ({name} layers paired)")


def layer_cell(model: str, layer: int, tokens: int, seed: int) -> list[dict]:
    """One layer of a model's capture: mean |x| per channel (keys, values), the KS distance of unit-key coordinates
    to f_d before and after a random-sign WHT, and (for the model's HIST_LAYERS) the histograms of those
    coordinates."""
    cap = _capture(tokens, model)
    d = int(cap.metadata["head_dim"])
    rows = []
    for name, x in (("keys", cap.keys(layer)), ("values", cap.values(layer))):
        prof = x.float().abs().mean(dim=(0, 1, 2)).numpy()  # pooled over batch, heads and tokens
        rows += [{"kind": "channel", "tensor": name, "channel": c, "mean_abs": float(prof[c])} for c in range(d)]
    k = cap.keys(layer).double().reshape(-1, d)  # [heads * tokens, d]
    unit = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    signs = torch.where(torch.rand(d, generator=torch.Generator().manual_seed(seed + layer)) < 0.5, -1.0, 1.0)
    rotated = fwht(unit * signs.to(unit.dtype))
    # one coordinate per vector (cycling through the channels) so the KS draws are independent
    idx = torch.arange(unit.shape[0])
    raw_x, rot_x = unit[idx, idx % d].numpy(), rotated[idx, idx % d].numpy()
    ks_raw, p_raw = _sphere_ks(raw_x, d)
    ks_rot, p_rot = _sphere_ks(rot_x, d)
    rows.append({"kind": "ks", "n": int(raw_x.size), "ks_raw": ks_raw, "p_raw": p_raw, "ks_wht": ks_rot,
                 "p_wht": p_rot})
    rows.append({"kind": "qjl_outliers", **qjl_outlier_errors(cap, layer, d, seed)})
    if layer in HIST_LAYERS[model]:
        for which, vals in (("raw", unit), ("wht", rotated)):
            dens, _ = np.histogram(vals.flatten().numpy(), bins=HIST_BINS, density=True)
            rows += [{"kind": "hist", "tensor": which, "bin": i, "density": float(h)} for i, h in enumerate(dens)]
    return rows


def channel_profiles(table) -> tuple[np.ndarray, np.ndarray]:
    """mean |x| per channel, pooled over heads and tokens: [layers, d] for keys and values (one model's table)."""
    ch = table[table["kind"] == "channel"]
    out = []
    for name in ("keys", "values"):
        wide = ch[ch["tensor"] == name].pivot(index="layer", columns="channel", values="mean_abs").sort_index()
        out.append(wide.to_numpy(dtype=float))
    return out[0], out[1]


def outlier_rows(k: np.ndarray, v: np.ndarray, model: str = SMOLLM2) -> list[dict]:
    """Per layer and tensor: the six channels of largest mean |x| and the max/median ratio (kv_anatomy_outliers.csv)."""
    rows = []
    for name, prof in (("keys", k), ("values", v)):
        ratio = prof / np.median(prof, axis=1, keepdims=True)
        for layer in range(prof.shape[0]):
            top = np.argsort(prof[layer])[::-1][:6]
            rows.append({"model": model, "layer": layer, "tensor": name,
                         "top_channels": " ".join(str(int(c)) for c in top),
                         "max_over_median": f"{ratio[layer].max():.3f}"})
    return rows


def ks_rows(table, model: str = SMOLLM2) -> list[dict]:
    """The KS distances of raw and rotated unit-key coordinates per layer (kv_anatomy_ks.csv; one model's table)."""
    ks = table[table["kind"] == "ks"].sort_values("layer")
    return [{"model": model, "layer": int(r.layer), "n": int(r.n), "ks_raw": r.ks_raw, "p_raw": r.p_raw,
             "ks_wht": r.ks_wht, "p_wht": r.p_wht} for r in ks.itertuples()]


def channels_figure(a: Analysis) -> list[dict]:
    """One model's channel heatmaps; returns its rows of kv_anatomy_channels.csv."""
    rows = []
    fig, axes = plt.subplots(1, 2, figsize=(14, 6), constrained_layout=True)
    for ax, name, prof in ((axes[0], "keys", a.k), (axes[1], "values", a.v)):
        ratio = prof / np.median(prof, axis=1, keepdims=True)
        im = ax.imshow(ratio, aspect="auto", cmap="magma", origin="lower", interpolation="nearest")
        ax.set_title(f"{a.name} {name}: mean |x| per channel / layer median")
        ax.set_xlabel(f"head-dim channel (RoPE pairs channel i with i + {a.d // 2})")
        ax.set_ylabel("layer")
        ax.set_xticks(range(0, prof.shape[1], max(8, a.d // 8)))
        fig.colorbar(im, ax=ax, label="mean |x| / median over channels")
        rows += [{"model": a.model, "layer": layer, "tensor": name, "channel": c, "mean_abs": f"{prof[layer, c]:.6g}",
                  "ratio_to_median": f"{ratio[layer, c]:.4f}"}
                 for layer in range(prof.shape[0]) for c in range(prof.shape[1])]
    fig.savefig(figure_path("kv_anatomy_channels" + file_suffix(a.model)), dpi=120)
    plt.close(fig)
    return rows


def outliers_figure(a: Analysis) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    layers = np.arange(a.k.shape[0])
    for prof, name, color in ((a.k, "keys", "#d62728"), (a.v, "values", "#1f77b4")):
        ax.plot(layers, prof.max(1) / np.median(prof, 1), "o-", color=color, label=name)
    if a.model == SMOLLM2:  # the ranges quoted for SmolLM2
        ax.axhspan(*KEY_RANGE, color="#d62728", alpha=0.08, label="docs/references.md §8 keys: 3–5.6")
        ax.axhspan(*VALUE_RANGE, color="#1f77b4", alpha=0.08, label="docs/references.md §8 values: 1.7–3.8")
    ax.axhline(OUTLIER_RATIO, color="#555555", lw=0.8, ls=":", label=f"outlier threshold {OUTLIER_RATIO}")
    ax.set_xlabel("layer")
    ax.set_ylabel("max / median of mean |x| over channels")
    ax.set_title(f"Outlier channels per layer ({a.name})")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(figure_path("kv_anatomy_outliers" + file_suffix(a.model)), dpi=120)
    plt.close(fig)


def _histograms(table, rows: list[dict], layers: Sequence[int]) -> dict[int, tuple]:
    """The stored histograms of ``layers``: layer -> (raw densities, rotated densities, KS raw, KS rotated)."""
    by_layer = {r["layer"]: r for r in rows}
    hists = table[table["kind"] == "hist"]
    hist = {}
    for layer in layers:
        h = hists[hists["layer"] == layer]
        if len(h):
            hist[layer] = tuple(h[h["tensor"] == w].sort_values("bin")["density"].to_numpy() for w in ("raw", "wht")) \
                + (by_layer[layer]["ks_raw"], by_layer[layer]["ks_wht"])
    return hist


def wht_figure(table, a: Analysis) -> None:
    """One model's unit-key coordinates before and after the WHT at its HIST_LAYERS (``table``: its cells)."""
    d = a.d
    law = stats.beta((d - 1) / 2, (d - 1) / 2, loc=-1, scale=2)
    hist = _histograms(table, a.ks, HIST_LAYERS[a.model])
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), constrained_layout=True)
    t = np.linspace(-0.6, 0.6, 400)
    for ax, layer in zip(axes.flat, [layer for layer in HIST_LAYERS[a.model] if layer in hist]):
        raw, rot, ks_raw, ks_rot = hist[layer]
        ax.stairs(raw, HIST_BINS, color="#999999", lw=1.2, label=f"unit keys, raw (KS {ks_raw:.3f})")
        ax.stairs(rot, HIST_BINS, fill=True, color="#9ecae1", edgecolor="#3182bd", lw=0.3,
                  label=f"after random-sign WHT (KS {ks_rot:.3f})")
        ax.plot(t, law.pdf(t), color="#d62728", lw=1.6, label=f"sphere law f_{d}")
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("coordinate value")
        ax.set_ylabel("density")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.45)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Coordinates of real unit keys vs the sphere law ({a.name}, all heads and tokens)")
    fig.savefig(figure_path("kv_anatomy_wht" + file_suffix(a.model)), dpi=120)
    plt.close(fig)


def ks_figure(analyses: Sequence[Analysis]) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for a, color in zip(analyses, ("#3182bd", "#e6550d")):
        layers = [r["layer"] for r in a.ks]
        ax.plot(layers, [float(r["ks_raw"]) for r in a.ks], "o--", color=color, alpha=0.6,
                label=f"{a.name} (d = {a.d}), raw")
        ax.plot(layers, [float(r["ks_wht"]) for r in a.ks], "o-", color=color,
                label=f"{a.name} (d = {a.d}), after random-sign WHT")
    ax.axhline(KS_MARGIN, color="#555555", lw=0.8, ls=":", label=f"margin {KS_MARGIN}")
    ax.set_xlabel("layer")
    ax.set_ylabel("KS distance to the sphere law f_d")
    ax.set_title("How far real key coordinates are from the sphere law, per layer")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.savefig(figure_path("kv_anatomy_ks"), dpi=120)
    plt.close(fig)


def range_verdict(kr: np.ndarray, vr: np.ndarray, top1_in: list[bool]) -> verdicts.Verdict:
    """The quoted ranges as bounds (exact per-layer numbers, no sampling: CI = the point): keys within KEY_RANGE,
    values within VALUE_RANGE (bound rule, each side), and the largest key channel one of EXPECTED_CHANNELS in every
    layer (identity rule on the 0/1 indicator). Combined."""
    pt = lambda x: [(float(v), float(v)) for v in x]  # noqa: E731
    parts = [verdicts.bound(list(kr), pt(kr), KEY_RANGE[1], what="layers (keys ≤ 5.6)"),
             verdicts.bound(list(kr), pt(kr), KEY_RANGE[0], upper=False, what="layers (keys ≥ 3)"),
             verdicts.bound(list(vr), pt(vr), VALUE_RANGE[1], what="layers (values ≤ 3.8)"),
             verdicts.bound(list(vr), pt(vr), VALUE_RANGE[0], upper=False, what="layers (values ≥ 1.7)"),
             verdicts.identity([float(b) for b in top1_in], 1.0, atol=0.5,
                               what="layers (largest key channel in 22–24, 54–56)")]
    return verdicts.combine(parts)


def qjl_outliers_verdict(kr: np.ndarray) -> verdicts.Verdict:
    """QJL's statement with an outlier threshold OUTLIER_RATIO (exact numbers): the first FIRST_LAYERS layers below it
    (bound rule, upper), the deeper layers above it (bound rule, lower). Combined."""
    pt = lambda x: [(float(v), float(v)) for v in x]  # noqa: E731
    first, deep = kr[:FIRST_LAYERS], kr[FIRST_LAYERS:]
    return verdicts.combine([
        verdicts.bound(list(first), pt(first), OUTLIER_RATIO,
                       what=f"first layers (no channel > {OUTLIER_RATIO}× median)"),
        verdicts.bound(list(deep), pt(deep), OUTLIER_RATIO, upper=False,
                       what=f"deeper layers (a channel > {OUTLIER_RATIO}× median)")])


def wht_verdict(ks_wht: np.ndarray, n: np.ndarray) -> verdicts.Verdict:
    """Rotated unit-key coordinates follow f_d within KS_MARGIN in Kolmogorov distance at every layer (equivalence
    rule on the distance's interval, kvstats.measure.verdicts.ks_equivalence)."""
    return verdicts.ks_equivalence([float(k) for k in ks_wht], [int(v) for v in n], KS_MARGIN, alpha=ALPHA,
                                   what="layers")


def definitions(scale: str, models: Sequence[str] = (SMOLLM2, GEMMA3)) -> dict[str, str]:
    """The study's terms, generated from its configuration constants."""
    names = " and ".join(SHIPPED_MODELS[m].name for m in models)
    return {
        "capture": f"{names}, each over the shipped public-domain text, first {SCALE[scale]['tokens']} tokens "
                   f"(kvstats.hf.capture.load_default_capture), post-RoPE keys and values of every layer (Gemma 3's "
                   "after its QK-norm)",
        "channel magnitude": "mean |x| per head-dim channel pooled over batch, heads and tokens; a layer's outlier "
                             f"ratio is max/median over channels; a layer has an outlier channel when the ratio > "
                             f"{OUTLIER_RATIO}; QJL's \"first layers\" are layers 0–{FIRST_LAYERS - 1}",
        "sphere law": "unit keys (each key / its norm) rotated by a random-sign Walsh–Hadamard transform (seed 0 + "
                      "layer); one coordinate per key (cycling through the channels), so no two draws share a key; "
                      "KS distance to f_d with its interval for the true distance (Kolmogorov's law, level "
                      f"{1 - ALPHA:g}) against the margin {KS_MARGIN} per layer. The interval treats the draws as "
                      "independent; keys of nearby tokens are correlated, which it does not model",
        "models": "every claim is judged on each model by the same rule; the claim ids of SmolLM2 are the report's "
                  "earlier ones, Gemma 3's carry 'gemma3' (kvstats.study.models)",
    }


@dataclass(frozen=True)
class Analysis:
    """What the figures and claims read for one model: the scale, the model, the head dim, the channel profiles
    [layers, d] of keys and values, the outlier rows (kv_anatomy_outliers.csv), the KS rows (kv_anatomy_ks.csv) and
    the QJL sketch errors per layer."""

    scale: str
    d: int
    k: np.ndarray
    v: np.ndarray
    outliers: list[dict]
    ks: list[dict]
    qjl: pd.DataFrame
    model: str = SMOLLM2

    @property
    def name(self) -> str:
        return SHIPPED_MODELS[self.model].name

    @property
    def kr(self) -> np.ndarray:
        """Keys' max/median channel magnitude per layer."""
        return self.k.max(1) / np.median(self.k, 1)

    @property
    def vr(self) -> np.ndarray:
        """Values' max/median channel magnitude per layer."""
        return self.v.max(1) / np.median(self.v, 1)

    @property
    def keys(self) -> list[dict]:
        """The outlier rows of the keys."""
        return [r for r in self.outliers if r["tensor"] == "keys"]

    @property
    def data(self) -> str:
        return (f"{self.name} over the shipped public-domain text, {SCALE[self.scale]['tokens']} tokens, "
                f"{len(self.kr)} layers, d = {self.d} ({self.scale})")


@dataclass(frozen=True)
class Analyses:
    """Each model's :class:`Analysis` (in REAL_MODELS' order) and why the missing models did not run."""

    scale: str
    models: dict[str, Analysis]
    missing: dict[str, str]


def key_outliers_claim(a: Analysis) -> Claim:
    kr, vr, keys, expected = a.kr, a.vr, a.keys, set(EXPECTED_CHANNELS)
    top1_in = [int(r["top_channels"].split()[0]) in expected for r in keys]
    top3 = sum(bool(expected & {int(c) for c in r["top_channels"].split()[:3]}) for r in keys)
    in_range = int(((kr >= KEY_RANGE[0]) & (kr <= KEY_RANGE[1])).sum())
    outside = ", ".join(f"{i} ({kr[i]:.1f})" for i in np.flatnonzero((kr < 3) | (kr > 5.6)))
    return Claim(
        id="smollm2-key-outliers",
        claim="SmolLM2-135M keys have outlier channels in every layer: max/median channel magnitude 3–5.6, "
              "always head-dim indices 22–24 and 54–56; values 1.7–3.8.",
        source="kvstats (an earlier measurement, quoted in docs/references.md §8)",
        measurement=(f"keys max/median {kr.min():.1f}–{kr.max():.1f} ({in_range}/{len(kr)} layers inside "
                     f"3–5.6); the largest channel is one of 22–24, 54–56 in {sum(top1_in)}/{len(keys)} layers, one "
                     f"of the top three in {top3}/{len(keys)}; values {vr.min():.1f}–{vr.max():.1f}."),
        data=a.data,
        verdict=range_verdict(kr, vr, top1_in),
        sample=EXACT_CAPTURE,
        figure="kv_anatomy_outliers.png",
        details=f"Layers outside 3–5.6: {outside} (figures/data/kv_anatomy_outliers.csv).",
        discrepancy=(f"Real SmolLM2 key outlier ratios (max/median channel magnitude) range {kr.min():.1f}–"
                     f"{kr.max():.1f} over the layers, wider than the quoted 3–5.6 ({len(kr) - in_range}/"
                     f"{len(kr)} layers outside; figures/data/kv_anatomy_outliers.csv)."
                     if in_range < len(kr) else None))


def outliers_measured_claim(a: Analysis) -> Claim:
    """A model with no quoted range (Gemma 3): its outlier ratios and channels, measured."""
    kr, vr, keys = a.kr, a.vr, a.keys
    top = pd.Series([r["top_channels"].split()[0] for r in keys]).value_counts()
    above = int((kr > OUTLIER_RATIO).sum())
    return Claim(
        id=model_claim_id("smollm2-key-outliers", a.model),
        claim=f"{a.name} keys and values: how large their outlier channels are, and where.",
        source="kvstats",
        measurement=(f"{a.name}: keys max/median {kr.min():.1f}–{kr.max():.1f} ({above}/{len(kr)} layers above "
                     f"{OUTLIER_RATIO}); values {vr.min():.1f}–{vr.max():.1f}; the largest key channel takes "
                     f"{len(top)} distinct indices over {len(keys)} layers (most often "
                     + ", ".join(f"{c} ({n})" for c, n in top.head(3).items()) + ")."),
        data=a.data,
        verdict=verdicts.measured(f"{a.name}'s outlier ratios per layer, no published range to hold them to"),
        figure=f"kv_anatomy_outliers{file_suffix(a.model)}.png")


def qjl_channels_claim(a: Analysis) -> Claim:
    kr, keys = a.kr, a.keys
    return Claim(
        id=model_claim_id("qjl-outlier-channels", a.model),
        claim="Key embeddings of deeper layers have a few (≈ 4) fixed outlier channels that persist over "
              "tokens; the first layers have none.",
        source="Zandieh, Daliri, Han, QJL, arXiv 2406.03482, §4 and figure 2 (Llama-2)",
        measurement=(f"{a.name}: layers 0–{FIRST_LAYERS - 1} have max/median "
                     + ", ".join(f"{v:.1f}" for v in kr[:FIRST_LAYERS]) + "; deeper layers "
                     f"{kr[FIRST_LAYERS:].min():.1f}–{kr[FIRST_LAYERS:].max():.1f}; the largest key channel takes "
                     f"{len({r['top_channels'].split()[0] for r in keys})} distinct indices over {len(keys)} "
                     "layers (heatmap)."),
        data=a.data,
        verdict=qjl_outliers_verdict(kr),
        sample=EXACT_CAPTURE,
        figure=f"kv_anatomy_channels{file_suffix(a.model)}.png",
        details=(f"Outlier threshold: max/median > {OUTLIER_RATIO}. {a.name} is a different model from the "
                 "paper's Llama-2."))


def wht_claim(a: Analysis) -> Claim:
    ks_raw = np.array([float(r["ks_raw"]) for r in a.ks])
    ks_wht = np.array([float(r["ks_wht"]) for r in a.ks])
    n = np.array([int(r["n"]) for r in a.ks])
    raw = wht_verdict(ks_raw, n)
    return Claim(
        id=model_claim_id("smollm2-wht-sphere-law", a.model),
        claim="After a random-sign Walsh–Hadamard rotation, coordinates of unit keys follow the sphere law "
              "f_d marginally (the premise of TurboQuant's codebook).",
        source="TurboQuant, arXiv 2504.19874; D'Alberto, arXiv 2605.08114, §2.1",
        measurement=(f"{a.name}: KS distance to f_{a.d} (one coordinate per vector, {n.min()} per layer): raw "
                     f"{ks_raw.min():.3f}–{ks_raw.max():.3f}, after the WHT {ks_wht.min():.3f}–{ks_wht.max():.3f}; "
                     f"the same rule on the raw keys: {raw.verdict} ({raw.reason})."),
        data=a.data,
        verdict=wht_verdict(ks_wht, n),
        sample=ks_equivalence_sample(int(n.min()), margin=KS_MARGIN, alpha=ALPHA, unit="draws per layer",
                                     effect_words=f"a true KS distance of 0 within the margin {KS_MARGIN:g}"),
        figure=f"kv_anatomy_wht{file_suffix(a.model)}.png")


def qjl_sketch_claim(a: Analysis) -> Claim:
    qjl = a.qjl
    ratio = qjl["qjl_mse_split"] / qjl["qjl_mse_single"]
    return Claim(
        id=model_claim_id("qjl-outlier-sketch-smollm2", a.model),
        claim="Sketching the outlier channels separately (their own sketch and norm) lowers the inner-product "
              "error of QJL on real keys.",
        source="Zandieh, Daliri, Han, QJL, arXiv 2406.03482, §4 (outliers)",
        measurement=(f"{a.name}: mean squared error of Prod(q, k) split / single sketch per layer: "
                     f"{ratio.min():.3f}–{ratio.max():.3f} (median {ratio.median():.3f}) over {len(qjl)} layers; "
                     f"{SIGN_BITS} sign bits per coordinate in both, the split adds one norm per key."),
        data=a.data + f"; the last {QUERY_TOKENS} queries of every head",
        verdict=qjl_outlier_verdict(qjl["qjl_mse_single"].to_numpy(), qjl["qjl_mse_split"].to_numpy(),
                                    a.name.split("-")[0]),
        sample=qjl_outlier_sample(qjl["qjl_mse_single"].to_numpy(), qjl["qjl_mse_split"].to_numpy()),
        details=f"{OUTLIER_CHANNELS} outlier channels (largest mean |k| of the layer), {ROWS_PER_OUTLIER} "
                "sketch rows each, Gaussian rows.")


def model_claims(a: Analysis) -> list[Claim]:
    """Every claim on one model: its outliers (SmolLM2's quoted ranges, or another model's measured), QJL's
    outlier channels, the sphere law after the WHT, and QJL's outlier sketch."""
    outliers = key_outliers_claim(a) if a.model == SMOLLM2 else outliers_measured_claim(a)
    sketch = [] if a.qjl is None or not len(a.qjl) else [qjl_sketch_claim(a)]
    return [outliers, qjl_channels_claim(a), wht_claim(a)] + sketch


def print_summary(a: Analysis) -> None:
    """The per-layer key outliers, the outlier ratios and the KS distances, as the study prints them."""
    print(a.name)
    for row in a.keys:
        print(f"layer {row['layer']:2d} keys: top channels {row['top_channels']}, "
              f"max/median {row['max_over_median']}")
    kr, vr = a.kr, a.vr
    print(f"keys max/median: {kr.min():.2f}–{kr.max():.2f}; values: {vr.min():.2f}–{vr.max():.2f}")
    ks_raw = [float(r["ks_raw"]) for r in a.ks]
    ks_wht = [float(r["ks_wht"]) for r in a.ks]
    print(f"KS to f_d: raw {min(ks_raw):.3f}–{max(ks_raw):.3f}, after WHT {min(ks_wht):.3f}–{max(ks_wht):.3f}")


# ------------------------------------------------------------------------------------------------- the study


class KVAnatomy(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): one sweep over each model's layers, four figures
    per model and four claims per model, a row per missing model and a row comparing the models' verdicts."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__

    def cells(self, scale: str) -> study.Sweeps:
        tokens = SCALE[scale]["tokens"]
        cells = []
        for model in available_models(scale=scale)[0]:
            cap = _capture(tokens, model)  # capture once here (cached on disk), never in parallel workers
            print(f"capture: {cap}", flush=True)
            cells += grid(model=model, layer=list(cap.layers), tokens=tokens, seed=0)
        return {STUDY: (layer_cell, cells)}

    def analyse(self, tables, scale: str) -> Analyses:
        table = tables[STUDY]
        present, missing = available_models(scale=scale)
        out = {}
        for model in present:
            t = table[table["model"] == model]
            k, v = channel_profiles(t)
            d = int(_capture(SCALE[scale]["tokens"], model).metadata["head_dim"])
            qjl = t[t["kind"] == "qjl_outliers"].sort_values("layer")
            out[model] = Analysis(scale, d, k, v, outlier_rows(k, v, model), ks_rows(t, model), qjl, model)
        return Analyses(scale, out, missing)

    def figures(self, tables, a: Analyses) -> None:
        channels, outliers, ks = [], [], []
        for model, m in a.models.items():
            channels += channels_figure(m)
            outliers += m.outliers
            ks += m.ks
            outliers_figure(m)
            wht_figure(tables[STUDY][tables[STUDY]["model"] == model], m)
            print_summary(m)
        plots.write_csv("kv_anatomy_channels", channels)
        plots.write_csv("kv_anatomy_outliers", outliers)
        plots.write_csv("kv_anatomy_ks", ks)
        ks_figure(list(a.models.values()))

    def claims(self, a: Analyses) -> list[Claim]:
        ours = model_claims(a.models[SMOLLM2]) if SMOLLM2 in a.models else []
        theirs = {model: model_claims(m) for model, m in a.models.items() if model != SMOLLM2}
        return ours + per_model_claims(STUDY, ours, theirs, a.missing)

    def definitions(self, a: Analyses) -> dict[str, str]:
        return definitions(a.scale, list(a.models))


def main(argv: list[str] | None = None) -> int:
    return KVAnatomy().main(argv, echo=False)


if __name__ == "__main__":
    sys.exit(main())
