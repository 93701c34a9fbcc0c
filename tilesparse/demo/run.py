"""Run the demo: train a dense and a sparse-wide model with equal stored parameters on
the same bytes for the same steps, and report validation bits per byte."""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import json
from pathlib import Path

import torch

from . import corpus as corpus_mod
from .model import ByteGPT, ByteLSTM, lstm_sparse_hidden, parameter_counts, sparse_hidden
from .presets import PRESETS
from .recipe24 import Semi24Recipe
from .train import train

COLUMNS = ["suite", "model", "variant", "params", "nonzero_params", "hidden", "density", "block", "steps",
           "wall_s", "val_bpc", "tokens_per_s", "device"]


SEMI24_OPTIONS = dict(transposable=True, mask_every=10, mode="auto")


def _models(model: str, cfg: dict, seed: int):
    """[(variant, module, hidden, density, block)] for the dense and the sparse-wide model
    (``gpt24``: the same GPT with 2:4 MLP weights; block 0)."""
    if model == "lstm":
        embed, dense_hidden = cfg["lstm_embed"], cfg["lstm_hidden"]
        wide = lstm_sparse_hidden(embed, dense_hidden, cfg["density"], cfg["block_size"])
        torch.manual_seed(seed)
        dense = ByteLSTM(embed=embed, hidden=dense_hidden, seed=seed)
        torch.manual_seed(seed)
        sparse = ByteLSTM(embed=embed, hidden=wide, block_size=cfg["block_size"], density=cfg["density"], seed=seed)
        return [("dense", dense, dense_hidden, 1.0, 0), ("sparse", sparse, wide, cfg["density"], cfg["block_size"])]
    dense_hidden = 4 * cfg["d_model"]
    common = dict(d_model=cfg["d_model"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], context=cfg["context"],
                  dropout=cfg.get("dropout", 0.0))
    if model == "gpt24":
        torch.manual_seed(seed)
        dense = ByteGPT(mlp_hidden=dense_hidden, seed=seed, **common)
        torch.manual_seed(seed)
        sparse = ByteGPT(mlp_hidden=dense_hidden, seed=seed, semi24=SEMI24_OPTIONS, **common)
        return [("dense", dense, dense_hidden, 1.0, 0), ("sparse", sparse, dense_hidden, 0.5, 0)]
    wide = sparse_hidden(dense_hidden, cfg["density"], cfg["block_size"])
    torch.manual_seed(seed)
    dense = ByteGPT(mlp_hidden=dense_hidden, seed=seed, **common)
    torch.manual_seed(seed)
    sparse = ByteGPT(mlp_hidden=wide, block_size=cfg["block_size"], density=cfg["density"], seed=seed, **common)
    return [("dense", dense, dense_hidden, 1.0, 0), ("sparse", sparse, wide, cfg["density"], cfg["block_size"])]


def _plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_step, ax_wall) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        label = f"{r['variant']} (hidden {r['hidden']}, density {r['density']:g})"
        ax_step.plot(r["curve"]["steps"], r["curve"]["val_bpc"], marker="o", label=label)
        ax_wall.plot(r["curve"]["wall_s"], r["curve"]["val_bpc"], marker="o", label=label)
    ax_step.set_xlabel("step")
    ax_wall.set_xlabel("training wall time (s)")
    # The first evaluations (~8 bits/byte, untrained) would squash the end of the curves,
    # where the comparison is: the axis spans the values from a third of the run onward.
    tails = [v for r in results for s, v in zip(r["curve"]["steps"], r["curve"]["val_bpc"])
             if s >= r["curve"]["steps"][-1] / 3]
    for ax in (ax_step, ax_wall):
        ax.set_ylabel("validation bits per byte")
        if len(tails) > 1:
            low, high = min(tails), max(tails)
            pad = max(0.01, 0.15 * (high - low))
            ax.set_ylim(low - pad, high + pad)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _value_at(curve: dict, wall_s: float) -> float:
    """Validation bits/byte of a learning curve at training time ``wall_s`` (linear
    between evaluations; the last value past the end)."""
    times, values = curve["wall_s"], curve["val_bpc"]
    for (t0, v0), (t1, v1) in zip(zip(times, values), zip(times[1:], values[1:])):
        if t0 <= wall_s <= t1:
            return v0 + (v1 - v0) * ((wall_s - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return values[-1]


def verdict(results: list[dict]) -> dict:
    """The paper's question, answered both ways: at equal steps (the final evaluation)
    and at equal training time (both curves read at the faster model's total time).
    Negative margins: the sparse model has the lower (better) bits/byte."""
    dense = next(r for r in results if r["variant"] == "dense")
    sparse = next(r for r in results if r["variant"] == "sparse")
    common = min(dense["wall_s"], sparse["wall_s"])
    at_time = (_value_at(dense["curve"], common), _value_at(sparse["curve"], common))
    return {
        "equal_steps": {"steps": dense["steps"], "dense": dense["val_bpc"], "sparse": sparse["val_bpc"],
                        "sparse_minus_dense": round(sparse["val_bpc"] - dense["val_bpc"], 4)},
        "equal_time": {"wall_s": round(common, 3), "dense": round(at_time[0], 4), "sparse": round(at_time[1], 4),
                       "sparse_minus_dense": round(at_time[1] - at_time[0], 4)},
    }


def run_demo(*, model: str = "gpt", preset: str = "cpu", data: str | None = None, steps: int | None = None, seed: int = 0,
             density: float | None = None, out: Path | None = None, plot: bool = True, console=None) -> list[dict]:
    """Train both variants and write <date>-<device>-demo-<model>-<preset>.{csv,json,png}
    under ``out`` (with ``-d<density>`` appended when ``density`` overrides the preset's)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from ..bench import env

    console = console or Console()
    cfg = dict(PRESETS[preset])
    if density is not None:
        if model == "gpt24":
            raise ValueError("--density does not apply to --model gpt24 (2:4 keeps 2 of every 4 weights)")
        if not 0.0 < density < 1.0:
            raise ValueError(f"density must be in (0, 1), got {density}")
        cfg["density"] = density
    if steps is not None:
        cfg["steps"] = steps
        cfg["eval_every"] = min(cfg["eval_every"], steps)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    if preset != "gpu":
        console.print("[yellow]Preset 'cpu': a small run that shows both models learning. The real "
                      "comparison needs a GPU: tilesparse demo --preset gpu[/]")
    text = corpus_mod.load(data, cfg["corpus_bytes"])
    console.print(f"corpus: {text.description}; train {len(text.train)} / val {len(text.val)} bytes; "
                  f"device {env.device_name()}; both models train {cfg['steps']} steps on the same batches")
    results = []
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        for variant, net, hidden, variant_density, block in _models(model, cfg, seed):
            net.to(device)
            recipe = Semi24Recipe(cfg["steps"]) if model == "gpt24" and variant == "sparse" else None
            params, nonzero = parameter_counts(net)  # before a 2:4 model's dense fine-tune
            curve = train(net, text, cfg, device, autocast, progress, f"{variant:6s}", seed, recipe=recipe)
            tokens = cfg["steps"] * cfg["batch_size"] * cfg["context"]
            results.append({
                "suite": "demo", "model": model, "variant": variant, "params": params, "nonzero_params": nonzero,
                "hidden": hidden, "density": variant_density, "block": block, "steps": cfg["steps"],
                "wall_s": round(curve.wall_s[-1], 3), "val_bpc": round(curve.val_bpc[-1], 4),
                "tokens_per_s": round(tokens / max(curve.wall_s[-1], 1e-9), 1), "device": env.device_name(),
                "curve": curve.__dict__,
            })
            if recipe is not None:
                results[-1].update(dense_from_step=recipe.switch + 1, masked_decay=recipe.decay,
                                   flip_rates=recipe.flip_rates)
    table = Table(title=f"demo {model} ({preset}): " + ("the same model, dense and with 2:4 MLP weights"
                                                         if model == "gpt24" else "equal stored parameters")
                  + ", same steps and batches")
    for name in ("variant", "hidden", "density", "block", "params", "nonzero_params", "val_bpc", "wall_s",
                 "tokens_per_s"):
        table.add_column(name, justify="right")
    for r in results:
        table.add_row(*(str(r[c]) for c in ("variant", "hidden", "density", "block", "params", "nonzero_params",
                                             "val_bpc", "wall_s", "tokens_per_s")))
    console.print(table)
    first, last = results[0]["curve"]["val_bpc"], results[-1]["curve"]["val_bpc"]
    console.print(f"validation bits/byte: dense {first[0]:.3f} -> {first[-1]:.3f}, sparse {last[0]:.3f} -> {last[-1]:.3f}")
    answer = verdict(results)
    for name, v in (("equal steps", answer["equal_steps"]), ("equal training time", answer["equal_time"])):
        where = f"{v['steps']} steps" if "steps" in v else f"{v['wall_s']:.1f} s"
        better = ("2:4" if model == "gpt24" else "sparse-wide") if v["sparse_minus_dense"] < 0 else "dense"
        console.print(f"at {name} ({where}): dense {v['dense']:.4f}, sparse {v['sparse']:.4f} bits/byte: "
                      f"{better} is better by {abs(v['sparse_minus_dense']):.4f}")

    root = env.repo_root() or Path.cwd()
    out = Path(out) if out is not None else root / "bench" / "results"
    stem = f"{_dt.date.today().isoformat()}-{env.device_slug()}-demo-{model}-{preset}"
    if density is not None:
        stem += f"-d{density:g}"
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: r[c] for c in COLUMNS} for r in results)
    info = env.environment(bandwidth=False)
    info.update({"suite": "demo", "model": model, "preset": preset, "config": cfg, "corpus": text.description, "seed": seed,
                 "comparison": "same steps and batches; params = dense-equivalent, nonzero_params = stored",
                 "verdict": answer, "results": results})
    (out / f"{stem}.json").write_text(json.dumps(info, indent=1))
    written = [out / f"{stem}.csv", out / f"{stem}.json"]
    if plot:
        _plot(results, out / f"{stem}.png", f"byte-level {model.upper()}, {preset} preset, {env.device_name()}")
        written.append(out / f"{stem}.png")
    console.print("wrote " + ", ".join(str(p) for p in written))
    return results
