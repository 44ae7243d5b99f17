"""The pocket tokenizer: a byte-level BPE trained deterministically on the pocket corpora.

Wrapped as a :class:`transformers.PreTrainedTokenizerFast` with BOS/EOS/PAD, the chat
tags ``<|user|>`` and ``<|assistant|>`` as single special tokens, and a jinja
``chat_template`` so that ``tokenizer.apply_chat_template`` works as on real models.
Encoding prepends BOS (as Llama tokenizers do).
"""

from __future__ import annotations

import itertools
import logging

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from moir_lib.pocket.corpora import ASSISTANT, DOMAINS, USER, iter_documents
from moir_lib.pocket.world import World

__all__ = ["BOS", "EOS", "PAD", "SPECIAL_TOKENS", "CHAT_TEMPLATE", "train_tokenizer"]

log = logging.getLogger(__name__)

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, PAD, USER, ASSISTANT)

#: Renders ``chat_text`` of :mod:`moir_lib.pocket.corpora` after BOS; only user/assistant roles.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('the pocket chat template knows only the roles user and assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def train_tokenizer(
    world: World, vocab_size: int, docs_per_domain: int, seed: int = 0
) -> PreTrainedTokenizerFast:
    """Train the BPE on ``docs_per_domain`` training documents of every domain (deterministic)."""
    texts = list(
        itertools.chain.from_iterable(
            iter_documents(d, "train", docs_per_domain, seed=seed + 1000, world=world) for d in DOMAINS
        )
    )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bpe.token_to_id(BOS))]
    )
    log.info("trained a %d-token byte-level BPE on %d documents", bpe.get_vocab_size(), len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
