"""`tilesparse demo`: both variants train, learn, and are reported in the documented files."""

import csv
import json

import pytest
import torch

from tilesparse.cli import main
from tilesparse.demo.model import ByteGPT, ByteLSTM, lstm_sparse_hidden, parameter_counts, sparse_hidden
from tilesparse.demo.run import COLUMNS, run_demo


def test_sparse_variant_matches_dense_stored_parameters():
    # Equal parameter count is the premise of the comparison: the MLP weights must match
    # exactly; only the wider hidden layer's biases differ.
    common = dict(d_model=64, n_layers=2, n_heads=4, context=32)
    dense = ByteGPT(mlp_hidden=256, **common)
    wide = sparse_hidden(256, 0.25, 16)
    sparse = ByteGPT(mlp_hidden=wide, block_size=16, density=0.25, **common)
    assert wide == 1024
    dense_mlp = sum(p.numel() for n, p in dense.named_parameters() if "mlp" in n and n.endswith("weight"))
    sparse_mlp = sum(p.numel() for n, p in sparse.named_parameters() if "mlp" in n and n.endswith("weight"))
    assert dense_mlp == sparse_mlp
    dense_equiv, stored = parameter_counts(sparse)
    assert dense_equiv > stored  # the sparse model is wider than what it stores
    assert abs(stored - parameter_counts(dense)[1]) / stored < 0.02


def test_run_demo_learns_and_writes_results(tmp_path):
    results = run_demo(steps=30, out=tmp_path)
    assert [r["variant"] for r in results] == ["dense", "sparse"]
    for r in results:
        bpc = r["curve"]["val_bpc"]
        assert bpc[-1] < bpc[0] - 1.0, f"{r['variant']} did not learn: {bpc}"
        assert all(torch.isfinite(torch.tensor(bpc)))
    (csv_path,) = tmp_path.glob("*-demo-gpt-cpu.csv")
    rows = list(csv.DictReader(csv_path.open()))
    assert list(rows[0].keys()) == COLUMNS
    assert {r["variant"] for r in rows} == {"dense", "sparse"}
    assert all(r["suite"] == "demo" and float(r["val_bpc"]) > 0 and int(r["steps"]) == 30 for r in rows)
    info = json.loads(next(tmp_path.glob("*-demo-gpt-cpu.json")).read_text())
    assert info["preset"] == "cpu" and "stdlib" in info["corpus"]
    assert next(tmp_path.glob("*-demo-gpt-cpu.png")).stat().st_size > 1000


def test_lstm_variants_store_about_equal_parameters():
    wide = lstm_sparse_hidden(32, 128, 0.25, 16)
    assert wide % 16 == 0 and wide > 128
    dense = parameter_counts(ByteLSTM(embed=32, hidden=128))[1]
    sparse_equiv, sparse = parameter_counts(ByteLSTM(embed=32, hidden=wide, block_size=16, density=0.25))
    assert abs(sparse - dense) / dense < 0.05
    assert sparse_equiv > 1.5 * sparse  # the wider W_hh stores a quarter of its blocks


def test_run_demo_lstm_learns(tmp_path):
    results = run_demo(model="lstm", steps=20, out=tmp_path, plot=False)
    assert {r["model"] for r in results} == {"lstm"}
    for r in results:
        bpc = r["curve"]["val_bpc"]
        assert bpc[-1] < bpc[0] - 0.5, f"{r['variant']} did not learn: {bpc}"
    assert next(tmp_path.glob("*-demo-lstm-cpu.csv")).exists()


def test_demo_cli_rejects_bad_arguments(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--steps", "0", "--out", str(tmp_path)])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path)])
    assert exc.value.code == 2


def test_verdict_reads_both_curves_at_equal_steps_and_equal_time():
    from tilesparse.demo.run import verdict

    dense = {"variant": "dense", "steps": 4, "val_bpc": 2.0, "wall_s": 4.0,
             "curve": {"wall_s": [0.0, 2.0, 4.0], "val_bpc": [8.0, 3.0, 2.0]}}
    sparse = {"variant": "sparse", "steps": 4, "val_bpc": 1.8, "wall_s": 8.0,
              "curve": {"wall_s": [0.0, 4.0, 8.0], "val_bpc": [8.0, 2.6, 1.8]}}
    v = verdict([dense, sparse])
    assert v["equal_steps"] == {"steps": 4, "dense": 2.0, "sparse": 1.8, "sparse_minus_dense": -0.2}
    # at 4 s (the dense model's total): dense 2.0, sparse 2.6 (its second evaluation)
    assert v["equal_time"] == {"wall_s": 4.0, "dense": 2.0, "sparse": 2.6, "sparse_minus_dense": 0.6}
    sparse["curve"] = {"wall_s": [0.0, 2.0, 8.0], "val_bpc": [8.0, 4.0, 1.0]}
    assert verdict([dense, sparse])["equal_time"]["sparse"] == pytest.approx(4.0 - 3.0 * 2.0 / 6.0)


def test_demo_density_override_widens_and_names_its_files(tmp_path):
    results = run_demo(model="lstm", steps=2, density=0.5, out=tmp_path, plot=False)
    sparse = next(r for r in results if r["variant"] == "sparse")
    assert sparse["density"] == 0.5 and sparse["hidden"] == lstm_sparse_hidden(32, 128, 0.5, 16)
    assert next(tmp_path.glob("*-demo-lstm-cpu-d0.5.csv")).exists()
    with pytest.raises(ValueError, match="density"):
        run_demo(model="lstm", steps=2, density=1.0, out=tmp_path, plot=False)


def test_demo_files_without_an_override_keep_the_preset_name(tmp_path):
    run_demo(model="lstm", steps=2, out=tmp_path, plot=False)
    assert [p.name.split("-demo-")[1] for p in tmp_path.glob("*.csv")] == ["lstm-cpu.csv"]


def test_run_demo_gpt24_applies_the_recipe(tmp_path):
    """The 2:4 GPT learns, keeps 2:4 masks (masked decay, mask updates with flip rates)
    until the switch, and ends dense-fine-tuned; files named demo-gpt24."""
    results = run_demo(model="gpt24", steps=40, out=tmp_path, plot=False)
    dense, sparse = results
    assert sparse["density"] == 0.5 and sparse["hidden"] == dense["hidden"] and sparse["params"] == dense["params"]
    assert sparse["nonzero_params"] < dense["nonzero_params"]
    assert sparse["dense_from_step"] == 35  # 40 steps, the last 15% dense
    assert [s for s, _ in sparse["flip_rates"]] == [10, 20, 30]
    assert all(0.0 <= rate <= 1.0 for _, rate in sparse["flip_rates"])
    assert sparse["curve"]["val_bpc"][-1] < sparse["curve"]["val_bpc"][0] - 1.0
    assert next(tmp_path.glob("*-demo-gpt24-cpu.csv"))


def test_semi24_recipe_decays_then_densifies():
    from tilesparse.demo.recipe24 import Semi24Recipe
    from tilesparse.semi24 import SemiSparseLinear

    layer = SemiSparseLinear(16, 8, mask_every=2)
    model = torch.nn.Sequential(layer)
    recipe = Semi24Recipe(10, decay=0.5, dense_fraction=0.2)
    assert recipe.switch == 8
    layer.weight.grad = torch.zeros_like(layer.weight)
    recipe.after_backward(model, 1)
    pruned = ~layer.mask
    assert torch.equal(layer.weight.grad[pruned], 0.5 * layer.weight.detach()[pruned])
    assert torch.all(layer.weight.grad[layer.mask] == 0)
    for step in range(1, 9):
        recipe.after_step(model, step)
    assert layer.densified and [s for s, _ in recipe.flip_rates] == [2, 4, 6]
    layer.weight.grad.zero_()
    recipe.after_backward(model, 9)  # dense fine-tune: no decay
    assert torch.all(layer.weight.grad == 0)
    with pytest.raises(ValueError, match="dense_fraction"):
        Semi24Recipe(10, dense_fraction=1.0)
