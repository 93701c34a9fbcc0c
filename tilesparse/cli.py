"""The `tilesparse` command: `info` (versions, device, active paths), `bench` (timing suites against
dense cuBLAS and other block-sparse libraries), `demo` (dense vs wider block-sparse language model at
equal parameters), `tune` (measured kernel configs), `plot` and `goals` (a suite CSV's plot, its issue's
goals).

    tilesparse info
    tilesparse bench                         # 'large' suite on a GPU; a CPU smoke run without one
    tilesparse bench --quick                 # a ~2-minute subset
    tilesparse bench --suite small           # batch 1..512: achieved bandwidth (gbps, bw_fraction), graph-timed
    tilesparse bench --block 64 --density 0.1 --shape 8192x4096x4096 --ops fprop --out /tmp/b
    tilesparse tune --block 128 64 --density 0.5 0.1   # measured configs for the kernels (GPU)
    tilesparse plot bench/results/<file>.csv            # a suite CSV's plot again (CPU)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]

CPU_SUITE = "cpu-reference"


def _shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be MxNxK (X [M, K], W [N, K]), got {text!r}") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"shape dimensions must be positive, got {text!r}")
    return m, n, k


def _density(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"density must be a number, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"density must be in (0, 1], got {text!r}")
    return value


def _positive_int(name: str, minimum: int = 1):
    """An argparse type for an integer >= ``minimum`` (positive by default) whose errors
    name the option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            what = "positive" if minimum == 1 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}")
        return value

    return parse


def _positive_float(name: str, allow_zero: bool = False):
    """argparse type: a finite float > 0 (>= 0 with ``allow_zero``), the error naming ``--name``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a number, got {text!r}") from None
        if not (value >= 0 if allow_zero else value > 0) or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"--{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, "
                                             f"got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    from .bench import suite_names
    from .bench.matmul import DTYPES, OPS

    parser = argparse.ArgumentParser(prog="tilesparse", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, device and which compute paths are active")
    b = sub.add_parser("bench", help="time block-sparse matmuls against dense and peers",
                       description="Time fprop (Y = X W^T), bprop (dX = dY W), updat (dW = dY^T X on "
                       "W's blocks) and step (all three) against dense cuBLAS, torch BSR and stk.")
    b.add_argument("--suite", default="large", choices=suite_names(), help="case table to run (default: large)")
    b.add_argument("--dtype", nargs="+", choices=list(DTYPES), help="override the suite's dtypes")
    b.add_argument("--block", nargs="+", type=_positive_int("block"), help="override the block sizes")
    b.add_argument("--density", nargs="+", type=_density, help="override the densities (fraction of blocks kept)")
    b.add_argument("--shape", nargs="+", type=_shape, metavar="MxNxK", help="override the shapes: X [M, K], W [N, K]")
    b.add_argument("--ops", nargs="+", choices=list(OPS), help="override the ops")
    b.add_argument("--peers", nargs="+", choices=["tilesparse_t", "tilesparse_kmajor", "torch_bsr", "stk", "none"],
                   help="matmul suites (large, small): the peers timed beside tilesparse and dense "
                        "('none': dense only; default: the suite's, torch_bsr and stk, and in 'small' tilesparse_t: "
                        "fprop with W stored as Wᵀ, and tilesparse_kmajor: fprop / bprop on activations handed "
                        "over K-major, where the dispatcher's K-major table applies)")
    b.add_argument("--autograd-threads", choices=["on", "off"], default="on",
                   help="matmul and LSTM suites: 'off' times every method's step with torch.autograd."
                        "set_multithreading_enabled(False) (backward on the calling thread; at 8192x4096², "
                        "density 0.25 the H200's eager step went 0.76 -> 0.40 ms). Files get '-1thread'")
    b.add_argument("--quick", action="store_true", help="the suite's small subset (~2 GPU minutes)")
    b.add_argument("--out", type=Path, default=None, help="results folder (default: <repo>/bench/results)")
    b.add_argument("--no-plot", action="store_true", help="skip the PNG")
    b.add_argument("--cuda-graph", action="store_true",
                   help="time CUDA graph replays (kernel time without host launch overhead, no L2 flush); "
                   "the suite label gets '-graph' (the 'small' suite times graph replays without it)")
    d = sub.add_parser("demo", help="dense vs wider block-sparse byte-level LM at equal parameters",
                       description="Train a dense byte-level GPT and one whose MLPs are block-sparse and wider "
                       "by 1/density (equal stored parameters), on the same bytes for the same steps, and "
                       "compare validation bits per byte.")
    d.add_argument("--model", default="gpt", choices=["gpt", "lstm", "gpt24"],
                   help="gpt: block-sparse MLPs; lstm: the paper's byte-level LSTM with block-sparse "
                   "small-world weights; gpt24: the same GPT with 2:4 MLP weights (transposable masks, "
                   "masked decay, dense fine-tune over the last 15%% of steps) against dense")
    d.add_argument("--preset", default="cpu", choices=["cpu", "gpu"],
                   help="cpu: a few minutes on 2 cores (default); gpu: the real comparison on one GPU")
    d.add_argument("--data", default=None, help="a text or bytes file (default: the Python stdlib sources)")
    d.add_argument("--steps", type=_positive_int("steps"), default=None, help="override the preset's training steps")
    d.add_argument("--density", type=_density, default=None,
                   help="override the preset's block density (the sparse model widens to match parameters)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", type=Path, default=None, help="results folder (default: <repo>/bench/results)")
    d.add_argument("--no-plot", action="store_true", help="skip the PNG")
    t = sub.add_parser("tune", help="sweep kernel launch configs on this GPU and keep the faster ones",
                       description="For each case, time the current launch config and a search space of others; "
                       "configs faster by more than --min-gain go into the tuned-config table that the kernels "
                       "consult (tilesparse/kernels/tuned.py).")
    t.add_argument("--shape", nargs="+", type=_shape, metavar="MxNxK", default=[(8192, 4096, 4096)],
                   help="X [M, K], W [N, K] (default 8192x4096x4096)")
    t.add_argument("--block", nargs="+", type=_positive_int("block"), default=[128, 64, 32, 16])
    t.add_argument("--density", nargs="+", type=_density, default=[0.5, 0.25, 0.1, 0.05])
    t.add_argument("--ops", nargs="+", choices=["fprop", "bprop", "updat"], default=["fprop", "bprop", "updat"])
    t.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="fp32 is tuned with TF32")
    t.add_argument("--budget", type=_positive_float("budget"), default=300.0,
                   help="seconds in all, shared by the cases (default 300)")
    t.add_argument("--min-gain", type=_positive_float("min-gain", allow_zero=True), default=0.03,
                   help="keep a config only if this much faster (default 0.03)")
    t.add_argument("--confirm", type=_positive_int("confirm", minimum=0), default=5, metavar="ROUNDS",
                   help="time the winner and the current choice again in turn this many times each and keep the "
                        "winner only if its median is faster by --min-gain (default 5; 0 trusts the search's "
                        "single timings, whose fastest is biased low)")
    t.add_argument("--per-shape", action="store_true",
                   help="key the winners by the weight shape too: they apply to that W [N, K] only, ahead of "
                        "the shape-free entries (for a shape whose best configs differ from the others')")
    t.add_argument("--out", type=Path, default=None,
                   help="tuned-config file to update (default: $TILESPARSE_TUNED or ~/.cache/tilesparse/tuned.json)")
    t.add_argument("--dry-run", action="store_true", help="measure and report, write nothing")
    pl = sub.add_parser("plot", help="draw a suite CSV's plot again (runs merged with scripts/merge_results.py)",
                        description="The plot `tilesparse bench` draws for the CSV's suite (CPU, no GPU needed).")
    pl.add_argument("csv", type=Path, help="a suite CSV (bench/results/...csv)")
    pl.add_argument("--out", type=Path, default=None,
                    help="PNG path, or a folder for the CSV's name with .png (default: beside the CSV)")
    pl.add_argument("--title", default=None, help="default: the suite, GPU and commits of the rows")
    g = sub.add_parser("goals", help="check large-, small- or attention-suite CSVs against their issue's goals",
                       description="Point by point. Large suite: b 128 fprop and step speedups, the rate goals at "
                       "b 64 / 32 / 16 and TF32, bprop and updat against fprop, and the peers "
                       "(tilesparse/bench/large_goals.py). Small suite: the share of the copy bandwidth at 1-64 rows "
                       "(75 %, b 16 60 %) beside a bare read's, and never slower than dense at 1-512 rows "
                       "(tilesparse/bench/small_goals.py). Attention suite: local 1024's times, the speedups over "
                       "FlexAttention and causal against SDPA (tilesparse/bench/attention_goals.py).")
    g.add_argument("csv", nargs="+", type=Path,
                   help="suite CSVs (bench/results/...-large*.csv, ...-small*.csv, ...-attention*.csv)")
    g.add_argument("--failed", action="store_true", help="list only the checks not met")
    parser.subcommands = {"bench": b, "demo": d, "tune": t, "plot": pl, "goals": g}  # for errors in their own usage
    return parser


def cmd_goals(args, console) -> int:
    from .bench import attention_goals, large_goals, small_goals, suite_of_label

    def suite_name(label: str) -> str:  # the suite a row's label names (less -quick, -graph, ...), else the label
        try:
            return suite_of_label(label).name
        except KeyError:
            return label

    for path in args.csv:
        if not path.is_file():
            console.print(f"[bold red]goals: no such file: {path}[/]")
            return 2
        rows = large_goals.load(path)
        suites = {suite_name(r.get("suite", "")) for r in rows}
        console.print(f"## {path}\n")
        if suites == {"small"}:
            table = small_goals.format_table(small_goals.check_rows(rows), args.failed, small_goals.read_ceiling(rows))
        elif suites == {"large"}:
            table = large_goals.format_table(large_goals.check_rows(rows), args.failed)
        elif suites == {"attention"}:
            table = attention_goals.format_table(attention_goals.check_rows(rows), args.failed)
        else:
            console.print(f"[bold red]goals: {path} holds suite(s) {sorted(suites)}; goals exist for large, "
                          "small and attention[/]")
            return 2
        console.print(table, markup=False)
    return 0


def _out_folder(parser, path: Path | None) -> None:
    """``--out`` must be a folder or creatable as one: an existing file there (or above it) is named here,
    not met as a traceback when the first result is written."""
    if path is None:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        parser.error(f"--out {path} must be a folder: {exc.strerror or exc} ({exc.filename or path})")
    except OSError as exc:
        parser.error(f"--out {path} cannot be made: {exc.strerror or exc}")


def cmd_plot(args, console) -> int:
    from .bench import report, suite_of_label

    if not args.csv.is_file():
        console.print(f"[bold red]plot: no such file: {args.csv}[/]")
        return 2
    if args.csv.suffix.lower() != ".csv":
        console.print(f"[bold red]plot: {args.csv} is not a suite CSV (the .json beside it holds the run's "
                      f"environment; plot takes the .csv)[/]")
        return 2
    try:
        rows = report.read_csv(args.csv)
        labels = sorted({str(r["suite"]) for r in rows})
        if len(labels) != 1:
            raise ValueError(f"{args.csv}: expected rows of one suite, got {labels or 'none'}")
        suite = suite_of_label(labels[0])
    except (ValueError, KeyError) as exc:
        console.print(f"[bold red]plot: {exc}[/]")
        return 2
    gpus = sorted({str(r["gpu"]) for r in rows if r.get("gpu")})
    commits = sorted({str(r["commit"]) for r in rows if r.get("commit")})
    title = args.title or f"{labels[0]} on {', '.join(gpus) or 'unknown GPU'} ({' / '.join(commits)})"
    out = args.out or args.csv.with_suffix(".png")
    if out.is_dir():  # a folder: the CSV's name there
        out = out / args.csv.with_suffix(".png").name
    elif not out.suffix:  # (matplotlib would add .png itself, and this would name a file it never wrote)
        out = out.with_suffix(".png")
    if not (suite.plot or report.plot)(rows, out, title=title):
        console.print(f"[bold red]plot: nothing to draw in {args.csv}[/]")
        return 1
    console.print(f"wrote {out}")
    return 0


def cmd_tune(args, parser, console) -> int:
    import json

    import torch

    from .bench.tune import tune
    from .kernels import tuned

    if not torch.cuda.is_available():
        console.print("[bold yellow]tilesparse tune needs a CUDA device[/]: it times kernels on the GPU it "
                      "tunes for. Nothing was measured or written.")
        return 1
    for m, n, k in args.shape:
        for b in args.block:
            if n % b or k % b:
                parser.error(f"block {b} does not divide W [{n}, {k}] of shape {m}x{n}x{k}")
    out = args.out if args.out is not None else tuned.user_path()
    if out is None and not args.dry_run:
        parser.error("TILESPARSE_TUNED=off: give --out FILE or --dry-run")
    rows, entries, notes = tune(args.shape, args.block, args.density, args.ops, args.dtype,
                                budget_s=args.budget, min_gain=args.min_gain, per_shape=args.per_shape,
                                confirm_rounds=args.confirm, log=console.print)
    console.print(json.dumps({"cases": len(rows), "kept": len(entries)}))
    if entries and not args.dry_run:
        console.print(f"wrote {len(entries)} tuned configs to {tuned.record(entries, out, notes, device=tuned.device_header(torch.cuda.current_device()))}")
    elif not entries:
        console.print("no config beat the current ones by the required margin; nothing written")
    return 0


def cmd_demo(args, parser, console) -> int:
    from .demo import run_demo

    if args.preset == "gpu" and not __import__("torch").cuda.is_available():
        parser.error("--preset gpu needs a CUDA device")
    _out_folder(parser, args.out)
    try:
        run_demo(model=args.model, preset=args.preset, data=args.data, steps=args.steps, seed=args.seed,
                 density=args.density, out=args.out,
                 plot=not args.no_plot, console=console)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    return 0


# --------------------------------------------------------------------------- info


def cmd_info(console) -> int:
    from rich.table import Table

    from .bench import env

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for name, version in env.versions().items():
        grid.add_row(name, version)
    grid.add_row("device", env.device_name())
    for name, state in env.paths().items():
        grid.add_row(name, state)
    grid.add_row("commit", env.commit())
    console.print(grid)
    return 0


# --------------------------------------------------------------------------- bench


def _timing_description(cuda: bool, graph: bool, cold_l2: bool = False, l2_bytes: int | None = None) -> str:
    """What the JSON sidecar says about how the rows were timed."""
    from .bench.timing import L2_ROTATION_FACTOR, MAX_ROTATION_COPIES

    if not cuda:
        return "time.perf_counter median of 5 calls after 1 warm-up"
    if graph:
        text = "triton.testing.do_bench_cudagraph median (rep 100 ms; no L2 flush, no host overhead)"
    else:
        text = "triton.testing.do_bench median (warmup 25 ms, rep 100 ms, L2 flushed; host launch overhead included)"
    if cold_l2:
        l2 = f"{l2_bytes / 2**20:.0f} MiB" if l2_bytes else "size unknown"
        text += (f"; each timed call runs the op on copies of the case's operands (x, dy, W with its own tables) "
                 f"spanning {L2_ROTATION_FACTOR}x the L2 cache ({l2}; at most {MAX_ROTATION_COPIES} copies), "
                 "so they are read from HBM, not L2; ms is per op call")
    return text


def describe_table(table: dict) -> str:
    """One line naming a suite's cases: each top-level list or scalar of its table (the
    suites' tables differ: matmul shapes are [M, N, K], attention cases name layouts)."""
    parts = []
    for key, value in table.items():
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str)) for v in value):
            parts.append(f"{key} {list(value)}")
        elif isinstance(value, (list, tuple)):
            parts.append(f"{key} {len(value)} entries")
        elif isinstance(value, (int, float, str, bool)):
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def cmd_bench(args, parser, console, argv: list[str] | None = None) -> int:
    from . import bench
    from .bench import env, report
    from .bench.matmul import RunContext
    from .bench.peers import DESCRIPTIONS

    cuda = env.has_cuda()
    suite_name = args.suite
    _out_folder(parser, args.out)
    if not cuda and not suite_name.endswith("-cpu"):  # (the -cpu suites are CPU smoke tables: they run as asked)
        console.print(
            "[bold yellow]No CUDA device is present.[/] The table below is a small reference timing "
            "of the PyTorch reference path on the CPU (suite 'cpu-reference'); it says nothing "
            "about GPU performance. Run on a GPU for the real suites"
            + (f" (asked for: '{args.suite}')." if args.suite != CPU_SUITE else ".")
        )
        suite_name = CPU_SUITE
    suite = bench.get_suite(suite_name)
    overrides = {"dtypes": args.dtype, "blocks": args.block, "densities": args.density,
                 "shapes": [list(s) for s in args.shape] if args.shape else None, "ops": args.ops}
    if args.autograd_threads == "off" and args.suite not in ("large", "small", "lstm", "lstm-paper", CPU_SUITE):
        parser.error(f"--autograd-threads applies to the matmul and LSTM suites (large, small, lstm, lstm-paper), "
                     f"not {args.suite!r}")
    if args.peers:
        if args.suite not in ("large", "small", CPU_SUITE):  # the suites that time matmul peers
            parser.error(f"--peers applies to the matmul suites (large, small), not {args.suite!r}")
        if "none" in args.peers and len(args.peers) > 1:
            parser.error("--peers: 'none' cannot be combined with named peers")
        overrides["peers"] = ["dense"] + [p for p in args.peers if p != "none"]
    try:
        table = suite.prepare(suite_name, quick=args.quick, overrides=overrides)
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2
    if args.autograd_threads == "off" and not any("step" in op for op in table.get("ops", ())):
        console.print("[yellow]--autograd-threads off changes only training-step timings, and this run has none "
                      "(add --ops step)[/]")
    # graph replay: asked for, or the suite's own default (its label then stays plain)
    graph = cuda and bool(args.cuda_graph or table.get("graph"))
    label = (suite_name + ("-quick" if args.quick and suite_name != CPU_SUITE else "")
             + ("-graph" if graph and args.cuda_graph else "")
             + ("-1thread" if args.autograd_threads == "off" else ""))

    versions = env.versions()
    stamp = {"gpu": env.device_name(), "torch": versions["torch"], "triton": versions["triton"],
             "commit": env.commit()}
    root = env.repo_root() or Path.cwd()
    out_dir = args.out if args.out is not None else root / "bench" / "results"
    # a --dtype override gets its own files, so a bf16 run and an fp16/fp32 run of the
    # same suite on the same day sit side by side; the suite column keeps the label
    file_label = label + ("-" + "-".join(args.dtype) if args.dtype else "")
    stem = f"{_dt.date.today().isoformat()}-{env.device_slug(stamp['gpu'])}-{file_label}"
    csv_path, json_path, png_path = (out_dir / f"{stem}{ext}" for ext in (".csv", ".json", ".png"))

    console.print(f"suite {label} on {stamp['gpu']}: {describe_table(table)}")
    info = env.environment()  # measures copy bandwidth before the suite, on an idle GPU
    info.update({"suite": label, "argv": sys.argv[1:] if argv is None else argv, "cases": table,
                 "complete": False, "rows": None, "csv": csv_path.name, "methods": DESCRIPTIONS,
                 "timing": _timing_description(cuda, graph, bool(table.get("cold_l2")), info.get("l2_cache_bytes"))})
    ctx = RunContext(cuda=cuda, stamp=stamp, graph=graph, autograd_threads=args.autograd_threads == "on",
                     copy_bandwidth_gbs=info.get("copy_bandwidth_gbs"),
                     log=lambda text: console.print(text, soft_wrap=True, highlight=False),
                     checkpoint=lambda rows: report.write_csv(rows, csv_path))
    report.write_json(info, json_path)  # so a run cut short still leaves its environment
    rows = suite.run(label, table, ctx)
    report.write_csv(rows, csv_path)
    info.update({"complete": True, "rows": len(rows), "skipped_peers": ctx.skipped})
    report.write_json(info, json_path)
    report.print_table(rows, console, title=f"{label} on {stamp['gpu']} (speedup = dense ms / method ms)")
    for key, why in ctx.skipped.items():
        console.print(f"[dim]skipped {key}: {why}[/]")
    if info.get("copy_bandwidth_gbs"):
        console.print(f"device copy bandwidth: {info['copy_bandwidth_gbs']:.0f} GB/s")
    if info.get("host_launch_us"):
        console.print(f"host time per trivial launch: {info['host_launch_us']:.1f} µs (eager rows faster than "
                      "their calls' host time are host-bound)")
    written = [csv_path, json_path]
    plot = suite.plot or report.plot
    if not args.no_plot and plot(rows, png_path, title=f"{label} on {stamp['gpu']} ({stamp['commit']})"):
        written.append(png_path)
    console.print("wrote " + ", ".join(str(p) for p in written))
    errors = [r for r in rows if r["method"] == "tilesparse" and r["ms"] is None]
    if errors:
        console.print(f"[bold red]{len(errors)} tilesparse rows failed (see the note column)[/]")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    if not console.is_terminal:  # captured output (a GPU job's log): do not wrap at 80 columns
        console = Console(width=180)
    if args.command == "info":
        return cmd_info(console)
    if args.command == "demo":
        return cmd_demo(args, parser.subcommands["demo"], console)
    if args.command == "tune":
        return cmd_tune(args, parser.subcommands["tune"], console)
    if args.command == "goals":
        return cmd_goals(args, console)
    if args.command == "plot":
        return cmd_plot(args, console)
    return cmd_bench(args, parser.subcommands["bench"], console, argv)


if __name__ == "__main__":
    sys.exit(main())
