"""Distributional analyses of Appendix D: per-document NLL (eq. (nll)), KDE-grid Jensen–Shannon
between NLL distributions (Fig. 11b), and token statistics of self-generated samples (Fig. 10).

- :mod:`.nll`: :func:`document_nll` — mean next-token cross-entropy per document over contiguous windows
  (:class:`NLLSettings`);
- :mod:`.divergence`: :func:`jensen_shannon`, :func:`jsd_table`;
- :mod:`.tokens`: first-token / first-words tables, chat-tag shares, the pocket domain classifier.
"""

from moir_lib.analysis.divergence import JSDResult, jensen_shannon, jsd_table, kde_on_grid
from moir_lib.analysis.nll import NLLSettings, default_window, document_nll
from moir_lib.analysis.tokens import (
    chat_tag_shares,
    classify_domain,
    domain_mix,
    first_token_table,
    first_words_table,
    top1_share,
)

__all__ = [
    "JSDResult",
    "jensen_shannon",
    "jsd_table",
    "kde_on_grid",
    "NLLSettings",
    "default_window",
    "document_nll",
    "chat_tag_shares",
    "classify_domain",
    "domain_mix",
    "first_token_table",
    "first_words_table",
    "top1_share",
]
