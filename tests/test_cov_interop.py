"""moir_lib.covariance.interop: C through the MEMIT / AlphaEdit / EasyEdit ``layer_stats`` cache and back.

Round trips are exact up to the file's precision; the golden case's C (``inputs/C.npz`` of the
reference folder) rebuilt through the import path gives the reference's ΔW, and a C with full
float64 sums, read with the editors' own loader semantics, gives the edit made inside this suite.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from moir_lib.cli import main
from moir_lib.covariance import CovarianceStats, interop
from moir_lib.editing.reference import REFERENCE_DIR

LLAMA_SITE = "model.layers.{}.mlp.down_proj"


def random_stats(layers=(1, 3), d: int = 6, tokens: int = 40, seed: int = 0, documents: int | None = 7
                 ) -> CovarianceStats:
    g = torch.Generator().manual_seed(seed)
    sums = {}
    for layer in layers:
        K = torch.randn(tokens, d, generator=g, dtype=torch.float64) * 3.0
        sums[layer] = K.T @ K
    corpus = [{"name": "rand1", "documents": documents, "tokens": tokens}] if documents else []
    meta = {"model": "fp", "model_name": "tiny", "key_site": LLAMA_SITE, "key_dim": d, "corpus": corpus}
    return CovarianceStats.from_sums(sums, tokens, meta)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------- files and round trips


def test_memit_layout_keys_and_float64_round_trip_are_exact(tmp_path: Path) -> None:
    stats = random_stats()
    export = interop.export_stats(stats, tmp_path, model_name="meta-llama/Llama-3.1-8B", fmt="memit")
    want = (tmp_path / "meta-llama_Llama-3.1-8B" / "moir_stats"
            / "model.layers.3.mlp.down_proj_float64_mom2_7.npz")
    assert export.files[3] == want and want.is_file()
    with np.load(want, allow_pickle=False) as f:  # what tally() reads: no pickled objects
        assert set(f.files) == {"mom2.constructor", "mom2.count", "mom2.mom2", "sample_size"}
        assert f["mom2.mom2"].dtype == np.float64
        assert int(f["mom2.count"]) == 40 and int(f["sample_size"]) == 7
        np.testing.assert_array_equal(f["mom2.mom2"], stats.sum(3).numpy())
    back = interop.import_stats(tmp_path)
    assert back.layers == stats.layers and back.counts == stats.counts and back.dim == stats.dim
    for layer in stats.layers:
        assert torch.equal(back.sum(layer), stats.sum(layer))
        assert torch.equal(back.mean(layer), stats.mean(layer))
    assert back.metadata["key_site"] == LLAMA_SITE and back.metadata["imported"]["n_samples"] == 7
    # what the editors' get_cov returns: the per-token mean, in float32
    assert torch.equal(interop.loader_moment(want), stats.mean(3).float())


def test_float32_files_round_once_then_round_trip_bit_exactly(tmp_path: Path) -> None:
    stats = random_stats(seed=1)
    interop.export_stats(stats, tmp_path / "a", model_name="m", fmt="memit",
                         mom2=interop.Mom2Hparams(precision="float32"))
    first = interop.import_stats(tmp_path / "a")
    for layer in stats.layers:
        err = (first.sum(layer) - stats.sum(layer)).abs() / stats.sum(layer).abs().clamp_min(1e-300)
        assert 0 < float(err.max()) <= 2.0 ** -24  # float32 rounding, no more
    interop.export_stats(first, tmp_path / "b", model_name="m", fmt="memit",
                         mom2=interop.Mom2Hparams(precision="float32"))
    second = interop.import_stats(tmp_path / "b")
    assert second.counts == first.counts
    for layer in stats.layers:
        assert torch.equal(second.sum(layer), first.sum(layer))


def test_easyedit_layout_and_hyperparameter_lines(tmp_path: Path) -> None:
    stats = random_stats()
    export = interop.export_stats(stats, tmp_path, model_name="./hugging_cache/llama-3-8b", fmt="easyedit",
                                  mom2=interop.Mom2Hparams(dataset="moir-rand1", n_samples=100_000),
                                  layers=[3])
    assert list(export.files) == [3]
    assert export.files[3] == (tmp_path / "llama-3-8b" / "moir-rand1_stats"
                               / "model.layers.3.mlp.down_proj_float64_mom2_100000.npz")
    lines = export.lines()
    assert f'stats_dir: "{tmp_path.resolve()}"' in lines
    for line in ('mom2_dataset: "moir-rand1"', "mom2_n_samples: 100000", 'mom2_dtype: "float64"',
                 "layers: [3]", f'rewrite_module_tmp: "{LLAMA_SITE}"'):
        assert line in lines
    alpha = interop.export_stats(stats, tmp_path / "a", model_name="org/name", fmt="alphaedit")
    assert alpha.files[1].parent.parent == tmp_path / "a" / "name"  # the AlphaEdit repository's folder
    lines = alpha.lines()
    assert lines[0].startswith("# globals.yml: STATS_DIR:") and '"mom2_n_samples": 7,' in lines


def test_bad_inputs_are_refused_before_writing(tmp_path: Path) -> None:
    stats = random_stats()
    out = tmp_path / "out"
    cases = [({"fmt": "rome"}, "unknown statistics format"),
             ({"mom2": interop.Mom2Hparams(precision="float16")}, "float64 or float32"),
             ({"module_template": "model.layers.mlp"}, "must contain"),
             ({"mom2": interop.Mom2Hparams(dataset="a/b")}, "one path component"),
             ({"layers": [2]}, r"layers \[2\] are not in"),
             ({"mom2": interop.Mom2Hparams(n_samples=0)}, "positive integer")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            interop.export_stats(stats, out, **{"model_name": "m", **kwargs})
    with pytest.raises(ValueError, match="pass n_samples"):
        interop.export_stats(random_stats(documents=None), out, model_name="m")
    with pytest.raises(ValueError, match="no usable folder name"):
        interop.export_stats(stats, out, model_name="models/llama/", fmt="easyedit")
    assert not out.exists()


def test_from_sums_refuses_what_is_not_a_second_moment() -> None:
    S = np.eye(4)
    stats = CovarianceStats.from_sums({2: S}, {2: np.int64(5)})
    assert stats.count(2) == 5 and torch.equal(stats.mean(2), torch.from_numpy(S) / 5)
    for sums, counts, match in (({2: np.triu(np.ones((4, 4)))}, 5, "not symmetric"),
                                ({2: S, 3: np.eye(5)}, 5, "every sum must be"),
                                ({2: np.full((4, 4), np.inf)}, 5, "NaN or infinite"),
                                ({2: S}, {3: 5}, "counts for layers"),
                                ({2: S}, -1, "negative")):
        with pytest.raises(ValueError, match=match):
            CovarianceStats.from_sums(sums, counts)


def test_bad_directories_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no statistics directory"):
        interop.import_stats(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no layer_stats"):
        interop.import_stats(tmp_path)
    stats = random_stats()
    interop.export_stats(stats, tmp_path, model_name="m", mom2=interop.Mom2Hparams("wikipedia", 100_000))
    interop.export_stats(stats, tmp_path, model_name="m", mom2=interop.Mom2Hparams("moir"))
    with pytest.raises(ValueError, match="holds several statistics"):
        interop.import_stats(tmp_path)
    assert interop.import_stats(tmp_path, dataset="wikipedia").metadata["imported"]["n_samples"] == 100_000
    with pytest.raises(ValueError, match=r"no second-moment file for layers \[2\]"):
        interop.import_stats(tmp_path, dataset="moir", layers=[2])
    folder = tmp_path / "m" / "moir_stats"
    np.savez(folder / "model.layers.1.mlp.up_proj_float64_mom2_7.npz", **{"mom2.mom2": np.eye(6),
                                                                          "mom2.count": np.array(3)})
    with pytest.raises(ValueError, match="layer 1 appears twice"):
        interop.import_stats(tmp_path, dataset="moir")
    (folder / "model.layers.1.mlp.up_proj_float64_mom2_7.npz").unlink()
    bad = folder / "model.layers.2.mlp.down_proj_float64_mom2_7.npz"
    for content, match in (({"mean": np.zeros(6)}, "not a second moment"),
                           ({"mom2.mom2": np.ones((6, 5)), "mom2.count": np.array(3)}, "square float matrix"),
                           ({"mom2.mom2": np.eye(6), "mom2.count": np.array(0)}, "positive integer"),
                           ({"mom2.mom2": np.full((6, 6), np.nan), "mom2.count": np.array(3)}, "NaN")):
        np.savez(bad, **content)
        with pytest.raises(ValueError, match=match):
            interop.import_stats(tmp_path, dataset="moir")
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable"):
        interop.import_stats(tmp_path, dataset="moir")
    np.savez(bad, **{"mom2.mom2": np.eye(5), "mom2.count": np.array(3)})
    with pytest.raises(ValueError, match="different widths"):
        interop.import_stats(tmp_path, dataset="moir")


def test_cli_export_with_projectors_then_import(tmp_path: Path, capsys) -> None:
    from moir_lib.editing.alphaedit import null_space_projector

    stats = random_stats(d=8, tokens=6)  # rank 6 of 8: a proper null space at any small τ
    src = stats.save(tmp_path / "C.safetensors")
    root = tmp_path / "stats"
    assert main(["cov", "export", str(src), "--format", "easyedit", "--model-name", "org/tiny", "--out",
                 str(root), "--tau", "1e-6"]) == 0
    printed = capsys.readouterr().out
    assert f'P_loc: "{(root / interop.PROJECTOR_FILE).resolve()}"' in printed
    assert "mom2_n_samples: 7" in printed and "null space of dimension 2 of 8" in printed
    P = torch.load(root / interop.PROJECTOR_FILE)
    assert P.dtype == torch.float32 and P.shape == (2, 8, 8)
    for i, layer in enumerate(stats.layers):
        assert torch.equal(P[i], null_space_projector(stats.mean(layer), 1e-6)[0].float())
    assert main(["cov", "export", str(src), "--format", "memit", "--model-name", "org/tiny", "--out",
                 str(tmp_path / "x"), "--tau", "1e-6"]) == 2
    assert "--tau" in capsys.readouterr().err
    out = tmp_path / "imported.safetensors"
    assert main(["cov", "import", str(root), "--model-name", "org/tiny", "--out", str(out)]) == 0
    back = CovarianceStats.load(out)
    for layer in stats.layers:
        assert torch.equal(back.sum(layer), stats.sum(layer))


# ----------------------------------------------------------------------------- the golden case


@pytest.fixture(scope="module")
def golden() -> Path:
    """``data/reference``: part of the repository, so a missing golden case fails the tests."""
    assert (REFERENCE_DIR / "inputs" / "C.npz").is_file(), f"the golden case is missing from {REFERENCE_DIR}"
    return REFERENCE_DIR


def _golden_stats(root: Path) -> tuple[dict[int, np.ndarray], CovarianceStats]:
    """The golden ``C_ℓ`` (float32 per-token means) as statistics: sums ``C_ℓ · N`` (exact in float64)."""
    with np.load(root / "inputs" / "C.npz") as f:
        C = {int(k[1:]): f[k] for k in f.files if k[:1] == "C" and k[1:].isdigit()}
        count, docs = int(f["count"]), int(f["n_sentences"])
    meta = {"key_site": LLAMA_SITE, "corpus": [{"name": "golden", "documents": docs, "tokens": count}]}
    return C, CovarianceStats.from_sums({k: v.astype(np.float64) * count for k, v in C.items()}, count, meta)


def _memit_cases(root: Path):
    from moir_lib.editing.reference import load_reference

    folder = load_reference(root)
    return folder, [c for c in folder.cases if c.method == "memit"]


def test_golden_C_through_the_import_path_gives_the_reference_dW(golden: Path, tmp_path: Path) -> None:
    from moir_lib.editing.alphaedit import null_space_projector
    from moir_lib.editing.memit import memit_delta
    from moir_lib.editing.reference import TOLERANCES, _resid

    C, stats = _golden_stats(golden)
    export = interop.export_stats(stats, tmp_path, model_name="stories260K", fmt="memit")
    imported = interop.import_stats(tmp_path)
    folder, cases = _memit_cases(golden)
    assert cases
    for layer, path in export.files.items():
        # the C injected into the reference's cache, bit for bit
        assert torch.equal(interop.loader_moment(path), torch.from_numpy(C[layer]))
        assert torch.equal(imported.mean(layer), torch.from_numpy(folder.C[layer]))
    worst_ours, worst_ref = 0.0, 0.0
    for case in cases:
        layers, lam = [int(x) for x in case.hparams["layers"]], float(case.hparams["mom2_update_weight"])
        for i, layer in enumerate(layers):
            K = torch.from_numpy(case.expected[f"K{layer}"])
            R = torch.from_numpy(_resid(case, layers, i))
            ours = memit_delta(R, K, torch.from_numpy(folder.C[layer]), lam)  # moir check-reference's
            via_import = memit_delta(R, K, imported.mean(layer), lam)
            worst_ours = max(worst_ours, rel(via_import, ours))
            worst_ref = max(worst_ref, rel(via_import, torch.from_numpy(case.expected[f"dW{layer}"])))
    print(f"golden ΔW through import: rel diff to check-reference's {worst_ours:.2e}, "
          f"to the reference's {worst_ref:.2e}")
    assert worst_ours == 0.0 and worst_ref <= TOLERANCES["memit"]["closed_form_dW"]
    alpha = next((c for c in folder.cases if c.method == "alphaedit"), None)
    if alpha is not None:  # AlphaEdit's projector from the imported C: the same null space
        tau = float(alpha.hparams["nullspace_threshold"])
        for layer in alpha.hparams["layers"]:
            P_imp, info = null_space_projector(imported.mean(layer), tau)
            assert torch.equal(P_imp, null_space_projector(torch.from_numpy(folder.C[layer]), tau)[0])


def test_a_float64_C_read_by_the_editors_loader_gives_the_same_edit(golden: Path, tmp_path: Path) -> None:
    """C_Moir has full float64 sums: exported, then read as get_cov reads it (mean, cast to float32),
    it gives the edit made inside this suite (from ``mean()``, float64) within 1e-6 relative."""
    from moir_lib.editing.memit import memit_delta
    from moir_lib.editing.reference import _resid

    C, golden_stats = _golden_stats(golden)
    g = torch.Generator().manual_seed(0)
    sums = {}
    for layer in golden_stats.layers:  # the golden sums plus a full-precision PSD term: no float32 values
        E = torch.randn(golden_stats.dim, golden_stats.dim, generator=g, dtype=torch.float64)
        sums[layer] = golden_stats.sum(layer) + 1e-3 * float(golden_stats.sum(layer).diagonal().mean()) * (
            E @ E.T) / golden_stats.dim
    moir = CovarianceStats.from_sums(sums, golden_stats.counts, golden_stats.metadata)
    _, cases = _memit_cases(golden)
    worst = {}
    for precision in ("float64", "float32"):
        export = interop.export_stats(moir, tmp_path / precision, model_name="stories260K",
                                      mom2=interop.Mom2Hparams(precision=precision))
        for case in cases:
            layers, lam = [int(x) for x in case.hparams["layers"]], float(case.hparams["mom2_update_weight"])
            for i, layer in enumerate(layers):
                K = torch.from_numpy(case.expected[f"K{layer}"])
                R = torch.from_numpy(_resid(case, layers, i))
                inside = memit_delta(R, K, moir.mean(layer), lam)
                outside = memit_delta(R, K, interop.loader_moment(export.files[layer]), lam)
                worst[precision] = max(worst.get(precision, 0.0), rel(outside, inside))
    measured = ", ".join(f"{k} file {v:.2e}" for k, v in worst.items())
    print(f"ΔW, the editors' loader against this suite: {measured}")
    assert 0 < worst["float64"] <= 1e-6 and worst["float32"] <= 1e-6


def test_check_reference_on_the_imported_C_matches_the_original(golden: Path, tmp_path: Path) -> None:
    """End to end (keys, z, per-layer updates): the reference check on a folder whose C.npz was
    rebuilt from the imported statistics reports the same errors as on the original folder."""
    from moir_lib.editing.reference import check_reference

    _, stats = _golden_stats(golden)
    interop.export_stats(stats, tmp_path / "stats", model_name="stories260K")
    imported = interop.import_stats(tmp_path / "stats")
    rows = {}
    for name in ("original", "imported"):
        dst = tmp_path / name
        (dst / "expected").mkdir(parents=True)
        (dst / "model").symlink_to((golden / "model").resolve())
        shutil.copytree(golden / "inputs", dst / "inputs")
        shutil.copy(golden / "expected" / "memit_lambda15000.npz", dst / "expected")
        if name == "imported":
            np.savez(dst / "inputs" / "C.npz", count=stats.n_tokens,
                     **{f"C{layer}": imported.mean(layer).numpy() for layer in imported.layers})
        rows[name] = check_reference(dst)
    assert all(r["passed"] for r in rows["imported"]), json.dumps(rows["imported"], indent=1)
    pairs = list(zip(rows["original"], rows["imported"], strict=True))
    assert all((a["stage"], a["layer"]) == (b["stage"], b["layer"]) for a, b in pairs)
    diffs = [abs(a["rel_err"] - b["rel_err"]) for a, b in pairs if a["stage"] in ("dW", "closed_form_dW")]
    print(f"end-to-end dW rel_err, imported C against the original: max |difference| {max(diffs):.2e}")
    assert max(diffs) == 0.0
