"""How tensor shapes are written in this library's signatures, and the names of the dimensions.

Every function that takes or returns a tensor or an array says its dtype kind and its shape with a
`jaxtyping <https://docs.kidger.site/jaxtyping/>`_ annotation::

    def memit_delta(R: Float[torch.Tensor, "d_out n"], K: Float[torch.Tensor, "d_in n"],
                    C: Float[torch.Tensor, "d_in d_in"], lam: float,
                    kkt_past: Float[torch.Tensor, "d_in d_in"] | None = None
                    ) -> Float64[torch.Tensor, "d_out d_in"]: ...

- The dtype kind is ``Float`` (any floating dtype), ``Float64`` / ``Float32`` where the function
  guarantees that precision, ``Int`` (token ids, positions, indices; ``Int64`` where guaranteed),
  ``Bool`` (masks).
- The array type is ``torch.Tensor`` or ``np.ndarray`` (``torch.Tensor | np.ndarray`` where either is
  accepted). A bare ``torch.Tensor`` or ``np.ndarray`` in a signature is refused by
  ``tests/test_shapes.py``.
- The shape is a string of the names below, separated by spaces; a one-dimensional shape starts with
  a space (``" n"``: otherwise linters read ``"n"`` as a forward reference to a variable ``n``; ruff's
  F722 is switched off for the same reason). Names may be combined arithmetically (``"layers-1"``),
  ``"*shape"`` stands for any leading dimensions (broadcasting), ``" ..."`` for any shape (a mapping
  whose tensors differ in shape).
- A ``C`` that a function takes in several forms has one named union, defined beside the function
  under ``TYPE_CHECKING``: :mod:`moir_lib.editing.base`'s ``CovarianceSource`` (statistics, ``{layer:
  C}`` or ``layer -> C``), :mod:`moir_lib.covariance.diagnostics`' ``CovarianceLike`` and
  :mod:`moir_lib.covariance.mixing`'s ``Component``.
- The annotations are documentation, checked by no one at run time: each module imports ``jaxtyping``
  (and ``torch``/``numpy`` where it otherwise would not) only under ``if TYPE_CHECKING:``, with
  ``from __future__ import annotations``, so importing the library costs nothing more (``import
  jaxtyping`` alone takes ≈ 0.2 s, mostly numpy). A name with the same meaning keeps the same name in
  every module; :data:`DIMENSIONS` lists them, and the test refuses any other.
"""

from __future__ import annotations

__all__ = ["DIMENSIONS"]

#: Every dimension name used in a shape annotation, with what it counts.
DIMENSIONS: dict[str, str] = {
    # widths of the model
    "d_in": "key width: the input of down_proj (W_out), i.e. the MLP intermediate size; C is (d_in, d_in)",
    "d_out": "hidden size: the output of down_proj, the residual stream, the token embeddings",
    "vocab": "vocabulary size (rows of the LM head)",
    "layers": "decoder layers of the model (all of them, not only the edit layers)",
    # editing
    "n": "keys of one edit batch: request groups, one key and one target per group (m in theory.py)",
    "n_past": "keys of the earlier sequential batches (theory.py's K_past)",
    "k": "directions kept: a top-k eigenspace of C, or AlphaEdit's null space",
    # sequences and batches
    "rows": "sequences of a whole token-id matrix (training windows, prompts, samples), cut into batches",
    "batch": "sequences of one forward pass",
    "seq": "positions of a sequence",
    "new": "new tokens per sample (max_new_tokens)",
    "tokens": "key vectors (token positions) flattened over a batch, as CovarianceStats.update takes them",
    "targets": "target tokens flattened over the rows of a batch (the value optimisation's NLL)",
    "templates": "context templates a request is read under (keys are averaged over them)",
    "subject": "tokens of a subject span",
    "noise": "noise samples per corrupted run (causal tracing)",
    "restored": "(row, position) pairs a patched run restores at one module (causal tracing)",
    "candidates": "token ids a rand<k> seed token is drawn from",
    "docs": "documents of a corpus",
    "excluded": "token ids left out of a score (the special tokens, for the NLL)",
    # distributions and the proof check
    "samples": "values of one sample (e.g. per-document NLLs)",
    "samples_q": "values of a second sample, compared with the first",
    "points": "points of an evaluation grid (the KDE grid)",
    "support": "points of a discrete distribution's support (Lemma 2)",
    "d": "width of a generic matrix or feature vector (theory.py's random matrices, Lemma 2's features)",
    "shape": "any leading dimensions, written *shape (broadcasting arguments)",
}
