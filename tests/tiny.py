"""Tiny random-weight causal LMs with a word-level tokenizer, built in memory (no disk, no hub).

Shared by the covariance and corpus tests (and any test that needs a real ``transformers``
model quickly). ``tiny_loaded("llama")`` returns a :class:`moir_lib.models.LoadedModel` whose
tokenizer knows :data:`WORDS` and adds BOS; :func:`random_documents` writes seeded documents
from those words. Sizes stay small (hidden 32, intermediate 64, vocab < 256) so a forward pass
costs microseconds and the tests run beside a training job on two cores.
"""

from __future__ import annotations

import random

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from moir_lib.models import LoadedModel, ModelAdapter

HIDDEN, INTER = 32, 64
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
WORDS = (
    "the a of to and in is was for on with as by at from that this it he she they we you are be "
    "have has had not but or an one two three four five six seven eight nine ten city river king "
    "queen music film book game team war year school water fire tree stone light night day sun moon "
    "red blue green small large old new first last north south east west def return if else for "
    "while print import class self value total result x y z = + - * ( ) : , . ' \" <|user|> <|assistant|>"
).split()
VOCAB = len(SPECIALS) + len(dict.fromkeys(WORDS))


def make_tokenizer(add_bos: bool = True) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(dict.fromkeys(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def tiny_config(family: str = "llama", n_layers: int = 4) -> transformers.PretrainedConfig:
    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    if family == "llama":
        return transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER,
                                        num_hidden_layers=n_layers, num_attention_heads=2,
                                        num_key_value_heads=1, max_position_embeddings=128, **common)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=HIDDEN, n_inner=INTER, n_layer=n_layers, n_head=2,
                                       n_positions=128, **common)
    raise KeyError(family)


def tiny_loaded(family: str = "llama", n_layers: int = 4, seed: int = 0, add_bos: bool = True,
                dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A random-weight model of ``family`` (``llama`` | ``gpt2``) in eval mode, its tokenizer and adapter."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, n_layers)).to(dtype).eval()
    tokenizer = make_tokenizer(add_bos)
    return LoadedModel(model, tokenizer, ModelAdapter(model, tokenizer, name=f"tiny-{family}"))


def random_documents(n: int, seed: int = 0, min_words: int = 1, max_words: int = 40) -> list[str]:
    """``n`` seeded documents of ``min_words``..``max_words`` words from :data:`WORDS`."""
    rng = random.Random(seed)
    words = [w for w in WORDS if not w.startswith("<")]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]
