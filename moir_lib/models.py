"""Load a causal LM by hub id, local folder or ``pocket``, and find its key sites.

Closed-form editors (MEMIT, AlphaEdit) rewrite the second MLP projection
``W_out^ℓ`` (``mlp.down_proj`` in Llama-like models) of the edit layers. Its *input* is
the key ``k = φ_ℓ(x)`` whose second moment ``C = E[k kᵀ]`` the paper estimates (eq. (kfac) and
appendix A.1); its output is added to the residual stream. A :class:`ModelAdapter` hides
where that module lives in each architecture family and how its weight is stored, plus the
pieces the rest of the library needs: decoder layers, final norm, LM head, embeddings, BOS
handling and the chat template.

Families are data (:class:`Family`), looked up by ``config.model_type``; add one with
:func:`register_family`. Everything is checked against the config before the weights are
read, so an unsupported architecture or an out-of-range layer costs no loading time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from moir_lib.profiles import RETIRED_PROFILES, Profile
from moir_lib.timings import timed

if TYPE_CHECKING:  # heavy imports stay lazy: ``moir --help`` must answer instantly
    import torch
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "FAMILIES",
    "POCKET_SPECS",
    "Family",
    "LoadedModel",
    "ModelAdapter",
    "load",
    "model_fingerprint",
    "register_family",
    "supported_families",
]

log = logging.getLogger(__name__)

#: spec -> variant name passed to ``moir_lib.pocket.load`` (see ``moir_lib.pocket.variants.VARIANTS``).
POCKET_SPECS: dict[str, str] = {"pocket": "pocket", "pocket-micro": "micro"}

_OFFLINE_VALUES = {"1", "on", "yes", "true"}


def _dtype_kwarg() -> str:
    """``from_pretrained``'s dtype argument: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    from importlib.metadata import version

    major, minor = (int(x) for x in version("transformers").split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


@dataclass(frozen=True)
class Family:
    """Where one architecture family keeps its parts (module paths from the model root).

    ``key`` is relative to a decoder layer. ``transposed`` marks a key module whose weight
    is stored as ``(d_in, d_out)`` (GPT-2's ``Conv1D``) instead of ``nn.Linear``'s
    ``(d_out, d_in)``.
    """

    name: str
    model_types: tuple[str, ...]
    classes: tuple[str, ...]
    layers: str
    key: str
    final_norm: str
    lm_head: str
    embed_tokens: str
    transposed: bool = False
    #: the base model hands ``inputs_embeds`` to its first decoder layer unchanged (no position
    #: embedding added, no scaling), so a stretch of its layers can be run alone (``run_from``)
    embeds_unchanged: bool = False

    @property
    def key_template(self) -> str:
        """Module name of the key site with ``{}`` for the layer, e.g. ``model.layers.{}.mlp.down_proj``."""
        return f"{self.layers}.{{}}.{self.key}"


def _llama_like(name: str, model_type: str, cls: str) -> Family:
    return Family(name, (model_type,), (cls,), "model.layers", "mlp.down_proj", "model.norm",
                  "lm_head", "model.embed_tokens", embeds_unchanged=True)


#: family name -> :class:`Family`. The paper's three models are llama, olmo2 and qwen3.
FAMILIES: dict[str, Family] = {
    "llama": _llama_like("llama", "llama", "LlamaForCausalLM"),
    "olmo2": _llama_like("olmo2", "olmo2", "Olmo2ForCausalLM"),
    "qwen3": _llama_like("qwen3", "qwen3", "Qwen3ForCausalLM"),
    "qwen2": _llama_like("qwen2", "qwen2", "Qwen2ForCausalLM"),
    "mistral": _llama_like("mistral", "mistral", "MistralForCausalLM"),
    "gpt2": Family("gpt2", ("gpt2",), ("GPT2LMHeadModel",), "transformer.h", "mlp.c_proj",
                   "transformer.ln_f", "lm_head", "transformer.wte", transposed=True),
    "gpt_neox": Family("gpt_neox", ("gpt_neox",), ("GPTNeoXForCausalLM",), "gpt_neox.layers",
                       "mlp.dense_4h_to_h", "gpt_neox.final_layer_norm", "embed_out", "gpt_neox.embed_in"),
    "gptj": Family("gptj", ("gptj",), ("GPTJForCausalLM",), "transformer.h", "mlp.fc_out",
                   "transformer.ln_f", "lm_head", "transformer.wte"),
}


def register_family(family: Family) -> None:
    """Add (or replace) an architecture family."""
    FAMILIES[family.name] = family


def supported_families() -> str:
    """Human-readable list, e.g. ``llama (LlamaForCausalLM), ...``."""
    return ", ".join(f"{f.name} ({'/'.join(f.classes)})" for f in FAMILIES.values())


def _family_for(model_type: str | None, cls_name: str, name: str) -> Family:
    for family in FAMILIES.values():
        if model_type in family.model_types or cls_name in family.classes:
            return family
    raise ValueError(
        f"unsupported architecture {cls_name} (model_type {model_type!r}) for {name}: "
        f"supported families are {supported_families()}; add one with moir_lib.models.register_family"
    )


def _check_layers(layers: Iterable[int], n_layers: int, name: str) -> list[int]:
    checked = list(layers)
    if not checked:
        raise ValueError(f"no edit layers given for {name}")
    for layer in checked:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(f"layer {layer!r} is not an integer ({name} has layers 0-{n_layers - 1})")
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range: {name} has {n_layers} layers (0-{n_layers - 1})")
    if len(set(checked)) != len(checked):
        raise ValueError(f"repeated layer in {checked} for {name}")
    return checked


class ModelAdapter:
    """One model's parts, located through its :class:`Family`.

    Attributes: ``family``, ``name`` (for messages), ``n_layers``, ``layers`` (the decoder
    ``ModuleList``), ``hidden_size``, ``key_dim`` (input width of the key module, i.e. the
    dimension of ``k`` and of ``C``: the intermediate size), ``out_dim`` (its output width,
    the residual width), ``final_norm``, ``lm_head``, ``embed_tokens``, ``weight_transposed``,
    ``bos_token_id``, ``tokenizer_adds_bos``, ``has_chat_template``.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None,
                 name: str | None = None) -> None:
        config = model.config
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(config, "_name_or_path", "") or type(model).__name__
        self.family = _family_for(getattr(config, "model_type", None), type(model).__name__, self.name)
        self.layers: nn.ModuleList = model.get_submodule(self.family.layers)
        self.n_layers = len(self.layers)
        self.final_norm: nn.Module = model.get_submodule(self.family.final_norm)
        self.lm_head: nn.Module = model.get_submodule(self.family.lm_head)
        self.embed_tokens: nn.Module = model.get_submodule(self.family.embed_tokens)
        self.weight_transposed = self.family.transposed
        d_out, d_in = self.weight_of(0).shape
        self.key_dim: int = int(d_in)
        self.out_dim: int = int(d_out)
        self.hidden_size: int = int(getattr(config, "hidden_size", d_out))
        if self.out_dim != self.hidden_size:
            raise ValueError(f"{self.name}: key module writes {self.out_dim} features but hidden_size is "
                             f"{self.hidden_size}; is {self.family.key_template} the right module?")

    @classmethod
    def for_model(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None,
                  name: str | None = None) -> ModelAdapter:
        """Adapter for an already loaded model (raises ``ValueError`` for unsupported ones)."""
        return cls(model, tokenizer, name)

    # ---------------------------------------------------------------- key sites (eq. (kfac))

    @property
    def key_module_template(self) -> str:
        """e.g. ``"model.layers.{}.mlp.down_proj"``."""
        return self.family.key_template

    def key_module_name(self, layer: int) -> str:
        """Full module name of layer ``layer``'s key module."""
        return self.key_module_template.format(layer)

    def key_module(self, layer: int) -> nn.Module:
        """The ``down_proj``-equivalent of ``layer``: its input is the key ``k`` (eq. (kfac), A.1)."""
        self.check_layers([layer])
        return self.model.get_submodule(self.key_module_name(layer))

    def weight_of(self, layer: int) -> torch.Tensor:
        """``W_out`` of ``layer`` as a ``(d_out, d_in)`` tensor, so ``out = k @ W.T (+ bias)``.

        It shares storage with the model: for ``nn.Linear`` it is the weight parameter itself,
        for GPT-2's ``Conv1D`` (stored ``(d_in, d_out)``) its transposed view. In-place updates
        (``W.add_(delta)`` under ``torch.no_grad()``, or :meth:`apply_delta`) edit the model.
        """
        weight = self.key_module(layer).weight
        return weight.T if self.weight_transposed else weight

    def apply_delta(self, layer: int, delta: torch.Tensor) -> None:
        """``W_out ← W_out + Δ`` in place for a ``(d_out, d_in)`` delta of any dtype/device."""
        import torch

        weight = self.weight_of(layer)
        if tuple(delta.shape) != tuple(weight.shape):
            raise ValueError(f"delta of shape {tuple(delta.shape)} does not match W_out of layer {layer}: "
                             f"(d_out, d_in) = {tuple(weight.shape)}")
        with torch.no_grad():
            weight.add_(delta.to(device=weight.device, dtype=weight.dtype))

    def check_layers(self, layers: Iterable[int]) -> list[int]:
        """Validate layer indices before any expensive work; returns them as a list."""
        return _check_layers(layers, self.n_layers, self.name)

    # ---------------------------------------------------------------- the layers above a site

    def can_run_from(self, layer: int) -> bool:
        """Whether :meth:`run_from` can run decoder layers ``layer..`` alone (see there)."""
        return self.family.embeds_unchanged and 0 < layer <= self.n_layers

    def run_from(self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor, *,
                 prefix: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The final-normed hidden states ``(batch, seq, d)`` after decoder layers ``layer..n-1`` read
        ``hidden``, the residual stream entering ``layer``: the base model run on ``inputs_embeds=hidden``
        with its layer list cut to ``layers[layer:]`` for the call, so its own causal mask and rotary
        embeddings are used. Positions are ``0..seq-1``, as in a forward from ``input_ids``, unless
        ``prefix`` holds, per layer ``≥ layer``, the attention keys and values ``(batch, heads, p, head_dim)``
        of ``p`` earlier positions (:meth:`attention_cache_from`) that the rows of ``hidden`` continue;
        ``attention_mask`` then covers the ``p + seq`` positions and ``position_ids`` gives each row's
        positions."""
        if layer == self.n_layers:  # no layer above: only the final norm
            if not self.can_run_from(layer):
                raise ValueError(f"{self.name}: cannot run the final norm alone (family {self.family.name})")
            return self.final_norm(hidden)
        cache = None
        if prefix is not None:
            from transformers import DynamicCache

            cache = DynamicCache()
            for i in range(self.n_layers):  # the layers below are never run: any tensor of the size will do
                cache.update(*prefix.get(i, prefix[layer]), i)
        with self._layers_from(layer) as base:
            out = base(inputs_embeds=hidden, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=cache is not None)
        return out.last_hidden_state

    def attention_cache_from(self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor
                             ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per decoder layer ``layer..n-1``: the attention keys and values ``(batch, heads, seq, head_dim)``
        of every position when those layers read ``hidden`` (as :meth:`run_from`), for a later
        :meth:`run_from` over positions that continue a prefix of them."""
        from transformers import DynamicCache

        cache = DynamicCache()
        with self._layers_from(layer) as base:
            base(inputs_embeds=hidden, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        return {i: tuple(cache[i]) for i in range(layer, self.n_layers)}

    @contextlib.contextmanager
    def _layers_from(self, layer: int) -> Iterator[nn.Module]:
        """The base model, its layer list cut to ``layers[layer:]`` inside the block."""
        from torch import nn

        if not self.can_run_from(layer):
            raise ValueError(f"{self.name}: cannot run decoder layers {layer}.. alone "
                             f"(family {self.family.name})")
        parent, attr = self.family.layers.rsplit(".", 1)
        base = self.model.get_submodule(parent)
        setattr(base, attr, nn.ModuleList(list(self.layers)[layer:]))
        try:
            yield base
        finally:
            setattr(base, attr, self.layers)

    # ---------------------------------------------------------------- tokens and chat

    @property
    def bos_token_id(self) -> int | None:
        """The tokenizer's BOS id, else the config's (Qwen3's tokenizer has none), else ``None``."""
        if self.tokenizer is not None and self.tokenizer.bos_token_id is not None:
            return int(self.tokenizer.bos_token_id)
        bos = getattr(self.model.config, "bos_token_id", None)
        return int(bos) if isinstance(bos, int) else None

    @property
    def eos_token_id(self) -> int | None:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return int(self.tokenizer.eos_token_id)
        eos = getattr(self.model.config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return int(eos) if isinstance(eos, int) else None

    @property
    def pad_token_id(self) -> int | None:
        """The tokenizer's pad id, falling back to EOS (for batched generation)."""
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        return self.eos_token_id

    @property
    def tokenizer_adds_bos(self) -> bool:
        """Whether ``tokenizer(text)`` already starts with BOS (Llama-3 yes, GPT-2/Qwen3 no)."""
        bos = self.bos_token_id
        if self.tokenizer is None or bos is None:
            return False
        ids = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        return bool(ids) and ids[0] == bos

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` with exactly one leading BOS when ``add_bos`` (and one exists)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.name} was loaded without a tokenizer")
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        bos = self.bos_token_id
        return [bos, *ids] if add_bos and bos is not None else ids

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> Any:
        """Passthrough to ``tokenizer.apply_chat_template`` (``tokenize=False`` by default)."""
        if not self.has_chat_template:
            raise ValueError(f"{self.name} has no chat template (a base model?); format prompts yourself")
        kwargs.setdefault("tokenize", False)
        return self.tokenizer.apply_chat_template(list(messages), **kwargs)

    # ---------------------------------------------------------------- metadata

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding (may exceed ``len(tokenizer)`` by padding rows)."""
        return int(self.embed_tokens.weight.shape[0])

    def describe(self) -> dict[str, Any]:
        """Plain-data summary for logs and ``summary.json``."""
        params = list(self.model.parameters())
        return {
            "name": self.name,
            "family": self.family.name,
            "class": type(self.model).__name__,
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "key_dim": self.key_dim,
            "key_module": self.key_module_template,
            "weight_transposed": self.weight_transposed,
            "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_token_id,
            "tokenizer_adds_bos": self.tokenizer_adds_bos,
            "has_chat_template": self.has_chat_template,
            "dtype": str(params[0].dtype).removeprefix("torch.") if params else None,
            "n_params": sum(p.numel() for p in params),
        }

    def __repr__(self) -> str:
        return (f"ModelAdapter({self.name!r}, family={self.family.name}, n_layers={self.n_layers}, "
                f"hidden={self.hidden_size}, key_dim={self.key_dim})")


class LoadedModel(NamedTuple):
    """What :func:`load` returns; unpacks as ``model, tokenizer, adapter = load(...)``."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    adapter: ModelAdapter


# ----------------------------------------------------------------------------- loading


def _offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _OFFLINE_VALUES:
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover
        return False


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use float16, bfloat16, float32 or float64")
    return value


def _resolve_device(device: Any) -> Any:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _is_path_like(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)


@timed("model load")
def load(spec: str | os.PathLike[str] | Profile, dtype: Any = None, device: Any = None, *,
         revision: str | None = None, trust_remote_code: bool = False, organism: int | None = None
         ) -> LoadedModel:
    """Load model, tokenizer and :class:`ModelAdapter`.

    ``spec``: a hub id (``allenai/OLMo-2-1124-7B-Instruct``), a local ``save_pretrained``
    folder, ``"pocket"``/``"pocket-micro"`` (built by :mod:`moir_lib.pocket`), or a
    :class:`~moir_lib.profiles.Profile` (its model, revision and dtype, and its edit layers
    are checked). ``dtype``: a ``torch.dtype`` or its name (default: transformers' default,
    float32). ``device``: e.g. ``"cuda"``, ``"cpu"``, ``"auto"`` (default: where loaded, CPU).
    ``organism``: which organism of a pocket model (:mod:`moir_lib.pocket.organisms`; default: the
    profile's, else 0); a hub or folder model has one set of weights, so only 0 is accepted there.

    The architecture and the edit layers are checked against the config before any weight
    is read. An unknown hub id with ``HF_HUB_OFFLINE=1`` fails at once with
    ``FileNotFoundError``.
    """
    layers: tuple[int, ...] | None = None
    if isinstance(spec, Profile):
        layers = spec.edit_layers
        revision = revision if revision is not None else spec.revision
        dtype = dtype if dtype is not None else spec.dtype
        organism = organism if organism is not None else spec.organism
        spec = spec.model
    spec = os.fspath(spec)
    organism = _check_organism(0 if organism is None else organism, spec)
    if spec in RETIRED_PROFILES:
        raise ValueError(f"the pocket model {spec!r} is now {RETIRED_PROFILES[spec]!r} (one pocket model "
                         f"serves every chapter): set model: {RETIRED_PROFILES[spec]} in the profile")
    torch_dtype = _torch_dtype(dtype)
    device = _resolve_device(device)

    if spec in POCKET_SPECS:
        model, tokenizer = _load_pocket(spec, organism)
        if torch_dtype is not None or device is not None:
            model = model.to(device=device, dtype=torch_dtype)
        adapter = ModelAdapter(model, tokenizer, name=spec)
        if layers is not None:
            adapter.check_layers(layers)
        model.eval()
        return LoadedModel(model, tokenizer, adapter)

    source, name = _resolve_source(spec)
    config = _load_config(source, name, revision, trust_remote_code)
    cls_name = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    family = _family_for(getattr(config, "model_type", None), cls_name, name)
    if layers is not None:
        _check_layers(layers, int(config.num_hidden_layers), name)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("loading %s (family %s, dtype %s, device %s)", name, family.name, torch_dtype, device)
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if torch_dtype is not None:
        kwargs[_dtype_kwarg()] = torch_dtype
    direct = device is not None and importlib.util.find_spec("accelerate") is not None
    if direct:  # straight onto the device; without accelerate, load on CPU and move
        kwargs["device_map"] = {"": device}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision,
                                                  trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source, config=config, **kwargs)
    except OSError as exc:
        raise FileNotFoundError(f"could not load the weights or tokenizer of {name}: {exc}") from exc
    if device is not None and not direct:
        model = model.to(device)
    model.eval()
    adapter = ModelAdapter(model, tokenizer, name=name)
    return LoadedModel(model, tokenizer, adapter)


def check_organisms(organisms: Sequence[int], spec: str) -> list[int]:
    """``organisms`` as a list if ``spec`` has them all (:func:`_check_organism`), refused before any model
    loads with what to pass instead: a chapter's ``organisms`` name models of the pocket recipe, and a
    real model is one model; two organisms built on this machine with the same weights are one model too
    (:func:`moir_lib.pocket.build.distinct_weights`)."""
    organisms = list(organisms)
    if any(organisms) and spec not in POCKET_SPECS:
        raise ValueError(f"organisms {organisms}: organisms are models of the pocket recipe, and {spec!r} is "
                         f"one model; pass organisms=[0] (moir run -p organisms '[0]')")
    checked = [_check_organism(k, spec) for k in organisms]
    if len(checked) > 1:
        from moir_lib.pocket.build import distinct_weights

        distinct_weights(POCKET_SPECS[spec], checked, f"organisms {checked}")
    return checked


def _check_organism(organism: Any, spec: str) -> int:
    """``organism`` if ``spec`` can have it: any integer ≥ 0 for a pocket model, only 0 for another."""
    if isinstance(organism, bool) or not isinstance(organism, int) or organism < 0:
        raise ValueError(f"organism {organism!r}: give an integer >= 0 (0 is the pocket recipe's own model)")
    if organism and spec not in POCKET_SPECS:
        raise ValueError(f"organism {organism} needs a pocket model ({', '.join(POCKET_SPECS)}), but "
                         f"{spec!r} has one set of weights: set organism to 0 (or leave it out of the "
                         f"profile)")
    return organism


def _load_pocket(spec: str, organism: int) -> tuple[Any, Any]:
    try:
        from moir_lib.pocket import load as load_pocket
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("moir_lib.pocket"):
            raise ImportError(f"{spec!r} needs moir_lib.pocket, which is not available: {exc}") from exc
        raise
    return load_pocket(POCKET_SPECS[spec], organism=organism)


def _resolve_source(spec: str) -> tuple[str, str]:
    """``(what to pass to from_pretrained, name for messages)``."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json (not a save_pretrained folder)")
        return str(path), spec
    if path.exists() or _is_path_like(spec):
        raise FileNotFoundError(f"model folder {spec!r} not found (a hub id looks like 'org/name')")
    return spec, spec


def _load_config(source: str, name: str, revision: str | None, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as exc:
        if _offline():
            raise FileNotFoundError(
                f"model {name!r} not found locally and HF_HUB_OFFLINE=1: download it on a machine with "
                f"hub access (huggingface-cli download {name}), pass a local save_pretrained folder, or use "
                f"'pocket'"
            ) from exc
        raise FileNotFoundError(f"could not find model {name!r} on the hub or locally: {exc}") from exc
    except ValueError as exc:  # a model_type transformers does not know
        raise ValueError(f"cannot read the config of {name}: {exc}; supported families are "
                         f"{supported_families()}") from exc


# ----------------------------------------------------------------------------- fingerprint

_VOLATILE_CONFIG_KEYS = {
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "_attn_implementation",
    "_attn_implementation_autoset", "use_cache",
}


def model_fingerprint(model: PreTrainedModel, revision: str | None = None, *,
                      full_hash_max_bytes: int = 512 * 2**20, samples_per_tensor: int = 4096) -> str:
    """A 16-hex fingerprint of a model's weights, for cache keys (covariances, lm-eval results).

    Models up to ``full_hash_max_bytes`` of parameters (the pocket models) hash every
    parameter's bytes, with names, shapes and dtypes and the architecture config. Larger
    ones hash the hub id and ``revision`` plus a strided sample of ``samples_per_tensor``
    elements of each parameter: cheap on a GPU, and still sensitive to edits, since a
    MEMIT/AlphaEdit update changes almost every entry of the edited ``W_out``.
    """
    import torch

    params = list(model.named_parameters())
    total = sum(p.numel() * p.element_size() for _, p in params)
    full = total <= full_hash_max_bytes
    config = {k: v for k, v in model.config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    h = hashlib.sha256()
    h.update(type(model).__name__.encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    if not full:
        h.update(f"{getattr(model.config, '_name_or_path', '')}@{revision}".encode())
    with torch.no_grad():
        for name, p in params:
            h.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
            flat = p.detach().reshape(-1)
            if not full:
                step = max(1, flat.numel() // samples_per_tensor)
                flat = flat[::step][:samples_per_tensor]
            h.update(flat.contiguous().cpu().view(torch.uint8).numpy())
    return h.hexdigest()[:16]
