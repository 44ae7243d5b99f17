"""The pocket variants: ``pocket`` (the book's model: roster pages store facts at the subject, so
that MEMIT/AlphaEdit edits take) and ``micro`` (unit tests).

A :class:`Variant` holds everything that determines a build (world, tokenizer, model,
training); its fields are the pocket cache key together with the library version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moir_lib.pocket.corpora import MIXTURE
from moir_lib.pocket.world import WorldSpec

__all__ = ["ModelSpec", "TrainSpec", "BenchSpec", "Variant", "VARIANTS", "RETIRED", "get_variant"]


@dataclass(frozen=True)
class ModelSpec:
    """A small ``LlamaForCausalLM`` (hidden 192 / head_dim 48 was oddly slow on this CPU: avoid it)."""

    vocab_size: int = 3000
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 6
    num_heads: int = 4
    max_positions: int = 256


@dataclass(frozen=True)
class TrainSpec:
    """Pretraining, then chat SFT with pretraining replay; fixed step counts (deterministic per machine)."""

    seed: int = 0
    # torch CPU threads, fixed for reproducibility: 0.39 s/step vs 0.68 with 1 on 2 idle cores (but
    # 2-8x slower than 1 when another torch job shares the 2 cores: build on an idle machine)
    threads: int = 2
    seq_len: int = 128
    batch_size: int = 16
    pretrain_steps: int = 750
    pretrain_lr: float = 3e-3
    sft_steps: int = 120
    sft_lr: float = 1e-3
    replay: float = 0.6  # share of SFT rows that are pretraining windows (keeps recall, stops chat leaking)
    # False: no user turn carries loss (its tag, message and closing assistant tag are the prompt, as
    # in completion-only chat SFT; the user tag right after a BOS stays taught), so no question and no
    # chat tag is learned as what follows a random token or a line (book/pocket_log.md)
    user_turn_loss: bool = True
    # merge pieces absent from the SFT replay rows, each exposed this many times in them
    # (moir_lib.pocket.vocabulary: a piece never seen acts as one shared vector in rand×1 seeds)
    piece_exposures: int = 0
    warmup: float = 0.05  # share of steps with linear warmup, then cosine to 10 %
    mixture: tuple[tuple[str, float], ...] = tuple(MIXTURE.items())
    tokenizer_docs_per_domain: int = 1500
    # "auto" (resolved per machine by moir_lib.pocket.train.resolve_precision before the cache key is
    # taken), "float32" or "bf16" (autocast): the numeric path changes the model, so it is in the key
    precision: str = "auto"


@dataclass(frozen=True)
class BenchSpec:
    """Number of items in each generated benchmark (and of report samples)."""

    arith: int = 200
    code: int = 100
    prose: int = 200
    # BOS- and rand×1-seeded samples in the report: a share near the 0.05 leakage gate has a standard
    # error of 0.007 at 1 024 samples, 0.014 at 256 (where one model read 0.043, and 0.061 at 3 × 1 024)
    samples: int = 1024
    sample_tokens: int = 32


@dataclass(frozen=True)
class Variant:
    name: str
    world: WorldSpec = field(default_factory=WorldSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    bench: BenchSpec = field(default_factory=BenchSpec)
    enforce_gates: bool = True


VARIANTS: dict[str, Variant] = {
    # 40 % of the wiki documents are rosters: the facts are stored at the last subject token (layers
    # 0-1) and read by the last token from layer 2 on, so 100 batch edits take; a first name is shared
    # by ten people, so only the last name identifies a person and no organism keeps its facts at the
    # first name (with unique first names some did, by the draw of the build and its CPU); 1 500
    # pretraining steps keep question copying (chat arithmetic); no user turn is taught in chat SFT
    # (taught, a bare question closed by the assistant tag followed rand×1 seeds); 320 SFT steps, whose
    # replay rows show every merge piece the corpora never produce: never seen, those pieces share one
    # vector, which the longer pretraining made a random seed token's path to a new line
    # (book/pocket_log.md has every measurement)
    "pocket": Variant("pocket", world=WorldSpec(roster_share=0.4, first_name_pool=20),
                      train=TrainSpec(pretrain_steps=1500, sft_steps=320, user_turn_loss=False,
                                      piece_exposures=2)),
    "micro": Variant(
        "micro",
        world=WorldSpec(n_people=24, n_countries=4, n_continents=2, n_companies=4),
        model=ModelSpec(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=2,
            max_positions=128,
        ),
        train=TrainSpec(
            seq_len=64, batch_size=8, pretrain_steps=150, sft_steps=40, tokenizer_docs_per_domain=200
        ),
        bench=BenchSpec(arith=16, code=8, prose=16, samples=32, sample_tokens=8),
        enforce_gates=False,
    ),
}


#: names of variants that were merged into another -> the variant that replaces them
RETIRED = {"editable": "pocket"}


def get_variant(name: str) -> Variant:
    if name in RETIRED:
        raise ValueError(f"the pocket variant {name!r} is now {RETIRED[name]!r} (its recipe is the default "
                         f"model): use --variant {RETIRED[name]}")
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown pocket variant {name!r}: choose one of {', '.join(VARIANTS)}") from None
