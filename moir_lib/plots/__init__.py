"""Every figure of the book; plots read tidy tables, never live models.

Each function takes one or more tidy tables (``pandas.DataFrame``, one row per observation, as
written by the library and the notebooks) and returns a ``plotly.graph_objects.Figure``. Colours
come from the single :data:`PALETTE`. :func:`setup_notebook` makes figures render offline (the
notebook renderer embeds plotly.js, so the built HTML book needs no internet).

One module per chapter's figures, on one style:

- :mod:`.style`: the palette, the template, :func:`setup_notebook`;
- :mod:`.proof_check`: chapter 04, fed by :mod:`moir_lib.theory`: :func:`prop1_error_hist`,
  :func:`memit_limit_loglog`, :func:`alphaedit_tau_curve`, :func:`lemma2_ratios`;
- :mod:`.selfgen`: chapter 02 (first tokens and words, seed-strategy shares, domain mixes);
- :mod:`.alignment`: chapter 03 (NLL densities, JSD, the compared C's spectra, angles, coverage);
- :mod:`.editing`: chapters 01 and 05 (degradation, harmonic-mean and task curves, radar, distortion,
  seed ablation, the sample budget of C);
- :mod:`.tracing`: chapter 06 (indirect-effect heat map and layer curve);
- :mod:`.verdicts`: the claims' paired differences (:func:`claims_forest`).
"""

from moir_lib.plots.alignment import (
    C_COLOURS,
    CORPUS_COLOURS,
    REFERENCE_STYLES,
    c_spectra,
    coverage_bars,
    jsd_bars,
    nll_distributions,
    organism_jsd,
    principal_angles_heatmap,
)
from moir_lib.plots.editing import (
    EDIT_C_COLOURS,
    EDIT_C_NAMES,
    EDIT_TASKS,
    budget_curve,
    edit_distortion_bars,
    edit_domain_degradation,
    edit_hm_curves,
    edit_radar,
    edit_strategy_ablation,
    edit_task_curves,
)
from moir_lib.plots.proof_check import (
    alphaedit_tau_curve,
    lemma2_ratios,
    memit_limit_loglog,
    prop1_error_hist,
)
from moir_lib.plots.selfgen import (
    DOMAIN_COLOURS,
    STRATEGY_COLOURS,
    domain_mix_bars,
    first_token_bars,
    first_words_bars,
    organism_shares,
    seed_strategy_shares,
)
from moir_lib.plots.style import PALETTE, TEMPLATE_NAME, setup_notebook
from moir_lib.plots.tracing import tracing_heatmap, tracing_layer_curve
from moir_lib.plots.verdicts import claims_forest

__all__ = [
    "PALETTE",
    "TEMPLATE_NAME",
    "setup_notebook",
    "alphaedit_tau_curve",
    "lemma2_ratios",
    "memit_limit_loglog",
    "prop1_error_hist",
    "tracing_heatmap",
    "tracing_layer_curve",
    "DOMAIN_COLOURS",
    "STRATEGY_COLOURS",
    "domain_mix_bars",
    "first_token_bars",
    "first_words_bars",
    "organism_shares",
    "seed_strategy_shares",
    "C_COLOURS",
    "CORPUS_COLOURS",
    "REFERENCE_STYLES",
    "c_spectra",
    "coverage_bars",
    "jsd_bars",
    "nll_distributions",
    "organism_jsd",
    "principal_angles_heatmap",
    "EDIT_C_COLOURS",
    "EDIT_C_NAMES",
    "EDIT_TASKS",
    "budget_curve",
    "edit_distortion_bars",
    "edit_domain_degradation",
    "edit_hm_curves",
    "edit_radar",
    "edit_strategy_ablation",
    "edit_task_curves",
    "claims_forest",
]
