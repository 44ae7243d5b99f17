"""Figures of the NLL/JSD chapter (``notebooks/03_nll_jsd``: Fig. 3, Fig. 11, Fig. 7), fed by
:mod:`moir_lib.analysis.alignment`: NLL densities, Jensen-Shannon divergences, and the compared C's
spectra, principal angles and domain coverage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moir_lib.plots.selfgen import DOMAIN_COLOURS
from moir_lib.plots.style import PALETTE, _fig, _require, _subplots

#: Corpora of the NLL figure: Moir red, Moir-bos orange, wiki blue, the other domains as above.
CORPUS_COLOURS: dict[str, str] = {"moir": PALETTE["moir"], "moir-bos": PALETTE["bos"],
                                  "wiki": PALETTE["wiki"], "web": DOMAIN_COLOURS["web"],
                                  "code": DOMAIN_COLOURS["code"], "math": DOMAIN_COLOURS["math"]}


#: The compared covariances (Fig. 7): the palette's four roles.
C_COLOURS: dict[str, str] = {"C_Wiki": PALETTE["wiki"], "C_Moir": PALETTE["moir"],
                             "C_Moir-bos": PALETTE["bos"], "C_Oracle": PALETTE["oracle"]}


#: The two reference distributions: black, dotted (pretraining) and solid (post-training), as in Fig. 3.
REFERENCE_STYLES: dict[str, dict[str, object]] = {"pretraining": {"color": "#111111", "dash": "dot"},
                                                  "post-training": {"color": "#111111", "dash": "solid"}}


def nll_distributions(nll: pd.DataFrame, corpora: Sequence[str] | None = None, points: int = 512,
                      title: str | None = None) -> go.Figure:
    """Fig. 3 / Fig. 11a: per-document NLL densities (Gaussian KDE, Scott bandwidth, on one grid over the
    pooled P0.5-P99.5 of the shown values), the references in black (pretraining dotted, post-training
    solid).

    ``nll``: ``corpus, nll`` (:func:`moir_lib.analysis.alignment.nll_table`); ``corpora``: which to draw
    besides the references (default all).
    """
    from scipy.stats import gaussian_kde

    _require(nll, ["corpus", "nll"], "nll_distributions")
    names = list(dict.fromkeys(nll["corpus"]))
    wanted = corpora if corpora is not None else names
    shown = [c for c in wanted if c in names and c not in REFERENCE_STYLES]
    shown += [r for r in REFERENCE_STYLES if r in names]
    data = nll[nll["corpus"].isin(shown)]
    values = data["nll"].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if values.size < 2:
        raise ValueError("nll_distributions: need at least two finite NLL values")
    lo, hi = np.percentile(values, [0.5, 99.5])
    grid = np.linspace(lo, hi, points)
    fig = _fig(title or "Per-document NLL under the model (eq. (nll))", "NLL (nats per token)", "density")
    for name in shown:
        v = data.loc[data["corpus"] == name, "nll"].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if v.size < 2 or np.ptp(v) == 0:
            continue
        density = gaussian_kde(v, bw_method="scott")(grid)
        style = REFERENCE_STYLES.get(name)
        line = ({"color": style["color"], "dash": style["dash"], "width": 2.5} if style else
                {"color": CORPUS_COLOURS.get(name, PALETTE["neutral"]), "width": 2})
        fig.add_scatter(x=grid, y=density, mode="lines", name=f"{name} (n={v.size})", line=line,
                        hovertemplate="NLL %{x:.2f}: %{y:.3f}<extra>" + name + "</extra>")
    return fig


def jsd_bars(jsd: pd.DataFrame, value: str = "jsd", title: str | None = None) -> go.Figure:
    """Fig. 11b as bars: each corpus's Jensen–Shannon ``value`` (``jsd``: divergence, or ``distance``)
    against the pretraining (dotted outline) and post-training (solid) references, closest to
    post-training on top (``jsd``: :func:`moir_lib.analysis.alignment.jsd` rows)."""
    _require(jsd, ["corpus", "reference", value], "jsd_bars")
    post = jsd[jsd["reference"] == "post-training"].sort_values(value)
    order = list(post["corpus"]) + [c for c in dict.fromkeys(jsd["corpus"]) if c not in set(post["corpus"])]
    label = "Jensen–Shannon divergence (nats)" if value == "jsd" else f"Jensen–Shannon {value}"
    fig = _fig(title or "Distance of each corpus to the references (Fig. 11b)", label, "", barmode="group")
    for ref in ("pretraining", "post-training"):
        df = jsd[jsd["reference"] == ref].set_index("corpus").reindex(order)
        colours = [CORPUS_COLOURS.get(c, PALETTE["neutral"]) for c in order]
        solid = ref == "post-training"
        fig.add_bar(y=order, x=df[value], orientation="h", name=f"vs {ref}",
                    marker={"color": colours if solid else "rgba(255,255,255,0)",
                            "line": {"color": colours, "width": 2},
                            "pattern": {"shape": "" if solid else "."}},
                    hovertemplate="%{y}: %{x:.4f}<extra>vs " + ref + "</extra>")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(320, 100 + 50 * len(order)))
    return fig


def c_spectra(spectrum: pd.DataFrame, points: int | None = None, title: str | None = None) -> go.Figure:
    """Eigen-spectra of the compared C's: the share of the trace per eigenvalue (log scale) against its
    index, one panel per layer (``spectrum``: :class:`moir_lib.covariance.Diagnosis` ``spectrum``)."""
    _require(spectrum, ["name", "layer", "index", "share"], "c_spectra")
    layers = sorted(spectrum["layer"].unique(), key=lambda x: (x is None, x))
    fig = _subplots(1, len(layers), title or "Eigen-spectra of C (share of the trace)",
                    subplot_titles=[f"layer {layer}" for layer in layers], shared_yaxes=True)
    for c, layer in enumerate(layers, 1):
        for name in dict.fromkeys(spectrum["name"]):
            df = spectrum[(spectrum["name"] == name) & (spectrum["layer"] == layer)].sort_values("index")
            if points is not None:
                df = df.head(points)
            df = df[df["share"] > 0]
            fig.add_scatter(x=df["index"] + 1, y=df["share"], mode="lines", name=name, legendgroup=name,
                            showlegend=c == 1,
                            line={"color": C_COLOURS.get(name, PALETTE["neutral"]), "width": 2},
                            hovertemplate="λ_%{x}: %{y:.2e}<extra>" + name + "</extra>", row=1, col=c)
        fig.update_xaxes(type="log", title_text="eigenvalue index", row=1, col=c)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title_text="λᵢ / tr C", row=1, col=1)
    return fig


def principal_angles_heatmap(angles: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Mean cosine of the principal angles between the top-k eigenspaces of each pair of C's, averaged
    over layers (1: the same subspace; ``angles``: :func:`moir_lib.analysis.alignment.angle_summary`)."""
    _require(angles, ["a", "b", "mean_cos"], "principal_angles_heatmap")
    names = list(dict.fromkeys(list(angles["a"]) + list(angles["b"])))
    mean = angles.groupby(["a", "b"])["mean_cos"].mean()
    z = np.eye(len(names))
    for (a, b), v in mean.items():
        i, j = names.index(a), names.index(b)
        z[i, j] = z[j, i] = v
    k = f" (k = {int(angles['k'].iloc[0])})" if "k" in angles and len(angles) else ""
    fig = _fig(title or f"Do the C's protect the same directions? Mean cos of principal angles{k}", "", "")
    fig.add_heatmap(z=z, x=names, y=names, zmin=0, zmax=1, colorscale="Greys", colorbar={"title": "mean cos"},
                    text=np.round(z, 2), texttemplate="%{text}",
                    hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>")
    fig.update_yaxes(autorange="reversed", scaleanchor="x")
    fig.update_layout(height=480)
    return fig


def coverage_bars(coverage: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Fig. 7 ("knowledge coverage"): the share of each domain's key energy inside each C's top-k
    eigenspace, averaged over layers, grouped by domain; the dashed line is a random k-dimensional subspace
    (``k/d``). ``coverage``: :class:`moir_lib.covariance.Diagnosis` ``coverage`` (``name, domain, layer, k,
    coverage, random``)."""
    _require(coverage, ["name", "domain", "coverage"], "coverage_bars")
    mean = coverage.groupby(["name", "domain"], sort=False)["coverage"].mean()
    domains = list(dict.fromkeys(coverage["domain"]))
    k = f" (top-{int(coverage['k'].iloc[0])} eigenspace)" if "k" in coverage and len(coverage) else ""
    fig = _fig(title or f"Knowledge coverage: which domains does each C protect?{k}", "domain",
               "share of the domain's key energy covered", barmode="group")
    for name in dict.fromkeys(coverage["name"]):
        fig.add_bar(x=domains, y=[mean.get((name, d), np.nan) for d in domains], name=name,
                    marker_color=C_COLOURS.get(name, PALETTE["neutral"]),
                    hovertemplate="%{x}: %{y:.3f}<extra>" + name + "</extra>")
    if "random" in coverage and len(coverage):
        fig.add_hline(y=float(coverage["random"].mean()), line_dash="dash", line_color=PALETTE["neutral"],
                      annotation_text="random subspace (k/d)", annotation_position="top left")
    fig.update_yaxes(range=[0, 1])
    return fig


def organism_jsd(per_organism: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Each pocket organism's JSD differences to post-training with their 95 % intervals, one marker per
    organism beside each other (``per_organism``: :func:`moir_lib.chapters.nll_jsd.organism_jsd`); the
    paper's side of zero is the sign in the label's ``side``."""
    _require(per_organism, ["organism", "difference", "value", "lo", "hi"], "organism_jsd")
    fig = _fig(title or "Every organism: differences of JSD to post-training", "", "JSD difference")
    shades = ["#3B3B3B", "#8C8C8C", "#BDBDBD", "#5B7DB1", "#9BB3D9"]
    for i, (k, g) in enumerate(per_organism.groupby("organism", sort=True)):
        fig.add_scatter(x=g["difference"], y=g["value"], mode="markers", name=f"organism {k}",
                        marker={"color": shades[i % len(shades)], "size": 10},
                        error_y={"type": "data", "symmetric": False, "array": g["hi"] - g["value"],
                                 "arrayminus": g["value"] - g["lo"]},
                        hovertemplate="%{x}: %{y:.4f}<extra>organism " + str(k) + "</extra>")
    fig.add_hline(y=0, line_dash="dot", line_color="#888888")
    fig.update_layout(scattermode="group")
    return fig
