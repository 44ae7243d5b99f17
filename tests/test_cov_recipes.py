"""One recipe per named C: the Lab (chapters 01/05 and ``moir edit``, which runs through ``Lab.edit``) and
the alignment analysis (chapter 03) build the same matrices (same fingerprints, same bytes) on the micro
pocket model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from moir_lib.analysis import alignment
from moir_lib.analysis.selfgen import StrategyGeneration
from moir_lib.covariance import recipes
from moir_lib.experiments import CovSettings, Lab, PointStore
from moir_lib.pocket import MIXTURE
from moir_lib.profiles import load_profile

SEED = 7  # fresh cache entries: the first entry point computes, the others must find the same ones
OVERRIDES = {"covariance.wiki_samples": 4, "generation.n_samples": 4, "generation.max_new_tokens": 8}


def _plain(metadata: dict) -> dict:
    return json.loads(json.dumps(metadata, sort_keys=True))  # as saved (a fresh estimate holds tuples)


def _same(a, b) -> None:
    assert a.layers == b.layers and a.counts == b.counts and _plain(a.metadata) == _plain(b.metadata)
    for layer in a.layers:
        assert a.sum(layer).numpy().tobytes() == b.sum(layer).numpy().tobytes()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    profile = load_profile("pocket-micro").with_overrides(OVERRIDES)
    lab = Lab(profile, PointStore(tmp_path_factory.mktemp("lab"), shared=False),
              cov_settings=CovSettings(seed=SEED))
    loaded = lab.model()  # the micro model from the usual cache; the C's in a fresh one
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOIR_CACHE", str(tmp_path_factory.mktemp("cache")))
        labs = {name: (lab.covariance(name), lab.resources.cov_info(name))
                for name in ("wiki", "wiki-subset", "oracle", "moir", "moir-bos")}
        gen, cfg = profile.generation, profile.covariance
        labs["wiki@1"] = (lab.covariance("wiki@1"), lab.resources.cov_info("wiki@1"))
        dirs = {s: recipes.selfgen_dir(loaded.model, s, gen.n_samples, gen.max_new_tokens, SEED,
                                       profile.edit_layers) for s in ("rand1", "bos")}
        # the selfgen cache's generations
        generations = {s: StrategyGeneration(s, d, [], 0, math.nan) for s, d in dirs.items()}
        cs = alignment.covariances(loaded, profile, generations, alignment.CorpusSpecs(mixture=MIXTURE),
                                   n_docs=cfg.wiki_samples, seed=SEED, progress=False)
        yield profile, lab, labs, cs


def test_every_entry_point_builds_the_same_named_c(built):
    profile, lab, labs, cs = built
    names = {"wiki": "C_Wiki", "oracle": "C_Oracle", "moir": "C_Moir", "moir-bos": "C_Moir-bos"}
    for name, c in names.items():
        _same(labs[name][0], cs.named[c])
    # the oracle's components are the Lab's domain C's (train split, seed + 1), C_Wiki's own draw is another
    mixture = labs["oracle"][0].metadata["mixture"]
    for i, (domain, c) in enumerate(cs.components.items()):
        _same(lab.domain_covariances()[domain], c)
        assert _plain(mixture[i]["corpus"]) == _plain(c.metadata["corpus"])
        assert c.metadata["corpus"][0]["split"] == "train" and c.metadata["corpus"][0]["seed"] == SEED + 1
    _same(labs["wiki-subset"][0], cs.components["wiki"])
    assert labs["wiki"][0].metadata["fingerprint"] != cs.components["wiki"].metadata["fingerprint"]


def test_corpus_recipes_leave_bos_out_unless_asked(built):
    profile, lab, labs, cs = built
    for name in ("wiki", "oracle"):
        provenance = labs[name][1]
        assert provenance["count_bos"] is False
        assert provenance["seed"] == (SEED if name == "wiki" else SEED + 1)
    wiki, _ = labs["wiki"]
    assert wiki.metadata["tokenization"]["count_bos"] is False
    settings = recipes.CovSettings(seed=SEED, count_bos=True)
    with_bos, provenance = recipes.build("wiki", lab.model(), profile, settings)
    assert provenance["count_bos"] is True and provenance["fingerprint"] != labs["wiki"][1]["fingerprint"]
    assert with_bos.metadata["tokenization"]["count_bos"] is True
    if lab.model().adapter.bos_token_id is not None:  # one BOS key more per document
        assert with_bos.n_tokens == wiki.n_tokens + profile.covariance.wiki_samples
        assert not torch.equal(with_bos.mean(profile.edit_layers[0]), wiki.mean(profile.edit_layers[0]))


def test_a_saved_file_is_a_recipe_too(built, tmp_path):
    profile, lab, labs, cs = built
    path = labs["wiki"][0].save(tmp_path / "c.safetensors")
    stats, provenance = recipes.from_file(path, profile)
    _same(stats, labs["wiki"][0])
    assert provenance["cov"] == "file" and provenance["fingerprint"]
    with pytest.raises(ValueError, match="unknown C"):
        recipes.build(str(tmp_path / "nothing"), lab.model(), profile, recipes.CovSettings())
