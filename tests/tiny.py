"""The tests' shared helpers: tiny causal LMs built in memory or trained once (no hub), and small records.

Sizes stay small so a forward pass costs microseconds and the tests run beside a training job on two
cores. Fixtures live in ``conftest.py``; everything here is a plain function or constant.

* **Random word models** — :func:`tiny_loaded` returns a random-weight :class:`moir_lib.models.LoadedModel`
  (``llama`` or ``gpt2``, hidden 32) whose tokenizer (:func:`words_tokenizer`) knows :data:`WORDS` and adds
  BOS; :func:`random_documents` writes seeded documents from those words (covariance, corpora, faults).
* **The sampler model** — :func:`make_model` and :func:`make_tokenizer`: a 2-layer model over
  :data:`SAMPLER_WORDS` with peaky outputs and a common EOS, and the generation tests' readers
  (:func:`samples`, :func:`raw_lines`) and naive sampler (:func:`reference_sample`).
* **The facts model** — :func:`facts_model`: a 4-layer, hidden-64 Llama trained on sentences
  ``"<relation> <subject> <object> ."`` (the prompt ends on the subject, so the object is read out at the
  subject position, ROME's mechanism) until it recalls every fact; cached in
  ``$MOIR_CACHE/test-fixtures`` (about 20 s to train once, on two busy cores). With it: the facts
  (:func:`fact`), rewrite requests, a covariance and argmax efficacy for the editing tests.
* **Records** — :data:`ROME_RECORD`, a CounterFact record in the ROME format, and :func:`dump`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from moir_lib.cache import entry_dir
from moir_lib.models import LoadedModel, ModelAdapter
from moir_lib.streams import sample_uniforms

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]

# ----------------------------------------------------------------------------- random word models

HIDDEN, INTER = 32, 64
WORDS = (
    "the a of to and in is was for on with as by at from that this it he she they we you are be "
    "have has had not but or an one two three four five six seven eight nine ten city river king "
    "queen music film book game team war year school water fire tree stone light night day sun moon "
    "red blue green small large old new first last north south east west def return if else for "
    "while print import class self value total result x y z = + - * ( ) : , . ' \" <|user|> <|assistant|>"
).split()
VOCAB = len(SPECIALS) + len(dict.fromkeys(WORDS))


def words_tokenizer(add_bos: bool = True) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(dict.fromkeys(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def tiny_config(family: str = "llama", n_layers: int = 4) -> transformers.PretrainedConfig:
    common = {"vocab_size": VOCAB, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
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
    tokenizer = words_tokenizer(add_bos)
    return LoadedModel(model, tokenizer, ModelAdapter(model, tokenizer, name=f"tiny-{family}"))


def random_documents(n: int, seed: int = 0, min_words: int = 1, max_words: int = 40) -> list[str]:
    """``n`` seeded documents of ``min_words``..``max_words`` words from :data:`WORDS`."""
    rng = random.Random(seed)
    words = [w for w in WORDS if not w.startswith("<")]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]


# ----------------------------------------------------------------------------- the sampler model

SAMPLER_SPECIALS = [*SPECIALS, "<|user|>", "<|assistant|>"]
SAMPLER_WORDS = [f"w{i}" for i in range(50)]
SAMPLER_VOCAB = 64  # embedding rows 56..63 map to no token (padding rows)


def make_tokenizer() -> PreTrainedTokenizerFast:
    """The sampler model's tokenizer: :data:`SAMPLER_WORDS`, the chat tags as special tokens, BOS added."""
    vocab = {t: i for i, t in enumerate(SAMPLER_SPECIALS + SAMPLER_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=["<|user|>", "<|assistant|>"])


def make_model(seed: int = 0, family: str = "llama", max_positions: int = 64) -> transformers.PreTrainedModel:
    """A random 2-layer sampler model (``llama`` | ``gpt2``) of :data:`SAMPLER_VOCAB` rows, in eval mode."""
    torch.manual_seed(seed)
    common = {"vocab_size": SAMPLER_VOCAB, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_inner=48, n_layer=2, n_head=2,
                                         n_positions=max_positions, **common)
    else:
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=max_positions, **common)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # a peakier distribution, and EOS common enough that some samples stop early
        model.get_output_embeddings().weight.mul_(4.0)
        model.get_output_embeddings().weight[EOS].add_(0.5 * model.get_output_embeddings().weight.std())
    return model


def samples(gen_dir: Path) -> list[dict]:
    """The samples of a generation directory, as :func:`moir_lib.generation.read_samples` reads them."""
    from moir_lib import generation

    return list(generation.read_samples(gen_dir))


def raw_lines(gen_dir: Path) -> list[bytes]:
    """Every line of a generation's shards, in shard order; fails on a torn last line."""
    out = []
    for path in sorted(gen_dir.glob("shard-*.jsonl")):
        data = path.read_bytes()
        assert data == b"" or data.endswith(b"\n"), f"{path.name} ends with a torn line"
        out += data.splitlines()
    return out


def reference_sample(model, seed_ids: list[int], index: int, seed: int, max_new: int) -> list[int]:
    """One sequence, no cache, no padding: the full forward pass each step and the same inverse CDF."""
    ids = list(seed_ids)
    out = []
    for t in range(max_new):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        cdf = torch.softmax(logits, -1).cumsum(-1)
        u = sample_uniforms(seed, [index], t)[0]
        x = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
        out.append(x)
        ids.append(x)
        if x == EOS:
            break
    return out


# ----------------------------------------------------------------------------- the facts model

SUBJECTS = ["alba", "brix", "corvo", "dune", "elko", "fenn", "gorm", "hale", "ivo", "jorn", "kael", "lume"]
OBJECTS = ["rome", "oslo", "lima", "kiev", "doha", "baku", "riga", "bern"]
RELATIONS = {"home of": 0, "office of": 3}
FILLER = "the a and is was on with by at from it they we you are be has not but or one two three".split()
#: context templates for the facts model: the sampled ones (fragments of other facts) move a 4-layer
#: toy's subject keys too much for the averaged key to stand for the plain prompt's.
FIXED_TEMPLATES = [["{}"], ["the a . {}", "one two three . {}"]]
FACTS_RECIPE = {"recipe": "editing-facts", "v": 1, "layers": 4, "hidden": 64, "steps": 200, "lr": 5e-3,
                "seed": 0,
                "torch": torch.__version__, "transformers": transformers.__version__}
#: the layers the editing tests edit in the facts model
LAYERS = [0, 1]


def facts_tokenizer() -> PreTrainedTokenizerFast:
    words = list(dict.fromkeys(SUBJECTS + OBJECTS + " ".join(RELATIONS).split() + FILLER + ["."]))
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>",
                                   unk_token="<unk>")


def fact(subject: str, relation: str) -> str:
    return OBJECTS[(SUBJECTS.index(subject) * 3 + RELATIONS[relation]) % len(OBJECTS)]


def facts_documents(n: int, seed: int = 0, filler: float = 0.3) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() > filler:
                s, r = rng.choice(SUBJECTS), rng.choice(list(RELATIONS))
                parts.append(f"{r} {s} {fact(s, r)} .")
            else:
                parts.append(" ".join(rng.choice(FILLER) for _ in range(rng.randint(2, 5))) + " .")
        docs.append(" ".join(parts))
    return docs


def _train_facts(out: Path) -> None:
    r = FACTS_RECIPE
    torch.manual_seed(r["seed"])
    tok = facts_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=r["hidden"],
                                   intermediate_size=2 * r["hidden"],
                                   num_hidden_layers=r["layers"], num_attention_heads=4,
                                   num_key_value_heads=2,
                                   max_position_embeddings=64, bos_token_id=BOS, eos_token_id=EOS,
                                   pad_token_id=PAD)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=r["lr"])
    model.train()
    for step in range(r["steps"]):
        enc = tok(facts_documents(16, seed=1000 + step), padding=True, return_tensors="pt")
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)


def facts_model_dir() -> Path:
    """The trained facts model's folder (trained once, cached)."""
    entry = entry_dir("test-fixtures", FACTS_RECIPE)
    if not (entry / "config.json").is_file():
        tmp = entry.parent / f".{entry.name}.tmp-{random.randrange(1 << 30)}"
        with torch.random.fork_rng():
            _train_facts(tmp)
        try:
            tmp.rename(entry)
        except OSError:  # another process won the race
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def facts_model() -> LoadedModel:
    folder = facts_model_dir()
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    return LoadedModel(model, tok, ModelAdapter(model, tok, name="tiny-facts"))


def fact_requests(relation: str = "home of", shift: int = 1) -> list[dict]:
    """One rewrite per subject: the object ``shift`` places further in OBJECTS."""
    return [{"case_id": i, "prompt": f"{relation} {{}}", "subject": s,
             "target_new": {"str": OBJECTS[(OBJECTS.index(fact(s, relation)) + shift) % len(OBJECTS)]},
             "target_true": {"str": fact(s, relation)}} for i, s in enumerate(SUBJECTS)]


def requests() -> list[dict]:
    """The sequential tests' rewrites: every subject's ``home of`` (+1) then ``office of`` (+2), numbered."""
    reqs = fact_requests("home of", 1) + fact_requests("office of", 2)
    for i, r in enumerate(reqs):
        r["case_id"] = i
    return reqs


def argmax_hits(adapter: ModelAdapter, requests: list[dict], which: str = "target_new") -> float:
    """Share of requests whose prompt's next-token argmax is the first token of ``which``."""
    from moir_lib.editing import normalise_requests, target_token_ids

    hits = 0
    for req in normalise_requests(requests):
        ids = adapter.encode(req.filled_prompt)
        target = req.target_new if which == "target_new" else req.target_true
        first = target_token_ids(adapter.tokenizer, target, req.filled_prompt)[0]
        with torch.no_grad():
            logits = adapter.model(input_ids=torch.tensor([ids])).logits[0, -1]
        hits += int(int(logits.argmax()) == first)
    return hits / len(requests)


def evaluate(model, tokenizer, edited: list[dict]) -> dict:
    """The sequential tests' milestone metrics: argmax efficacy over the ``edited`` requests."""
    adapter = ModelAdapter(model, tokenizer)
    return {"efficacy": argmax_hits(adapter, edited), "n": len(edited)}


def facts_covariance(loaded: LoadedModel, layers: list[int]):
    from moir_lib.covariance import EstimationSettings, estimate

    return estimate(loaded, facts_documents(200, seed=5), layers, EstimationSettings(tokens_per_batch=2048),
                    cache=False, progress=False)


# ----------------------------------------------------------------------------- records

ROME_RECORD = {
    "case_id": 7,
    "pararel_idx": 11,
    "requested_rewrite": {
        "prompt": "{} is located in",
        "relation_id": "P30",
        "target_new": {"str": "Antarctica", "id": "Q51"},
        "target_true": {"str": "Africa", "id": "Q15"},
        "subject": "Angola",
    },
    "paraphrase_prompts": ["Angola belongs to the continent of"],
    "neighborhood_prompts": ["Ghana is in", "Mali is in"],
    "attribute_prompts": ["Ross Island is located in"],
    "generation_prompts": ["People around Angola speak"],
}


def dump(tmp_path: Path, data, name: str = "cf.json") -> Path:
    """``data`` as JSON in ``tmp_path / name``."""
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path
