"""z: the target hidden state at the last edit layer's output for each request (group).

MEMIT's ``compute_z`` (Meng et al., 2023, eq. 16; appendix C.2 of the paper): an additive
``δ`` on the residual stream at the *last subject token*, at the output of the last edit
layer ``L``, is optimised with Adam so that the model (full forward through the remaining
layers, final norm and LM head) predicts the new target after every context template::

    loss(δ) = mean_prompts  -1/T Σ_t log p(o*_t | prefix, prompt, o*_<t ; h_L + δ)       (NLL)
              + kl_factor · KL( p(· | "{subject} is a" ; h_L + δ) ‖ p(· | … ; h_L) )       (essence)
              + weight_decay · ‖δ‖ / ‖h_L‖²                                              (MEMIT's form)

As the reference's ``compute_z`` (MEMIT's code, unchanged in AlphaEdit's): δ starts at zero;
the NLL is a flat mean over every context template; the KL term is ``KL(now ‖ initial)``
(``kl_div(initial_log_probs, current_log_probs, log_target=True)`` in torch's argument order),
read at the last subject token of the ``"{} is a"`` prompt, i.e. it keeps the subject's
next-token distribution; iteration ``it`` computes the loss and stops *before* stepping when
the loss is below ``early_stop_loss`` (5e-2) or ``it == num_steps − 1``, so ``num_steps = 25``
takes at most 24 Adam updates; after each update ``‖δ‖`` is clamped to
``clamp_norm_factor · ‖h_L‖``. The target is ``z = h_L + δ``.

Requests whose keys coincide (:func:`moir_lib.editing.requests.group_requests`) share one δ
whose NLL covers every request of the group. Groups are optimised in chunks with one δ row
each; the loss is a sum over groups, and the rows never interact (padding is masked and Adam
is element-wise), so a chunk gives each group the result it would get alone.

Targets are tokenised as a *continuation* (:func:`moir_lib.editing.requests.target_token_ids`):
with a leading space and no BOS, the same ids whether the record's target has a leading space
or not. This is what Llama/SentencePiece tokenizers need (``tok("Paris")`` there yields
``[BOS, ▁Paris]``; the AlphaEdit repository strips the BOS by hand).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moir_lib.editing.keys import pad_batch
from moir_lib.editing.requests import EditRequest, RequestGroup, locate_subject, target_token_ids
from moir_lib.timings import timed

if TYPE_CHECKING:
    import torch
    from jaxtyping import Bool, Float, Float64, Int

    from moir_lib.models import ModelAdapter
    from moir_lib.profiles import MemitConfig

__all__ = ["LOOPS", "TargetResult", "TargetSource", "ValueConfig", "compute_targets", "loss_rows"]

#: z loops of :func:`compute_targets`
LOOPS = ("auto", "upper", "full")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValueConfig:
    """Hyper-parameters of the z optimisation (MEMIT's ``v_*``; appendix C.2 defaults)."""

    num_steps: int = 25  # loop iterations [v_num_grad_steps]: at most num_steps - 1 Adam updates
    lr: float = 0.5  # [v_lr]
    weight_decay: float = 1e-3  # [v_weight_decay], on ‖δ‖/‖h‖²
    kl_factor: float = 0.0625  # weight of the essence KL term
    clamp_norm_factor: float = 4.0  # ‖δ‖ ≤ clamp_norm_factor · ‖h‖
    early_stop_loss: float = 5e-2  # a group stops once its loss is below this
    kl_prompt: str = "{} is a"  # the essence prompt
    chunk_size: int = 16  # groups optimised together

    def __post_init__(self) -> None:
        if self.num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {self.num_steps}")
        for name in ("lr", "clamp_norm_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "kl_factor", "early_stop_loss"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.kl_prompt.count("{}") != 1:
            raise ValueError(f"kl_prompt must contain '{{}}' exactly once, got {self.kl_prompt!r}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")

    @classmethod
    def from_memit(cls, cfg: MemitConfig, **overrides: Any) -> ValueConfig:
        """From a profile's ``memit`` section (AlphaEdit uses the same value optimisation)."""
        return cls(num_steps=cfg.v_num_grad_steps, lr=cfg.v_lr, weight_decay=cfg.v_weight_decay,
                   kl_factor=cfg.kl_factor, clamp_norm_factor=cfg.clamp_norm_factor, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TargetResult:
    """Targets for the groups of one edit batch.

    ``z``/``h``: one column per group, the target and the original hidden state at the last subject
    token (plain prompt) at ``layer``'s output. Per group: ``loss`` (final total),
    ``nll``, ``kl``, ``steps`` (Adam steps taken), ``delta_ratio`` (‖δ‖/‖h‖). ``request_nll``:
    per request (in group order), the final target NLL per token, averaged over templates.
    """

    layer: int
    z: Float64[torch.Tensor, "d_out n"]
    h: Float64[torch.Tensor, "d_out n"]
    loss: list[float]
    nll: list[float]
    kl: list[float]
    steps: list[int]
    delta_ratio: list[float]
    request_nll: list[list[float]]
    seconds: float

    def per_request(self, groups: Sequence[RequestGroup]) -> list[dict[str, Any]]:
        """Tidy rows: one per request, with its group's loss and its own final NLL."""
        rows = []
        for g, group in enumerate(groups):
            for r, req in enumerate(group.requests):
                rows.append({"case_id": req.case_id, "group": g, "group_size": len(group.requests),
                             "final_loss": self.loss[g], "final_nll": self.request_nll[g][r],
                             "kl": self.kl[g], "steps": self.steps[g], "delta_ratio": self.delta_ratio[g]})
        return rows


#: what fits the targets of an edit batch: ``(adapter, groups, layer, cfg) -> TargetResult``
TargetSource = Callable[["ModelAdapter", Sequence[RequestGroup], int, ValueConfig], TargetResult]


@dataclass
class _Row:
    ids: list[int]
    lookup: int
    group: int  # index within the chunk
    request: int  # index within the group (-1 for the KL row)
    targets: list[int]  # empty for the KL row
    first: int  # position predicting targets[0]


def loss_rows(adapter: ModelAdapter, chunk: Sequence[RequestGroup], cfg: ValueConfig
              ) -> tuple[list[_Row], list[_Row]]:
    rewrite, kl = [], []
    for g, group in enumerate(chunk):
        for r, (req, sites) in enumerate(zip(group.requests, group.sites, strict=True)):
            target = group.targets[r] if group.targets else target_token_ids(
                adapter.tokenizer, req.target_new, req.filled_prompt, what=f"{req.describe()}: target_new")
            for site in sites:
                ids = list(site.ids) + target[:-1]
                rewrite.append(_Row(ids, site.index, g, r, target, len(site.ids) - 1))
        kl_req = EditRequest(group.requests[0].case_id, cfg.kl_prompt, group.subject, "-")
        site = locate_subject(adapter, kl_req)
        kl.append(_Row(list(site.ids), site.index, g, -1, [], -1))
    return rewrite, kl


@timed("z fitting")
def compute_targets(adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int,
                    cfg: ValueConfig | None = None, *, loop: str = "auto", threads: int | None = None
                    ) -> TargetResult:
    """Optimise one δ per group at the output of decoder layer ``layer`` (the last edit layer).

    ``loop``: ``"full"`` runs the whole model at every step, as MEMIT's ``compute_z`` does;
    ``"upper"`` runs the layers up to ``layer`` once per chunk and only the layers above it at each
    step, applies the LM head only at the positions the loss reads, and lets converged groups leave
    the batch (their δ frozen, as the full loop freezes it). Both optimise the same loss: the upper
    loop checks at its first step that it reproduces the full forward's loss and falls back to the full
    loop otherwise. ``"auto"``: ``"upper"`` where the adapter can run the layers above alone
    (:meth:`~moir_lib.models.ModelAdapter.can_run_from`). ``threads``: torch CPU threads while fitting
    (default: unchanged).
    """
    import torch

    cfg = cfg or ValueConfig()
    adapter.check_layers([layer])
    if loop not in LOOPS:
        raise ValueError(f"unknown z loop {loop!r}: choose {', '.join(LOOPS)}")
    if not groups:
        raise ValueError("no requests to compute targets for")
    if loop == "auto":
        loop = "upper" if adapter.can_run_from(layer + 1) else "full"
    start = time.perf_counter()
    model = adapter.model
    device = next(model.parameters()).device
    out: dict[str, list] = {k: [] for k in ("z", "h", "loss", "nll", "kl", "steps", "ratio", "req")}
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    old_threads = torch.get_num_threads()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        if threads:
            torch.set_num_threads(threads)
        optimise = _optimise_chunk_upper if loop == "upper" else _optimise_chunk
        for c in range(0, len(groups), cfg.chunk_size):
            optimise(adapter, groups[c: c + cfg.chunk_size], layer, cfg, device, out)
    finally:
        torch.set_num_threads(old_threads)
        for p, f in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(f)
        model.train(was_training)
    seconds = time.perf_counter() - start
    log.info("targets for %d groups at layer %d in %.1f s (%s loop; mean final loss %.3f)", len(groups),
             layer, seconds, loop, sum(out["loss"]) / len(out["loss"]))
    return TargetResult(layer, torch.cat(out["z"], dim=1), torch.cat(out["h"], dim=1), out["loss"],
                        out["nll"], out["kl"], out["steps"], out["ratio"], out["req"], seconds)


@dataclass
class _Batch:
    """One chunk's forward batch: the rewrite rows (every request under every template), then one
    KL row per group, with the index tensors the hook and the loss read."""

    rewrite: list[_Row]
    kl: list[_Row]
    n_groups: int
    ids: Int[torch.Tensor, "batch seq"]  # right-padded
    mask: Int[torch.Tensor, "batch seq"]
    row_idx: Int[torch.Tensor, " batch"]  # 0..rows-1
    lookup: Int[torch.Tensor, " batch"]  # per row: the position δ is added at (last subject token)
    row_group: Int[torch.Tensor, " batch"]  # per row: its group within the chunk
    t_row: Int[torch.Tensor, " targets"]  # target positions of the rewrite rows, flattened: row, position,
    t_pos: Int[torch.Tensor, " targets"]  # token, and weight 1/len(targets) (the NLL is per token)
    t_tok: Int[torch.Tensor, " targets"]
    t_w: Float[torch.Tensor, " targets"]
    rows_per_group: Int[torch.Tensor, " n"]
    first_row: Int[torch.Tensor, " n"]  # per group: its first rewrite row (the plain prompt)
    kl_idx: Int[torch.Tensor, " n"]  # the KL rows
    src: Int[torch.Tensor, " batch"]  # per row: its row in the chunk's whole batch (_subset)

    @property
    def n_rewrite(self) -> int:
        return len(self.rewrite)


def _batch_for(adapter: ModelAdapter, chunk: Sequence[RequestGroup], cfg: ValueConfig, device: Any) -> _Batch:
    rewrite, kl_rows = loss_rows(adapter, chunk, cfg)
    return _assemble(rewrite, kl_rows, len(chunk), adapter.pad_token_id, device)


def _assemble(rewrite: list[_Row], kl_rows: list[_Row], n_g: int, pad_id: int | None, device: Any) -> _Batch:
    """The forward batch of ``rewrite`` rows then ``kl_rows`` (one per group ``0..n_g-1``)."""
    import torch

    rows = rewrite + kl_rows
    n_rw = len(rewrite)
    ids, mask = pad_batch([r.ids for r in rows], pad_id, device)
    t_row, t_pos, t_tok, t_w = [], [], [], []
    for i, r in enumerate(rewrite):
        for j, tok in enumerate(r.targets):
            t_row.append(i)
            t_pos.append(r.first + j)
            t_tok.append(tok)
            t_w.append(1.0 / len(r.targets))
    return _Batch(
        rewrite, kl_rows, n_g, ids, mask,
        row_idx=torch.arange(len(rows), device=device),
        lookup=torch.tensor([r.lookup for r in rows], device=device),
        row_group=torch.tensor([r.group for r in rows], device=device),
        t_row=torch.tensor(t_row, device=device),
        t_pos=torch.tensor(t_pos, device=device),
        t_tok=torch.tensor(t_tok, device=device),
        t_w=torch.tensor(t_w, device=device, dtype=torch.float32),
        rows_per_group=torch.bincount(torch.tensor([r.group for r in rewrite]), minlength=n_g).to(device),
        first_row=torch.tensor([next(i for i, r in enumerate(rewrite) if r.group == g) for g in range(n_g)],
                               device=device),
        kl_idx=torch.arange(n_rw, len(rows), device=device),
        src=torch.arange(len(rows), device=device),
    )


def _delta_hook(batch: _Batch, delta: Float[torch.Tensor, "n d_out"],
                state: dict[str, Float[torch.Tensor, " ..."]], keep: bool = False) -> Callable[..., Any]:
    """Forward hook on the last edit layer: records ``h`` (plain prompt, first call) in ``state`` and
    adds each row's group's δ at its last subject token. ``keep``: also record the layer's whole output
    (before δ) as ``state["hidden"]`` on the first call."""
    import torch

    def hook(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        if "h" not in state:
            state["h"] = hidden[batch.row_idx, batch.lookup].detach().float()[batch.first_row]  # (n_g, d)
            if keep:
                state["hidden"] = hidden.detach()
        hidden = hidden + torch.zeros_like(hidden).index_put((batch.row_idx, batch.lookup),
                                                             delta[batch.row_group].to(hidden.dtype))
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    return hook


def _losses(model: Any, batch: _Batch, cfg: ValueConfig, delta: Float[torch.Tensor, "n d_out"],
            state: dict[str, Float[torch.Tensor, " ..."]], first: bool
            ) -> dict[str, Float[torch.Tensor, " ..."]]:
    """One forward pass of the whole model: the terms of :func:`_terms`."""
    logits = model(input_ids=batch.ids, attention_mask=batch.mask).logits
    return _terms(batch, cfg, delta, state, first, logits[batch.t_row, batch.t_pos],
                  logits[batch.kl_idx, batch.lookup[batch.kl_idx]])


def _terms(batch: _Batch, cfg: ValueConfig, delta: Float[torch.Tensor, "n d_out"],
           state: dict[str, Float[torch.Tensor, " ..."]], first: bool,
           target_logits: Float[torch.Tensor, "targets vocab"], kl_logits: Float[torch.Tensor, "n vocab"]
           ) -> dict[str, Float[torch.Tensor, " ..."]]:
    """Per group the NLL, the KL term and the weight decay (module docstring), their sum ``loss``, the
    per-row NLL and ``‖h‖``, from the logits at the target positions and at the KL rows' subject.
    ``first``: keep this pass's KL distribution as the initial one (``state["kl0"]``, one row per group
    in ``state["groups"]`` order when only some groups are in ``batch``)."""
    import torch

    b = batch
    logp = torch.log_softmax(target_logits.float(), dim=-1)  # (n_targets, V)
    tok_lp = logp.gather(1, b.t_tok[:, None])[:, 0]
    device = b.ids.device
    row_nll = torch.zeros(b.n_rewrite, device=device).index_add(0, b.t_row, -tok_lp * b.t_w)  # per token
    rw_group = b.row_group[: b.n_rewrite]
    nll = torch.zeros(b.n_groups, device=device).index_add(0, rw_group, row_nll) / b.rows_per_group
    kl_logp = torch.log_softmax(kl_logits.float(), dim=-1)  # (n_g, V)
    if first:
        state["kl0"] = kl_logp.detach()
    kl0 = state["kl0"] if "groups" not in state else state["kl0"][state["groups"]]
    h = state["h"] if "groups" not in state else state["h"][state["groups"]]
    # KL(now ‖ initial): torch's kl_div(input, target) is KL(target ‖ input)
    kl = cfg.kl_factor * torch.nn.functional.kl_div(kl0, kl_logp, log_target=True, reduction="none").sum(-1)
    h_norm = h.norm(dim=-1)
    wd = cfg.weight_decay * delta.norm(dim=-1) / h_norm**2
    return {"loss": nll + kl + wd, "nll": nll, "kl": kl, "row_nll": row_nll, "h_norm": h_norm}


def _step(opt: torch.optim.Optimizer, delta: Float[torch.Tensor, "n d_out"], loss: Float[torch.Tensor, " n"],
          active: Bool[torch.Tensor, " n"], max_norm: Float[torch.Tensor, " n"]) -> None:
    """One Adam step on the active groups' δ (the others stay frozen), then ``‖δ‖ ≤ max_norm``."""
    import torch

    frozen = delta.detach().clone()
    opt.zero_grad()
    loss[active].sum().backward()
    opt.step()
    with torch.no_grad():
        keep = ~active
        delta[keep] = frozen[keep]
        norms = delta.norm(dim=-1)
        scale = torch.where(norms > max_norm, max_norm / norms.clamp_min(1e-30), torch.ones_like(norms))
        delta.mul_(scale[:, None])


def _optimise_chunk(adapter: ModelAdapter, chunk: Sequence[RequestGroup], layer: int, cfg: ValueConfig,
                    device: Any, out: dict[str, list]) -> None:
    """Optimise one δ row per group of ``chunk`` with the whole model at every step (stops as the
    reference's ``compute_z`` does, see the module docstring) and append the results to ``out``."""

    batch = _batch_for(adapter, chunk, cfg, device)
    delta, opt, active, steps = _start(batch, adapter.hidden_size, cfg, device)
    state: dict[str, torch.Tensor] = {}
    handle = adapter.layers[layer].register_forward_hook(_delta_hook(batch, delta, state))
    try:
        for it in range(max(cfg.num_steps, 1)):
            terms = _losses(adapter.model, batch, cfg, delta, state, first=it == 0)
            active &= terms["loss"].detach() >= cfg.early_stop_loss
            if it >= cfg.num_steps - 1 or not bool(active.any()):
                break
            _step(opt, delta, terms["loss"], active, cfg.clamp_norm_factor * terms["h_norm"])
            steps += active.cpu().long()
    finally:
        handle.remove()
    _record(out, batch, state["h"], delta, terms, steps)


def _start(batch: _Batch, width: int, cfg: ValueConfig, device: Any
           ) -> tuple[Float[torch.Tensor, "n d_out"], torch.optim.Optimizer, Bool[torch.Tensor, " n"],
                      Int[torch.Tensor, " n"]]:
    """δ = 0 (one row per group), its Adam, every group active, no step taken."""
    import torch

    delta = torch.zeros((batch.n_groups, width), device=device, dtype=torch.float32, requires_grad=True)
    return (delta, torch.optim.Adam([delta], lr=cfg.lr), torch.ones(batch.n_groups, dtype=torch.bool,
                                                                       device=device),
            torch.zeros(batch.n_groups, dtype=torch.long))


def _optimise_chunk_upper(adapter: ModelAdapter, chunk: Sequence[RequestGroup], layer: int, cfg: ValueConfig,
                          device: Any, out: dict[str, list]) -> None:
    """:func:`_optimise_chunk` with the layers up to ``layer`` run once: the first step runs the whole
    model and keeps ``layer``'s output and the attention keys and values above it; later steps add δ to
    that output and run only the layers above, at the positions δ reaches up to the last one the loss
    reads (:func:`_upper_terms`), with the LM head only where the loss reads and only the groups still
    active in the batch."""
    import torch

    batch = _batch_for(adapter, chunk, cfg, device)
    delta, opt, active, steps = _start(batch, adapter.hidden_size, cfg, device)
    state: dict[str, torch.Tensor] = {}
    handle = adapter.layers[layer].register_forward_hook(_delta_hook(batch, delta, state, keep=True))
    try:
        terms = _losses(adapter.model, batch, cfg, delta, state, first=True)
    finally:
        handle.remove()
    with torch.no_grad():
        state["kv"] = adapter.attention_cache_from(layer + 1, state["hidden"], batch.mask)
    if not _upper_matches(adapter, layer, batch, cfg, delta, state, terms):
        log.warning("%s: running the layers above %d alone does not reproduce the full forward; fitting z "
                    "with the whole model at every step", adapter.name, layer)
        out_full: dict[str, list] = {k: [] for k in out}
        _optimise_chunk(adapter, chunk, layer, cfg, device, out_full)
        for k, v in out_full.items():
            out[k].extend(v)
        return
    final = {k: v.detach().clone() for k, v in terms.items()}
    sub, groups = batch, torch.arange(batch.n_groups, device=device)
    for it in range(max(cfg.num_steps, 1)):
        if it:
            terms = _upper_terms(adapter, layer, sub, cfg, delta, state, groups)
            _keep_final(final, terms, batch, sub, groups)
        active[groups] &= terms["loss"].detach() >= cfg.early_stop_loss
        if it >= cfg.num_steps - 1 or not bool(active.any()):
            break
        mine = active[groups]
        _step(opt, delta, _spread(terms["loss"], groups, batch.n_groups), active,
              cfg.clamp_norm_factor * state["h"].norm(dim=-1))
        steps += active.cpu().long()
        if not bool(mine.all()):  # converged groups leave the batch
            groups = torch.nonzero(active).flatten()
            sub = _subset(batch, [int(g) for g in groups], adapter.pad_token_id, device)
    _record(out, batch, state["h"], delta, final, steps)


def _upper_terms(adapter: ModelAdapter, layer: int, sub: _Batch, cfg: ValueConfig,
                 delta: Float[torch.Tensor, "n d_out"], state: dict[str, Float[torch.Tensor, " ..."]],
                 groups: Int[torch.Tensor, " k"]) -> dict[str, Float[torch.Tensor, " ..."]]:
    """The loss terms of the groups ``groups`` (``sub``'s rows) from ``layer``'s kept output plus δ.

    Positions before a row's last subject token never see δ (attention is causal): their attention keys
    and values above ``layer`` are those of the first step (``state["kv"]``), so only the positions from
    the subject's last token to the last one the loss reads (the last target; the subject itself for a
    KL row) are run, continuing that cached prefix."""
    import torch

    d = delta[groups]
    lookup = sub.lookup
    last = torch.where(torch.arange(len(lookup), device=lookup.device) < sub.n_rewrite,
                       sub.mask.sum(1) - 1, lookup)  # the last position each row's loss reads
    span = last - lookup + 1
    width, before = int(span.max()), int(lookup.max())
    offset = torch.arange(width, device=lookup.device)
    inside = offset[None] < span[:, None]  # (rows, width)
    pos = lookup[:, None] + offset[None]
    hidden = state["hidden"][sub.src[:, None], torch.where(inside, pos, lookup[:, None])]
    hidden = hidden + torch.nn.functional.pad(d[sub.row_group].to(hidden.dtype)[:, None],
                                              (0, 0, 0, width - 1))  # δ at each row's first position
    prefix = {i: (k[sub.src, :, :before], v[sub.src, :, :before]) for i, (k, v) in state["kv"].items()}
    seen = torch.arange(before, device=lookup.device)[None] < lookup[:, None]  # the row's own prefix
    mask = torch.cat([seen, inside], dim=1).long()
    out = adapter.run_from(layer + 1, hidden, mask, prefix=prefix, position_ids=pos)
    state["groups"] = groups
    try:
        return _terms(sub, cfg, d, state, False,
                      adapter.lm_head(out[sub.t_row, sub.t_pos - lookup[sub.t_row]]),
                      adapter.lm_head(out[sub.kl_idx, 0]))
    finally:
        del state["groups"]


def _upper_matches(adapter: ModelAdapter, layer: int, batch: _Batch, cfg: ValueConfig,
                   delta: Float[torch.Tensor, "n d_out"], state: dict[str, Float[torch.Tensor, " ..."]],
                   terms: dict[str, Float[torch.Tensor, " ..."]]) -> bool:
    """Whether the layers above ``layer`` run alone give the whole model's first-step loss terms."""
    import torch

    with torch.no_grad():
        check = _upper_terms(adapter, layer, batch, cfg, delta, state, torch.arange(batch.n_groups))
    return all(torch.allclose(check[k], terms[k].detach(), rtol=1e-4, atol=1e-5) for k in ("nll", "kl"))


def _spread(values: Float[torch.Tensor, " k"], groups: Int[torch.Tensor, " k"], n: int
            ) -> Float[torch.Tensor, " n"]:
    """``values`` of ``groups`` placed in a length-``n`` vector (zeros elsewhere), keeping the graph."""
    import torch

    return torch.zeros(n, dtype=values.dtype, device=values.device).index_put((groups,), values)


def _keep_final(final: dict[str, Float[torch.Tensor, " ..."]], terms: dict[str, Float[torch.Tensor, " ..."]],
                batch: _Batch, sub: _Batch, groups: Int[torch.Tensor, " k"]) -> None:
    """Write the active groups' latest terms into the whole chunk's ``final`` terms."""
    for k in ("loss", "nll", "kl", "h_norm"):
        final[k][groups] = terms[k].detach()
    final["row_nll"][sub.src[: sub.n_rewrite]] = terms["row_nll"].detach()


def _subset(batch: _Batch, groups: list[int], pad_id: int | None, device: Any) -> _Batch:
    """``batch`` restricted to the rows of ``groups`` (renumbered 0..k-1 in that order), trimmed to
    its longest row; ``src`` holds each row's index in ``batch``."""
    import torch

    new = {g: i for i, g in enumerate(groups)}
    rw = [(i, r) for i, r in enumerate(batch.rewrite) if r.group in new]
    rewrite = [dataclasses.replace(r, group=new[r.group]) for _, r in rw]
    kl = [dataclasses.replace(batch.kl[g], group=new[g]) for g in groups]
    src = torch.tensor([i for i, _ in rw] + [batch.n_rewrite + g for g in groups], device=device)
    return dataclasses.replace(_assemble(rewrite, kl, len(groups), pad_id, device), src=src)


def _record(out: dict[str, list], batch: _Batch, h: Float[torch.Tensor, "n d_out"],
            delta: Float[torch.Tensor, "n d_out"], terms: dict[str, Float[torch.Tensor, " ..."]],
            steps: Int[torch.Tensor, " n"]) -> None:
    """Append one chunk's ``z = h + δ``, ``h`` and per-group / per-request numbers to ``out``."""
    import torch

    with torch.no_grad():
        h64 = h.double()
        z = h64 + delta.detach().double()
        out["z"].append(z.T.cpu())
        out["h"].append(h64.T.cpu())
        out["loss"].extend(float(x) for x in terms["loss"].detach().cpu())
        out["nll"].extend(float(x) for x in terms["nll"].detach().cpu())
        out["kl"].extend(float(x) for x in terms["kl"].detach().cpu())
        out["steps"].extend(int(s) for s in steps)
        out["ratio"].extend(float(x) for x in (delta.norm(dim=-1) / terms["h_norm"]).cpu())
        per_req: list[dict[int, list[float]]] = [{} for _ in range(batch.n_groups)]
        for i, r in enumerate(batch.rewrite):
            per_req[r.group].setdefault(r.request, []).append(float(terms["row_nll"][i]))
        for g in range(batch.n_groups):
            out["req"].append([sum(v) / len(v) for _, v in sorted(per_req[g].items())])
