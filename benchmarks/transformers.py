"""Measure the Transformers jobs on GPT-2: recorder against hand-written hooks.

GPT-2 from a config (random weights, GPT-2's vocabulary of 50,257 tokens, no
download), CPU, one thread, eval mode, ``torch.no_grad()``, a batch of
2 x 64 tokens. Models: ``small`` (4 layers, width 128) and ``large``
(12 layers, width 512). Three measurements, each as paired ratios: every
round runs every scenario once in a freshly shuffled order, and a ratio is
the median over rounds of the two scenarios' times *in the same round* (so
slow drifts of a shared machine cancel).

* Per pass (a sample is the mean of a batch of calls lasting about 20 ms):
  ``plain`` (the bare model); recording every residual stream (the output of
  every block) with the recorder (``rec_streams``: ``rnet.record(*blocks)``,
  then ``rnet(input_ids=x)``) against one forward hook per block storing the
  output in a dict (``hand_streams``); one edit, a vector added to the
  middle block's output, with ``rnet(input_ids=x,
  activation_postproc={block: add})`` recording nothing (``rec_edit``)
  against one forward hook (``hand_edit``). Hand hooks are placed before
  each batch and removed after it, outside the timing; the recorder's edit
  places its hook inside each pass (it is part of the call).
* A 4 x 12 patching grid (4 blocks evenly spaced, the last 12 positions;
  the metric is a logit difference at the last token, with
  ``logits_to_keep=1`` on both sides): ``explain.patch_sweep`` (one clean
  pass, one corrupted pass keeping every block's output, then one pass per
  row of the grid, its 12 cells along the batch, with the blocks before the
  patched one answered from the corrupted pass: 6 passes, of which the
  rows' run only the blocks after the patch) and ``patch_sweep(...,
  reuse_prefix=False)`` (the path before the prefix was reused, and the one
  for nets without a block stack: one clean pass, then the whole grid as
  one batched pass of every block) against a loop of hooked runs (one
  clean pass keeping the streams with hooks, one hooked run per cell: 49
  passes).
* Construction: ``Recorder(model, input_data={"input_ids": x})`` (the
  default: real reference pass, then the static-flow check on fake
  tensors), with ``force_static_flow=False``, and with
  ``reference_tensors="fake"`` (one fake pass builds the table and does the
  check), each over one plain forward of the same round.

nnsight is timed when it imports (``nnsight.LanguageModel`` around the same
model, saving every block's output in one trace); otherwise the report says
it was not installed. Before timing, every scenario is checked once: the
records equal the hooks' bit for bit, the edited logits equal the hooked
ones, ``patch_sweep`` with one cell a pass (``max_batch`` = the batch size)
equals the loop bit for bit (the same float32 ops on the same rows), and
the batched grids agree with it within 1e-4 (a batched pass rounds matrix
products differently: a few float32 ulps, carried through the layers to
logit differences of magnitude ~1). A failed check prints ``CHECK
FAILED`` and exits with status 1.

``python benchmarks/transformers.py --help`` lists the options.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

# This script is named like the package it measures: run as a script, its own
# folder is first on `sys.path`, where `import transformers` would find it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
import transformers  # noqa: E402 (after the path fix)

from scio_recorder import Recorder  # noqa: E402 (after the path fix)
from scio_recorder.explain import patch_sweep  # noqa: E402 (after the path fix)

if TYPE_CHECKING:
    from collections.abc import Callable

MODELS = {"small": (4, 128), "large": (12, 512)}
BATCH, SEQ, GRID_LAYERS, GRID_POSITIONS = 2, 64, 4, 12
GOOD, BAD = 7, 11
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILED.append(what)
        print(f"CHECK FAILED: {what}", file=sys.stderr)


class Scenario:
    """A job timed by batches of calls, with hooks placed around each batch."""

    def __init__(
        self,
        call: Callable[[], Any],
        place: Callable[[], list[Any]] | None = None,
    ) -> None:
        self.call, self.place = call, place
        self.calls = 1

    def run(self) -> float:
        """Return the mean seconds per call of one batch."""
        handles = self.place() if self.place is not None else []
        try:
            start = time.perf_counter()
            for _ in range(self.calls):
                self.call()
            return (time.perf_counter() - start) / self.calls
        finally:
            for handle in handles:
                handle.remove()


def paired(jobs: dict[str, Scenario], rounds: int) -> dict[str, list[float]]:
    """Time every job once per round in a shuffled order; return the samples."""
    times: dict[str, list[float]] = {name: [] for name in jobs}
    gc.disable()
    try:
        for _ in range(rounds):
            order = list(jobs)
            random.shuffle(order)
            for name in order:
                times[name].append(jobs[name].run())
    finally:
        gc.enable()
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def build(layers: int, width: int) -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=max(1, width // 64), n_positions=1024
    )
    return transformers.GPT2LMHeadModel(config).eval()


def per_pass(model: Any, x: torch.Tensor, rounds: int) -> list[str]:
    """Recording every stream and one edit, against hand hooks (and nnsight)."""
    blocks = list(model.transformer.h)
    names = [f"transformer.h.{i}" for i in range(len(blocks))]
    middle = len(blocks) // 2
    vector = torch.randn(model.config.n_embd)
    streams = Recorder(model, input_data={"input_ids": x}, force_static_flow=False)
    streams.record(*names)
    editor = Recorder(model, input_data={"input_ids": x}, force_static_flow=False)
    kept: dict[int, Any] = {}

    def keep_all() -> list[Any]:
        return [
            b.register_forward_hook(lambda _m, _a, o, i=i: kept.__setitem__(i, o))
            for i, b in enumerate(blocks)
        ]

    def add_hook() -> list[Any]:
        return [blocks[middle].register_forward_hook(lambda _m, _a, o: o + vector)]

    def add(output: torch.Tensor) -> torch.Tensor:
        return output + vector

    edit = {names[middle]: add}
    jobs = {
        "plain": Scenario(lambda: model(input_ids=x)),
        "hand_streams": Scenario(lambda: model(input_ids=x), keep_all),
        "rec_streams": Scenario(lambda: streams(input_ids=x)),
        "hand_edit": Scenario(lambda: model(input_ids=x), add_hook),
        "rec_edit": Scenario(lambda: editor(input_ids=x, activation_postproc=edit)),
    }
    nnsight_note = "nnsight: not installed (not timed)"
    try:
        import nnsight  # type: ignore[import-not-found]  # noqa: PLC0415 (optional)
    except ImportError:
        pass
    else:
        lm = nnsight.LanguageModel(model)

        def nnsight_streams() -> None:
            with lm.trace(x):
                [lm.transformer.h[i].output.save() for i in range(len(blocks))]

        jobs["nnsight_streams"] = Scenario(nnsight_streams)
        nnsight_note = f"nnsight {nnsight.__version__}: timed"

    with torch.no_grad():
        # checks, untimed
        jobs["hand_streams"].run()
        want = dict(kept)
        out = streams(input_ids=x)
        check(
            all(
                torch.equal(streams.activations_of(n)[0], want[i])
                for i, n in enumerate(names)
            ),
            "recorded streams equal the hooks'",
        )
        handles = add_hook()
        hooked = model(input_ids=x).logits
        for handle in handles:
            handle.remove()
        edited = editor(input_ids=x, activation_postproc=edit).logits
        check(torch.equal(hooked, edited), "edited logits equal the hooked ones")
        check(not torch.equal(out.logits, edited), "the edit changes the logits")
        for job in jobs.values():  # warm-up, and batches of about 20 ms
            job.run()
            job.calls = max(1, round(0.02 / job.run()))
        times = paired(jobs, rounds)
    base = statistics.median(times["plain"])
    lines = [
        "| scenario | median ms per pass | ratio to plain | recorder / hand |",
        "|---|---:|---:|---:|",
    ]
    pairs = {"rec_streams": "hand_streams", "rec_edit": "hand_edit"}
    pairs |= {"nnsight_streams": "hand_streams"}
    for name in jobs:
        other = pairs.get(name)
        versus = f"{ratio(times, name, other):.3f}" if other else ""
        lines.append(
            f"| {name} | {1e3 * statistics.median(times[name]):.2f} | "
            f"{ratio(times, name, 'plain'):.3f} | {versus} |"
        )
    lines.append(f"\nplain: {1e3 * base:.2f} ms; {nnsight_note}.")
    return lines


def grid(model: Any, x: torch.Tensor, rounds: int) -> list[str]:
    """A 4 x 12 patching grid: patch_sweep against a loop of hooked runs."""
    n = len(model.transformer.h)
    chosen = [round(k * (n - 1) / (GRID_LAYERS - 1)) for k in range(GRID_LAYERS)]
    names = [f"transformer.h.{i}" for i in chosen]
    blocks = [model.transformer.h[i] for i in chosen]
    positions = list(range(SEQ - GRID_POSITIONS, SEQ))
    clean = x
    corrupted = x.clone()
    corrupted[:, SEQ - 6] = (x[:, SEQ - 6] + 1) % model.config.vocab_size
    rnet = Recorder(model, input_data={"input_ids": x}, force_static_flow=False)

    def metric(out: Any) -> torch.Tensor:
        logits = out.logits[:, -1]
        return (logits[:, GOOD] - logits[:, BAD]).mean()

    def sweep(**options: Any) -> torch.Tensor:
        return patch_sweep(
            rnet,
            {"input_ids": clean, "logits_to_keep": 1},
            {"input_ids": corrupted, "logits_to_keep": 1},
            names,
            metric,
            positions=positions,
            **options,
        )

    def loop() -> torch.Tensor:
        kept: dict[int, torch.Tensor] = {}
        handles = [
            b.register_forward_hook(lambda _m, _a, o, i=i: kept.__setitem__(i, o))
            for i, b in enumerate(blocks)
        ]
        model(input_ids=clean, logits_to_keep=1)
        for handle in handles:
            handle.remove()
        result = torch.empty(len(blocks), len(positions))
        for i, block in enumerate(blocks):
            for j, p in enumerate(positions):

                def put(
                    _m: Any, _a: Any, o: torch.Tensor, i: int = i, p: int = p
                ) -> Any:
                    o = o.clone()
                    o[:, p] = kept[i][:, p]
                    return o

                handle = block.register_forward_hook(put)
                try:
                    result[i, j] = metric(model(input_ids=corrupted, logits_to_keep=1))
                finally:
                    handle.remove()
        return result

    with torch.no_grad():
        want = loop()
        exact = sweep(max_batch=BATCH)
        check(
            torch.equal(exact, want),
            "patch_sweep, one cell a pass, equals the hooked loop bit for bit "
            f"(max diff {(exact - want).abs().max():.2e})",
        )
        for options in ({}, {"reuse_prefix": False}):
            got = sweep(**options)
            check(
                torch.allclose(got, want, rtol=0, atol=1e-4),
                f"patch_sweep({options}) equals the hooked loop within 1e-4 "
                f"(max diff {(got - want).abs().max():.2e})",
            )
        jobs = {
            "patch_sweep": Scenario(sweep),
            "batched": Scenario(lambda: sweep(reuse_prefix=False)),
            "hook_loop": Scenario(loop),
        }
        times = paired(jobs, rounds)
    return [
        (
            f"| grid {GRID_LAYERS} x {GRID_POSITIONS} | "
            f"{statistics.median(times['patch_sweep']):.3f} | "
            f"{statistics.median(times['batched']):.3f} | "
            f"{statistics.median(times['hook_loop']):.3f} | "
            f"{ratio(times, 'patch_sweep', 'hook_loop'):.3f} | "
            f"{ratio(times, 'batched', 'hook_loop'):.3f} |"
        )
    ]


def construction(model: Any, x: torch.Tensor, rounds: int) -> list[str]:
    """Building a Recorder, over one plain forward of the same round."""
    options = {
        "default (check)": {},
        "force_static_flow=False": {"force_static_flow": False},
        'reference_tensors="fake" (check)': {"reference_tensors": "fake"},
    }

    def make(kwargs: dict[str, Any]) -> Callable[[], Any]:
        return lambda: Recorder(model, input_data={"input_ids": x}, **kwargs)

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=x)

    jobs = {"forward": Scenario(forward)}
    jobs |= {name: Scenario(make(kwargs)) for name, kwargs in options.items()}
    for job in jobs.values():
        job.run()
    times = paired(jobs, rounds)
    lines = [f"| forward | {statistics.median(times['forward']):.3f} | 1.00 |"]
    lines += [
        f"| {name} | {statistics.median(times[name]):.3f} | "
        f"{ratio(times, name, 'forward'):.2f} |"
        for name in options
    ]
    return lines


def main() -> int:
    """Print the Markdown report; return 1 if a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,large", help="small,large")
    parser.add_argument("--rounds", type=int, default=21, help="per-pass rounds")
    parser.add_argument("--grid-rounds", type=int, default=5)
    parser.add_argument("--build-rounds", type=int, default=7)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small, few rounds"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.models, args.rounds, args.grid_rounds, args.build_rounds = "small", 3, 1, 2
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # transformers' notes on the config
    random.seed(args.seed)
    print(
        f"# benchmarks/transformers.py, {dt.datetime.now(tz=dt.UTC).date()}, "
        f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, one thread, batch {BATCH} x {SEQ}"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
    )
    for key in args.models.split(","):
        layers, width = MODELS[key]
        torch.manual_seed(args.seed)
        model = build(layers, width)
        x = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(
            f"\n## GPT-2, {layers} layers, width {width} ({params:.0f}M parameters)\n"
        )
        print(f"Per pass, {args.rounds} rounds:\n")
        print("\n".join(per_pass(model, x, args.rounds)))
        print(f"\nPatching grid, {args.grid_rounds} rounds:\n")
        print(
            "| job | patch_sweep s | `reuse_prefix=False` s | hook loop s | "
            "patch_sweep / loop | `reuse_prefix=False` / loop |\n"
            "|---|---:|---:|---:|---:|---:|"
        )
        print("\n".join(grid(model, x, args.grid_rounds)))
        print(f"\nConstruction, {args.build_rounds} rounds:\n")
        print("| scenario | median s | ratio to one forward |\n|---|---:|---:|")
        print("\n".join(construction(model, x, args.build_rounds)))
    if FAILED:
        print("\n" + "\n".join(f"CHECK FAILED: {what}" for what in FAILED))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
