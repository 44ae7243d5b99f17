"""Causal tracing for target-layer selection (appendix C.4; Meng et al., 2022, "ROME").

Which layers carry a fact from the subject to the answer? For each prompt
``(prompt, subject, answer)`` three kinds of forward pass are run:

1. **clean run**: :math:`P_\\text{clean}` = p(first token of ``" " + answer`` | prompt) at the
   last position;
2. **corrupted runs**: Gaussian noise :math:`\\mathcal N(0, \\sigma^2 I)` is added to the
   embeddings of the *subject tokens*, :math:`\\sigma` = ``noise_scale`` (paper: 3) × the
   embedding std; ``n_noise`` seeded samples, :math:`P_\\text{corrupted}` is their mean;
3. **restored runs**: the corrupted run with the hidden state of one (layer ℓ, position t) — the
   residual stream *output* of decoder layer ℓ — put back to its clean value,
   :math:`P_\\text{restored}(\\ell, t)`, averaged over the *same* noise samples (a paired design).

The indirect effect (eq. IE of appendix C.4) is

.. math:: \\mathrm{IE}(\\ell, t) = \\frac{P_\\text{restored}(\\ell, t) - P_\\text{corrupted}}
          {P_\\text{clean} - P_\\text{corrupted}},

and a prompt is *valid* when :math:`P_\\text{clean} - P_\\text{corrupted} > 0.01`
(:data:`VALID_MARGIN`). Valid prompts are aligned into 18 slots — 5 positions before the
subject, the first, middle and last subject token (as ROME does; a one-token subject fills
first and last, interior tokens are averaged into "middle" within each prompt), and 10
positions after the last subject token — and averaged per (layer, slot). The layer curve at
the last subject token gives the top-10 table and the contiguous window of the profile's
length (``len(edit_layers)``) with the largest summed IE: the edit layers.

Choices (documented where the paper is silent):

* **Noise std.** ``noise_std="subject"`` (default) takes the std over all entries of the
  embedding rows of the subject tokens of the traced prompts, as they are tokenised in the
  prompts — ROME's ``collect_embedding_std`` over the subjects of its knowns file;
  ``"matrix"`` takes the std of the whole embedding matrix; a number is taken as that std.
* **Noise seeds.** Each prompt draws its own ``(n_noise, n_subject_tokens, d)`` noise from
  ``(seed, prompt index)``; the corrupted and every restored run of that prompt share it.
* **Answer token.** The token that follows the prompt when ``prompt + " " + answer`` is
  tokenised (ROME's targets carry a leading space); the probability of the correct answer is
  traced, not the model's own top token (ROME traces the latter after checking it is correct).
* **Sites.** ``kind="hidden"`` restores the residual output of one layer (the paper's tables);
  ``kind="mlp"`` restores the MLP output of a ``window`` of layers around ℓ (ROME's MLP trace).
* **Batching.** Restored runs of one prompt are batched across (layer, position) jobs, each job
  taking ``n_noise`` rows; hooks on the embedding and on every layer patch their own rows.

In a causal model the runs have two exact properties the tests check: restoring any layer at
a position *before* the subject changes nothing (IE = 0), and restoring the last layer at the
last position reproduces the clean run (IE = 1).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from moir_lib.timings import timed

if TYPE_CHECKING:
    import torch
    from jaxtyping import Bool, Float, Int
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.profiles import Profile

__all__ = [
    "AFTER",
    "BEFORE",
    "LAST_SUBJECT",
    "SLOT_LABELS",
    "VALID_MARGIN",
    "TracePrompt",
    "TraceResult",
    "TraceSettings",
    "PAPER_TRACE",
    "aligned_table",
    "align_positions",
    "best_window",
    "indirect_effect",
    "knowns_prompts",
    "pocket_prompts",
    "prompts_for",
    "rewrite_edit_layers",
    "subject_token_range",
    "trace",
    "trace_profile",
]

log = logging.getLogger(__name__)

#: Validity filter of appendix C.4: keep a prompt when P_clean - P_corrupted exceeds this.
VALID_MARGIN = 0.01
#: Positions kept before the first and after the last subject token.
BEFORE, AFTER = 5, 10
#: The 18 aligned slots, left to right.
SLOT_LABELS: tuple[str, ...] = (
    *(f"-{k}" for k in range(BEFORE, 0, -1)),
    "first subject",
    "middle subject",
    "last subject",
    *(f"+{k}" for k in range(1, AFTER + 1)),
)
FIRST_SUBJECT, MIDDLE_SUBJECT, LAST_SUBJECT = BEFORE, BEFORE + 1, BEFORE + 2

Kind = Literal["hidden", "mlp"]


@dataclasses.dataclass(frozen=True)
class TraceSettings:
    """How :func:`trace` corrupts and restores (module docstring): ``n_noise`` noise samples per prompt
    (ROME: 10) of σ = ``noise_scale`` (paper: 3) × ``noise_std`` (``"subject"``, ``"matrix"`` or a number),
    drawn from ``seed``; ``kind`` ``"hidden"`` restores one layer's residual output, ``"mlp"`` the MLP
    outputs of ``window`` layers around it; ``batch_size`` bounds the rows of one restored forward pass."""

    n_noise: int = 10
    noise_scale: float = 3.0
    seed: int = 0
    noise_std: str | float = "subject"
    kind: Kind = "hidden"
    window: int = 10
    batch_size: int = 256


#: The paper's tracing (ROME's 10 noise samples at 3 × the subject embeddings' std, hidden states).
PAPER_TRACE = TraceSettings()


class TracePrompt(NamedTuple):
    """One fact to trace: ``subject`` must occur in ``prompt``; ``answer`` follows it (no leading space)."""

    prompt: str
    subject: str
    answer: str


# ----------------------------------------------------------------------------- pure pieces


def indirect_effect(p_restored: float | Float[np.ndarray, "*shape"],
                    p_clean: float | Float[np.ndarray, "*shape"],
                    p_corrupted: float | Float[np.ndarray, "*shape"]) -> float | Float[np.ndarray, "*shape"]:
    """IE = (P_restored - P_corrupted) / (P_clean - P_corrupted); NaN where the denominator is 0."""
    num = np.asarray(p_restored, dtype=float) - np.asarray(p_corrupted, dtype=float)
    den = np.asarray(p_clean, dtype=float) - np.asarray(p_corrupted, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)
    return out if out.ndim else float(out)


def is_valid(p_clean: float | Float[np.ndarray, "*shape"], p_corrupted: float | Float[np.ndarray, "*shape"],
             margin: float = VALID_MARGIN) -> np.bool_ | Bool[np.ndarray, "*shape"]:
    """The validity filter of appendix C.4: ``P_clean - P_corrupted > margin``."""
    return np.asarray(p_clean, dtype=float) - np.asarray(p_corrupted, dtype=float) > margin


def align_positions(n_tokens: int, start: int, end: int, before: int = BEFORE,
                    after: int = AFTER) -> list[tuple[int, int]]:
    """``(slot, position)`` pairs mapping one prompt's positions into the aligned window.

    The subject occupies positions ``start .. end - 1`` of a sequence of ``n_tokens``. Slots
    ``0 .. before-1`` hold the ``before`` positions preceding the subject (slot ``before - 1``
    is the token just before it), then first / middle / last subject token, then the ``after``
    positions following the last subject token. A one-token subject gives its position to both
    "first" and "last"; the interior tokens of a longer subject all map to "middle" (averaged
    by the caller); positions outside the window are dropped.
    """
    if not 0 <= start < end <= n_tokens:
        raise ValueError(f"subject span [{start}, {end}) is not inside a sequence of {n_tokens} tokens")
    pairs: list[tuple[int, int]] = []
    for pos in range(max(0, start - before), start):
        pairs.append((before - (start - pos), pos))
    pairs.append((before, start))
    pairs.extend((before + 1, pos) for pos in range(start + 1, end - 1))
    pairs.append((before + 2, end - 1))
    for pos in range(end, min(n_tokens, end + after)):
        pairs.append((before + 3 + (pos - end), pos))
    return pairs


def best_window(values: Sequence[float], length: int) -> tuple[int, float]:
    """``(start, total)`` of the contiguous run of ``length`` entries with the largest sum.

    Ties go to the earliest window. NaN entries count as 0 (a layer without data adds nothing).
    """
    arr = np.nan_to_num(np.asarray(values, dtype=float), nan=0.0)
    if length < 1:
        raise ValueError(f"window length must be >= 1, got {length}")
    if length > arr.size:
        raise ValueError(f"window of {length} layers does not fit in {arr.size} layers")
    sums = np.convolve(arr, np.ones(length), mode="valid")
    start = int(np.argmax(sums))
    return start, float(sums[start])


def aligned_table(scores: pd.DataFrame, prompts: pd.DataFrame, only_valid: bool = True) -> pd.DataFrame:
    """Mean IE per (layer, aligned slot) over prompts: columns ``layer, slot, label, ie, sem, n``.

    ``scores``: one row per (prompt_id, layer, position) with ``ie``; ``prompts``: one row per
    prompt with ``prompt_id, n_tokens, subject_start, subject_end, valid``. Each prompt weighs
    once per slot (its interior subject tokens are averaged first).
    """
    keep = prompts[prompts["valid"]] if only_valid else prompts
    rows = [(pid, slot, pos) for pid, n, s, e in
            keep[["prompt_id", "n_tokens", "subject_start", "subject_end"]].itertuples(index=False)
            for slot, pos in align_positions(int(n), int(s), int(e))]
    cols = ["layer", "slot", "label", "ie", "sem", "n"]
    if not rows:
        return pd.DataFrame(columns=cols)
    mapping = pd.DataFrame(rows, columns=["prompt_id", "slot", "position"])
    merged = mapping.merge(scores[["prompt_id", "layer", "position", "ie"]], on=["prompt_id", "position"])
    per_prompt = merged.groupby(["prompt_id", "layer", "slot"], as_index=False)["ie"].mean()
    agg = per_prompt.groupby(["layer", "slot"])["ie"].agg(["mean", "std", "count"]).reset_index()
    agg = agg.rename(columns={"mean": "ie", "count": "n"})
    agg["sem"] = agg["std"].fillna(0.0) / np.sqrt(agg["n"])
    agg["label"] = [SLOT_LABELS[s] for s in agg["slot"]]
    return agg[cols].sort_values(["layer", "slot"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- tokens


def _find_subject_chars(prompt: str, subject: str, index: int) -> tuple[int, int]:
    at = prompt.find(subject)
    if at < 0:
        raise ValueError(f"prompt {index}: subject {subject!r} does not occur in prompt {prompt!r}")
    return at, at + len(subject)


def subject_token_range(tokenizer: PreTrainedTokenizerBase, prompt: str, subject: str,
                        index: int = 0) -> tuple[list[int], int, int]:
    """Token ids of ``prompt`` (no special tokens) and the span ``[start, end)`` of its subject.

    The subject is its first occurrence in the prompt; a token belongs to it when its
    characters overlap the subject's. Fast tokenizers use offsets; others fall back to
    ROME's decode-and-search.
    """
    c0, c1 = _find_subject_chars(prompt, subject, index)
    try:
        enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    except (NotImplementedError, TypeError, KeyError):
        ids, offsets = list(tokenizer(prompt, add_special_tokens=False)["input_ids"]), None
    if offsets is None:  # ROME's find_token_range: decode tokens and locate the subject
        pieces = [tokenizer.decode([t]) for t in ids]
        pos, offsets = 0, []
        for piece in pieces:
            offsets.append((pos, pos + len(piece)))
            pos += len(piece)
        c0, c1 = _find_subject_chars("".join(pieces), subject, index)
    inside = [i for i, (a, b) in enumerate(offsets) if a < c1 and b > c0]
    if not inside:
        raise ValueError(f"prompt {index}: no token of {prompt!r} covers subject {subject!r}")
    return ids, inside[0], inside[-1] + 1


def _answer_token(tokenizer: PreTrainedTokenizerBase, prompt: str, prompt_ids: list[int], answer: str,
                  index: int) -> int:
    if not answer.strip():
        raise ValueError(f"prompt {index}: empty answer")
    full = list(tokenizer(f"{prompt} {answer.lstrip()}", add_special_tokens=False)["input_ids"])
    n = len(prompt_ids)
    if len(full) > n and full[:n] == prompt_ids:
        return int(full[n])
    alone = list(tokenizer(f" {answer.lstrip()}", add_special_tokens=False)["input_ids"])
    return int(alone[0])


@dataclasses.dataclass(frozen=True)
class _Prepared:
    ids: list[int]  # with BOS when the model has one
    start: int  # subject span [start, end) in ``ids``
    end: int
    answer_id: int


def _prepare(adapter: Any, tokenizer: PreTrainedTokenizerBase,
             prompts: Sequence[TracePrompt]) -> list[_Prepared]:
    out = []
    bos = adapter.bos_token_id
    for i, p in enumerate(prompts):
        ids, s, e = subject_token_range(tokenizer, p.prompt, p.subject, i)
        answer_id = _answer_token(tokenizer, p.prompt, ids, p.answer, i)
        shift = 1 if bos is not None else 0
        full = [bos, *ids] if bos is not None else ids
        out.append(_Prepared(full, s + shift, e + shift, answer_id))
    return out


def _as_prompts(prompts: Iterable[Any]) -> list[TracePrompt]:
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, TracePrompt):
            out.append(p)
            continue
        try:
            prompt, subject, answer = p
        except (TypeError, ValueError):
            raise ValueError(f"prompt {i}: expected (prompt, subject, answer), got {p!r}") from None
        if not all(isinstance(x, str) for x in (prompt, subject, answer)):
            raise ValueError(f"prompt {i}: prompt, subject and answer must be strings, got {p!r}")
        out.append(TracePrompt(prompt, subject, answer))
    if not out:
        raise ValueError("no prompts to trace")
    return out


# ----------------------------------------------------------------------------- forward passes


class _Patcher:
    """Forward hooks: noise on subject embeddings; capture or restore outputs of traced modules."""

    def __init__(self, embed: Any, modules: Sequence[Any]) -> None:
        self.noise: Float[torch.Tensor, "noise subject d_out"] | None = None
        self.noise_rows: Int[torch.Tensor, " batch"] | None = None  # which sample each row gets
        self.span = (0, 0)
        self.capture: dict[int, Float[torch.Tensor, "seq d_out"]] | None = None
        self.clean: dict[int, Float[torch.Tensor, "seq d_out"]] = {}  # by module index
        #: by module index: the (rows, positions) restored
        self.patch: dict[int, tuple[Int[torch.Tensor, " restored"], Int[torch.Tensor, " restored"]]] = {}
        self.handles = [embed.register_forward_hook(self._embed_hook)]
        for m, module in enumerate(modules):
            self.handles.append(module.register_forward_hook(self._module_hook(m)))

    def _embed_hook(self, _module: Any, _inputs: Any, out: Float[torch.Tensor, "batch seq d_out"]
                    ) -> Float[torch.Tensor, "batch seq d_out"] | None:
        if self.noise is None:
            return None
        s, e = self.span
        out = out.clone()
        out[:, s:e] += self.noise[self.noise_rows].to(out.dtype)
        return out

    def _module_hook(self, m: int):
        def hook(_module: Any, _inputs: Any, out: Any) -> Any:
            h = out[0] if isinstance(out, tuple) else out
            if self.capture is not None:
                self.capture[m] = h[0].detach().clone()
            if m in self.patch:
                rows, pos = self.patch[m]
                h = h.clone()
                h[rows, pos] = self.clean[m][pos].to(h.dtype)
                return (h, *out[1:]) if isinstance(out, tuple) else h
            return None

        return hook

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _traced_modules(model: Any, adapter: Any, kind: Kind) -> list[Any]:
    if kind == "hidden":
        return list(adapter.layers)
    if kind == "mlp":
        names = [adapter.key_module_name(layer).rsplit(".", 1)[0] for layer in range(adapter.n_layers)]
        return [model.get_submodule(n) for n in names]
    raise ValueError(f"unknown kind {kind!r}: use 'hidden' (residual stream) or 'mlp'")


def _window_layers(layer: int, n_layers: int, kind: Kind, window: int) -> list[int]:
    """Modules restored for a job at ``layer``: itself (hidden), or ROME's window of MLPs around it."""
    if kind == "hidden":
        return [layer]
    return list(range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2))))


def _noise_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def embedding_std(adapter: Any, prepared: Sequence[_Prepared], source: str | float) -> float:
    """σ before scaling: std of subject-token embedding rows (``"subject"``), of the whole matrix
    (``"matrix"``), or a given number."""
    import torch

    if not isinstance(source, str):
        value = float(source)
        if not value > 0:
            raise ValueError(f"noise_std must be > 0, got {source!r}")
        return value
    weight = adapter.embed_tokens.weight
    with torch.no_grad():
        if source == "matrix":
            return float(weight.float().std())
        if source == "subject":
            ids = [t for p in prepared for t in p.ids[p.start:p.end]]
            rows = adapter.embed_tokens(torch.tensor(ids, device=weight.device))
            return float(rows.float().std())
    raise ValueError(f"noise_std {source!r}: use 'subject', 'matrix' or a number")


class _Runner:
    """The three kinds of run for one prompt, with hooks installed once for the whole trace."""

    def __init__(self, model: Any, adapter: Any, kind: Kind, window: int, n_noise: int,
                 batch_size: int) -> None:
        self.model, self.adapter, self.kind, self.window, self.n_noise = model, adapter, kind, window, n_noise
        self.n_layers = adapter.n_layers
        self.device = adapter.embed_tokens.weight.device
        self.jobs_per_batch = max(1, batch_size // n_noise)
        params = inspect.signature(model.forward).parameters
        self.keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.patcher = _Patcher(adapter.embed_tokens, _traced_modules(model, adapter, kind))

    def _probs(self, ids: Int[torch.Tensor, "1 seq"], rows: int, answer_id: int
               ) -> Float[torch.Tensor, " batch"]:
        """p(answer) at the last position for ``rows`` copies of ``ids``."""
        import torch

        logits = self.model(input_ids=ids.expand(rows, -1), use_cache=False, **self.keep_kw).logits[:, -1]
        return torch.softmax(logits.float(), dim=-1)[:, answer_id]

    def run(self, prep: _Prepared, sigma: float, noise_seed: int
            ) -> tuple[float, float, int, Float[np.ndarray, "layers seq"]]:
        """``(p_clean, p_corrupted, clean top-1 id, p_restored)`` for one prompt."""
        import torch

        pt, device, n_noise = self.patcher, self.device, self.n_noise
        ids = torch.tensor(prep.ids, device=device)[None]
        n_tok = ids.shape[1]
        # 1. clean run: capture every traced module's output
        pt.noise, pt.patch, pt.capture = None, {}, {}
        logits = self.model(input_ids=ids, use_cache=False, **self.keep_kw).logits[0, -1]
        pt.clean, pt.capture = pt.capture, None
        clean = torch.softmax(logits.float(), dim=-1)
        p_clean, top = float(clean[prep.answer_id]), int(clean.argmax())
        # 2. corrupted runs; the same noise serves every restored run of this prompt
        gen = torch.Generator().manual_seed(noise_seed)
        d = self.adapter.embed_tokens.weight.shape[1]
        pt.noise = (sigma * torch.randn(n_noise, prep.end - prep.start, d, generator=gen)).to(device)
        pt.span = (prep.start, prep.end)
        pt.noise_rows = torch.arange(n_noise, device=device)
        p_corrupted = float(self._probs(ids, n_noise, prep.answer_id).mean())
        # 3. restored runs, batched over (layer, position) jobs of n_noise rows each
        jobs = [(layer, pos) for layer in range(self.n_layers) for pos in range(n_tok)]
        p_restored = np.empty(len(jobs))
        for b in range(0, len(jobs), self.jobs_per_batch):
            chunk = jobs[b:b + self.jobs_per_batch]
            patch: dict[int, tuple[list[int], list[int]]] = {}
            for j, (layer, pos) in enumerate(chunk):
                for m in _window_layers(layer, self.n_layers, self.kind, self.window):
                    rows, positions = patch.setdefault(m, ([], []))
                    rows.extend(range(j * n_noise, (j + 1) * n_noise))
                    positions.extend([pos] * n_noise)
            pt.patch = {m: (torch.tensor(r, device=device), torch.tensor(p, device=device))
                        for m, (r, p) in patch.items()}
            pt.noise_rows = torch.arange(len(chunk) * n_noise, device=device) % n_noise
            probs = self._probs(ids, len(chunk) * n_noise, prep.answer_id)
            p_restored[b:b + len(chunk)] = probs.view(len(chunk), n_noise).mean(1).double().cpu().numpy()
        pt.noise, pt.patch, pt.clean = None, {}, {}
        return p_clean, p_corrupted, top, p_restored.reshape(self.n_layers, n_tok)

    def close(self) -> None:
        self.patcher.close()


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class TraceResult:
    """What :func:`trace` measured, as tidy tables.

    ``prompts``: one row per prompt — ``prompt_id, prompt, subject, answer, answer_token,
    n_tokens, subject_start, subject_end`` (token span incl. BOS), ``p_clean, p_corrupted,
    top_token, correct`` (the clean top-1 is the answer), ``valid``. ``scores``: one row per
    (prompt_id, layer, position) — ``token, p_restored, ie``.
    """

    prompts: pd.DataFrame
    scores: pd.DataFrame
    n_layers: int
    noise_std: float
    noise_scale: float
    n_noise: int
    seed: int
    kind: str
    seconds: float
    model_name: str = ""

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    @property
    def n_valid(self) -> int:
        return int(self.prompts["valid"].sum())

    def aligned(self) -> pd.DataFrame:
        """Mean IE per (layer, slot) over valid prompts (:func:`aligned_table`)."""
        return aligned_table(self.scores, self.prompts)

    def layer_curve(self, slot: int = LAST_SUBJECT) -> pd.DataFrame:
        """IE per layer at one aligned slot (default the last subject token): ``layer, ie, sem, n``.

        Every layer has a row; ``ie`` is NaN where no valid prompt fills the slot.
        """
        aligned = self.aligned()
        curve = aligned[aligned["slot"] == slot][["layer", "ie", "sem", "n"]]
        full = pd.DataFrame({"layer": range(self.n_layers)}).merge(curve, on="layer", how="left")
        return full.astype({"ie": float, "sem": float}).reset_index(drop=True)

    def window(self, length: int) -> list[int]:
        """The contiguous ``length`` layers maximising summed IE at the last subject token.

        Empty when no prompt is valid (there is nothing to choose from).
        """
        curve = self.layer_curve()
        if curve["ie"].isna().all():
            if length > self.n_layers:
                raise ValueError(f"window of {length} layers does not fit in {self.n_layers} layers")
            return []
        start, _ = best_window(curve["ie"].to_numpy(), length)
        return list(range(start, start + length))

    def top_layers(self, k: int = 10, window: Sequence[int] = ()) -> pd.DataFrame:
        """The paper's top-10 table: ``rank, layer, ie, in_window`` by IE at the last subject token."""
        curve = self.layer_curve().dropna(subset=["ie"])
        curve = curve.sort_values("ie", ascending=False, kind="stable").head(k)
        table = curve[["layer", "ie"]].reset_index(drop=True)
        table.insert(0, "rank", range(1, len(table) + 1))
        table["in_window"] = table["layer"].isin(list(window))
        return table

    def last_token_curve(self) -> pd.DataFrame:
        """IE per layer at each valid prompt's *last* token (ROME's "late site"): ``layer, ie, sem, n``."""
        df = self.scores.merge(self.prompts[["prompt_id", "n_tokens", "valid"]], on="prompt_id")
        df = df[df["valid"] & (df["position"] == df["n_tokens"] - 1)]
        agg = df.groupby("layer")["ie"].agg(["mean", "std", "count"]).reset_index()
        agg = agg.rename(columns={"mean": "ie", "count": "n"})
        agg["sem"] = agg["std"].fillna(0.0) / np.sqrt(agg["n"])
        layers = pd.DataFrame({"layer": range(self.n_layers)})
        full = layers.merge(agg[["layer", "ie", "sem", "n"]], on="layer", how="left")
        return full.astype({"ie": float, "sem": float})

    def max_effect_before_subject(self) -> float:
        """max |P_restored - P_corrupted| over positions before the subject (every prompt and layer).

        Exactly 0 in a causal model: nothing before the subject sees the noise.
        """
        df = self.scores.merge(self.prompts[["prompt_id", "subject_start", "p_corrupted"]], on="prompt_id")
        before = df[df["position"] < df["subject_start"]]
        return float((before["p_restored"] - before["p_corrupted"]).abs().max()) if len(before) else 0.0


def trace(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Iterable[Any],
          settings: TraceSettings = PAPER_TRACE, *, progress: bool = True) -> TraceResult:
    """Causal trace of ``prompts`` (``(prompt, subject, answer)`` triples) through ``model`` under
    ``settings`` (:class:`TraceSettings`). Every input is checked (subject in prompt, non-empty answer)
    before any forward pass. Returns a :class:`TraceResult`.
    """
    import torch
    from tqdm.auto import tqdm

    from moir_lib.models import ModelAdapter

    n_noise, noise_scale, seed, kind = settings.n_noise, settings.noise_scale, settings.seed, settings.kind
    batch_size = settings.batch_size
    if n_noise < 1:
        raise ValueError(f"n_noise must be >= 1, got {n_noise}")
    if not noise_scale >= 0:
        raise ValueError(f"noise_scale must be >= 0, got {noise_scale}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    items = _as_prompts(prompts)
    adapter = ModelAdapter.for_model(model, tokenizer)
    runner = _Runner(model, adapter, kind, settings.window, n_noise, batch_size)
    prepared = _prepare(adapter, tokenizer, items)
    std = embedding_std(adapter, prepared, settings.noise_std)
    log.info("tracing %d prompts through %s (%d layers, kind %s), sigma = %.3g x %.4g", len(items),
             adapter.name, adapter.n_layers, kind, noise_scale, std)

    start_time = time.perf_counter()
    prompt_rows: list[dict[str, Any]] = []
    score_rows: list[tuple[Any, ...]] = []
    try:
        with torch.no_grad():
            pairs = list(zip(items, prepared, strict=True))
            for i, (item, prep) in enumerate(tqdm(pairs, desc="causal trace", disable=not progress)):
                sigma = noise_scale * std
                p_clean, p_corrupted, top, p_restored = runner.run(prep, sigma, _noise_seed(seed, i))
                ie = indirect_effect(p_restored, p_clean, p_corrupted)
                tokens = [tokenizer.decode([t]) for t in prep.ids]
                for (layer, pos), pr in np.ndenumerate(p_restored):
                    score_rows.append((i, layer, pos, tokens[pos], float(pr), float(ie[layer, pos])))
                prompt_rows.append({
                    "prompt_id": i, "prompt": item.prompt, "subject": item.subject, "answer": item.answer,
                    "answer_token": tokenizer.decode([prep.answer_id]), "n_tokens": len(prep.ids),
                    "subject_start": prep.start, "subject_end": prep.end, "p_clean": p_clean,
                    "p_corrupted": p_corrupted, "top_token": tokenizer.decode([top]),
                    "correct": top == prep.answer_id, "valid": bool(is_valid(p_clean, p_corrupted)),
                })
    finally:
        runner.close()
    seconds = time.perf_counter() - start_time
    columns = ["prompt_id", "layer", "position", "token", "p_restored", "ie"]
    result = TraceResult(
        prompts=pd.DataFrame(prompt_rows), scores=pd.DataFrame(score_rows, columns=columns),
        n_layers=adapter.n_layers, noise_std=std, noise_scale=float(noise_scale), n_noise=n_noise, seed=seed,
        kind=kind, seconds=seconds, model_name=adapter.name,
    )
    log.info("traced %d prompts (%d valid) in %.1f s", result.n_prompts, result.n_valid, seconds)
    return result


# ----------------------------------------------------------------------------- prompt sources


def pocket_prompts(model: str = "pocket", n: int | None = 100, seed: int = 0) -> list[TracePrompt]:
    """The facts pocket CounterFact rewrites (about people) in the world behind ``model``
    ("pocket" / "pocket-micro"), as tracing prompts.

    Each fact gives its relation's rewrite template (the CounterFact prompt, e.g. "The capital
    of {} is") with the subject filled in and the true object as answer. ``n`` facts are drawn
    without replacement (seeded) and kept in world order; ``None`` or more than exist takes all.
    """
    import random

    from moir_lib.models import POCKET_SPECS
    from moir_lib.pocket import World, get_variant

    if model not in POCKET_SPECS:
        raise ValueError(f"{model!r} is not a pocket model ({', '.join(POCKET_SPECS)}); "
                         f"for real models pass ROME's knowns file (knowns_path)")
    world = World(get_variant(POCKET_SPECS[model]).world)
    facts = [world.facts[i] for i in world.rewritable]
    if n is not None and n < len(facts):
        picked = sorted(random.Random(f"moir-trace/{seed}").sample(range(len(facts)), n))
        facts = [facts[i] for i in picked]
    return [TracePrompt(f.rel.templates[0].format(f.subject), f.subject, f.object) for f in facts]


def knowns_prompts(path: str | os.PathLike[str], n: int | None = 100) -> list[TracePrompt]:
    """The first ``n`` facts of ROME's ``known_1000.json`` (prompt, subject, attribute)."""
    from moir_lib.data import load_knowns

    return [TracePrompt(k.prompt, k.subject, k.attribute) for k in load_knowns(path, limit=n)]


def prompts_for(profile: Profile, knowns_path: str | os.PathLike[str] | None = None, n: int | None = 100,
                seed: int = 0) -> list[TracePrompt]:
    """Tracing prompts for a profile: ROME's knowns file when given, else the pocket world's facts."""
    if knowns_path:
        return knowns_prompts(knowns_path, n)
    return pocket_prompts(profile.model, n, seed)


@timed("causal tracing")
def trace_profile(profile: str | Profile, n_prompts: int = 100, knowns_path: str | None = None,
                  settings: TraceSettings = PAPER_TRACE, *, device: Any = None,
                  progress: bool = True) -> TraceResult:
    """Load a profile's model and trace its prompts (:func:`prompts_for`, sampled with ``settings.seed``)."""
    from moir_lib.models import load
    from moir_lib.profiles import Profile, load_profile

    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    prompts = prompts_for(prof, knowns_path, n_prompts, settings.seed)  # before loading: cheap errors first
    model, tokenizer, _ = load(prof, device=device)
    return trace(model, tokenizer, prompts, settings, progress=progress)


# ----------------------------------------------------------------------------- profile rewrite

_EDIT_LAYERS_RE = re.compile(r"^(?P<key>edit_layers[ \t]*:)(?P<sp>[ \t]*)(?P<value>[^#\n]*?)"
                             r"(?P<tail>[ \t]*(#[^\n]*)?)$", re.MULTILINE)


def rewrite_edit_layers(path: str | os.PathLike[str], layers: Sequence[int]) -> tuple[list[int], list[int]]:
    """Set ``edit_layers`` of the profile YAML at ``path`` to ``layers``; returns ``(old, new)``.

    Only the value of the top-level ``edit_layers`` line changes (written in flow style,
    ``[9, 10, 11]``); every other line, comment and the line's own trailing comment are kept
    byte for byte. A block-style list (``edit_layers:`` then ``- 9`` lines) is replaced by the
    flow form. The new file is validated as a profile before it replaces the old one.
    """
    from moir_lib.profiles import load_profile

    path = Path(path)
    new = [int(x) for x in layers]
    old = list(load_profile(path).edit_layers)
    text = path.read_text(encoding="utf-8")
    matches = list(_EDIT_LAYERS_RE.finditer(text))
    if len(matches) != 1:
        raise ValueError(f"{path}: expected one top-level 'edit_layers:' line, found {len(matches)}")
    m = matches[0]
    flow = "[" + ", ".join(map(str, new)) + "]"
    end = m.end()
    if not m.group("value").strip():  # block style: drop the following "- N" lines
        block = re.compile(r"\n[ \t]+-[ \t]*\d+[ \t]*(#[^\n]*)?(?=\n|$)")
        while (b := block.match(text, end)) is not None:
            end = b.end()
    tail = m.group("tail")
    if tail and not tail[0].isspace():  # "edit_layers:   # comment" (block style) keeps a space
        tail = " " + tail
    value = m.group("key") + (m.group("sp") or " ") + flow + tail
    new_text = text[:m.start()] + value + text[end:]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new_text)
        check = load_profile(tmp)
        if list(check.edit_layers) != new:
            raise ValueError(f"{path}: rewriting edit_layers gave {list(check.edit_layers)}, not {new}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return old, new
