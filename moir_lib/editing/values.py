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

if TYPE_CHECKING:
    import torch
    from jaxtyping import Bool, Float, Float64, Int

    from moir_lib.models import ModelAdapter
    from moir_lib.profiles import MemitConfig

__all__ = ["TargetResult", "ValueConfig", "compute_targets"]

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


@dataclass
class _Row:
    ids: list[int]
    lookup: int
    group: int  # index within the chunk
    request: int  # index within the group (-1 for the KL row)
    targets: list[int]  # empty for the KL row
    first: int  # position predicting targets[0]


def _rows_for(adapter: ModelAdapter, chunk: Sequence[RequestGroup], cfg: ValueConfig
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


def compute_targets(adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int,
                    cfg: ValueConfig | None = None) -> TargetResult:
    """Optimise one δ per group at the output of decoder layer ``layer`` (the last edit layer)."""
    import torch

    cfg = cfg or ValueConfig()
    adapter.check_layers([layer])
    if not groups:
        raise ValueError("no requests to compute targets for")
    start = time.perf_counter()
    model = adapter.model
    device = next(model.parameters()).device
    out: dict[str, list] = {k: [] for k in ("z", "h", "loss", "nll", "kl", "steps", "ratio", "req")}
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for c in range(0, len(groups), cfg.chunk_size):
            _optimise_chunk(adapter, groups[c: c + cfg.chunk_size], layer, cfg, device, out)
    finally:
        for p, f in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(f)
        model.train(was_training)
    seconds = time.perf_counter() - start
    log.info("targets for %d groups at layer %d in %.1f s (mean final loss %.3f)", len(groups), layer,
             seconds, sum(out["loss"]) / len(out["loss"]))
    return TargetResult(layer, torch.cat(out["z"], dim=1), torch.cat(out["h"], dim=1), out["loss"],
                        out["nll"], out["kl"], out["steps"], out["ratio"], out["req"], seconds)


@dataclass
class _Batch:
    """One chunk's forward batch: the rewrite rows (every request under every template), then one
    KL row per group, with the index tensors the hook and the loss read."""

    rewrite: list[_Row]
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

    @property
    def n_rewrite(self) -> int:
        return len(self.rewrite)


def _batch_for(adapter: ModelAdapter, chunk: Sequence[RequestGroup], cfg: ValueConfig, device: Any) -> _Batch:
    import torch

    rewrite, kl_rows = _rows_for(adapter, chunk, cfg)
    rows = rewrite + kl_rows
    n_g, n_rw = len(chunk), len(rewrite)
    ids, mask = pad_batch([r.ids for r in rows], adapter.pad_token_id, device)
    t_row, t_pos, t_tok, t_w = [], [], [], []
    for i, r in enumerate(rewrite):
        for j, tok in enumerate(r.targets):
            t_row.append(i)
            t_pos.append(r.first + j)
            t_tok.append(tok)
            t_w.append(1.0 / len(r.targets))
    return _Batch(
        rewrite, n_g, ids, mask,
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
    )


def _delta_hook(batch: _Batch, delta: Float[torch.Tensor, "n d_out"],
                state: dict[str, Float[torch.Tensor, " ..."]]) -> Callable[..., Any]:
    """Forward hook on the last edit layer: records ``h`` (plain prompt, first call) in ``state`` and
    adds each row's group's δ at its last subject token."""
    import torch

    def hook(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        if "h" not in state:
            state["h"] = hidden[batch.row_idx, batch.lookup].detach().float()[batch.first_row]  # (n_g, d)
        add = torch.zeros_like(hidden)
        add = add.index_put((batch.row_idx, batch.lookup), delta[batch.row_group].to(hidden.dtype))
        hidden = hidden + add
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    return hook


def _losses(model: Any, batch: _Batch, cfg: ValueConfig, delta: Float[torch.Tensor, "n d_out"],
            state: dict[str, Float[torch.Tensor, " ..."]], first: bool
            ) -> dict[str, Float[torch.Tensor, " ..."]]:
    """One forward pass: per group the NLL, the KL term and the weight decay (module docstring),
    their sum ``loss``, the per-row NLL and ``‖h‖``. ``first``: keep this pass's KL distribution
    as the initial one."""
    import torch

    b = batch
    logits = model(input_ids=b.ids, attention_mask=b.mask).logits
    logp = torch.log_softmax(logits[b.t_row, b.t_pos].float(), dim=-1)  # (n_targets, V)
    tok_lp = logp.gather(1, b.t_tok[:, None])[:, 0]
    device = b.ids.device
    row_nll = torch.zeros(b.n_rewrite, device=device).index_add(0, b.t_row, -tok_lp * b.t_w)  # per token
    rw_group = b.row_group[: b.n_rewrite]
    nll = torch.zeros(b.n_groups, device=device).index_add(0, rw_group, row_nll) / b.rows_per_group
    kl_logp = torch.log_softmax(logits[b.kl_idx, b.lookup[b.kl_idx]].float(), dim=-1)  # (n_g, V)
    if first:
        state["kl0"] = kl_logp.detach()
    # KL(now ‖ initial): torch's kl_div(input, target) is KL(target ‖ input)
    kl = cfg.kl_factor * torch.nn.functional.kl_div(state["kl0"], kl_logp, log_target=True,
                                                    reduction="none").sum(-1)
    h_norm = state["h"].norm(dim=-1)
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
    """Optimise one δ row per group of ``chunk`` (stops as the reference's ``compute_z`` does, see the
    module docstring) and append the results to ``out``."""
    import torch

    batch = _batch_for(adapter, chunk, cfg, device)
    delta = torch.zeros((batch.n_groups, adapter.hidden_size), device=device, dtype=torch.float32,
                        requires_grad=True)
    opt = torch.optim.Adam([delta], lr=cfg.lr)
    state: dict[str, torch.Tensor] = {}
    active = torch.ones(batch.n_groups, dtype=torch.bool, device=device)
    steps = torch.zeros(batch.n_groups, dtype=torch.long)
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
