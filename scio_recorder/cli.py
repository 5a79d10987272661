"""Command-line interface: ``scio-recorder``.

Subcommands
-----------
demo
    Train a small CNN on real digits, detect OoD inputs with every detector
    over three seeds, print the metrics and write pictures
    (:mod:`scio_recorder.demo`).
summary
    Print the labelled layer table of any importable model, compact (at most
    ``--width`` columns, 100 by default; ``--full``: the reference table);
    with ``--record``, mark the recorded rows, run one pass and describe the
    recorded layers.
graph
    Draw the execution graph of a model (SVG, PNG, PDF or DOT).
check
    Check a recording job on the model's input (:func:`scio_recorder.check`):
    recording, batch invariance, determinism, dtype, in-place overwrites and
    the call plan, one line each (PASS, WARN or FAIL); exit code 1 when a
    check fails.

A model is ``package.module:callable`` (a class or a factory, called with
``--arg``/``--kwarg``), ``path/to/file.py:callable``, or a built-in name
(``demo``, ``resnet18_cifar``, ``mlp``, ``transformer``). Errors are one line
and exit code 2; ``--debug`` (before or after the command) shows the traceback.
While the target is imported, built and run, ``sys.argv`` is ``[TARGET]``, so
a module that parses the command line at import sees no arguments of ours; a
target that calls ``sys.exit`` is reported as an error, never as a success.

Run ``scio-recorder --help`` or ``scio-recorder COMMAND --help``.
"""

from __future__ import annotations

__all__ = ["main"]

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from scio_recorder import CallInputs, Recorder
from scio_recorder._errors import CLIError, first_line
from scio_recorder._files import library_version
from scio_recorder._render import text_table
from scio_recorder.layers import example_inputs
from scio_recorder.models import (
    demo_model,
    resnet18_cifar,
    tiny_mlp,
    transformer_encoder,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from scio_recorder.graph import ExecutionGraph

BUILTINS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "demo": (demo_model, (1, 3, 32, 32)),
    "resnet18_cifar": (resnet18_cifar, (1, 3, 32, 32)),
    "mlp": (tiny_mlp, (1, 16)),
    "transformer": (transformer_encoder, (1, 16, 256)),
}
"""Built-in models by name, with their default input size."""


MAX_DIM = 2**31 - 1
"""The largest size of one dimension that ``--input-size`` accepts."""

MIN_WIDTH = 40
"""The narrowest ``--width`` of ``summary``."""

DEBUG_HELP = "show the traceback of an error (before or after COMMAND)"


EXAMPLES = {
    "demo": "examples:\n  scio-recorder demo --out scio-demo --seed 0\n"
    "  scio-recorder demo --all",
    "summary": (
        "examples:\n"
        "  scio-recorder summary resnet18_cifar\n"
        "  scio-recorder summary scio_recorder.models:resnet18_cifar "
        "--input-size 1,3,32,32 --record layer1.0.conv1 fc\n"
        "  scio-recorder summary timm:create_model --arg resnet18 "
        "--input-size 1,3,224,224\n"
        "  scio-recorder summary my_models.py:build --kwarg width=64 "
        "--weights model.safetensors\n"
        "  scio-recorder summary my_gpt.py:build --input-ids 1,16 --vocab-size 100"
    ),
    "graph": (
        "examples:\n"
        "  scio-recorder graph demo -o demo.svg\n"
        "  scio-recorder graph resnet18_cifar --depth 1 -o resnet.png\n"
        "  scio-recorder graph my_models.py:build --input-size 1,3,64,64 -o g.dot\n"
        "  scio-recorder graph my_gpt.py:build --input-ids 1,16 -o gpt.svg"
    ),
    "check": (
        "examples:\n"
        "  scio-recorder check resnet18_cifar --input-size 4,3,32,32\n"
        "  scio-recorder check my_models.py:build --input-size 8,16 --record fc\n"
        "  scio-recorder check my_gpt.py:build --input-ids 4,16 --padding left\n"
        "  scio-recorder check my_gpt.py:build --input-ids 4,16 --padding left "
        "--position-ids none"
    ),
}


def _depth(text: str) -> int:
    """Parse ``--depth``: an integer >= 0, the same for every command."""
    try:
        depth = int(text)
    except ValueError:
        depth = -1
    if depth < 0:
        msg = (  # argparse prefixes "argument --depth: "
            "give an integer >= 0 (0: the whole model as one row or node), "
            f"not {text!r}; leave --depth out to show every depth"
        )
        raise argparse.ArgumentTypeError(msg)
    return depth


def _width(text: str) -> int:
    """Parse ``--width``: an integer >= 40."""
    try:
        width = int(text)
    except ValueError:
        width = 0
    if width < MIN_WIDTH:
        msg = (  # argparse prefixes "argument --width: "
            f"give the most characters per line, an integer >= {MIN_WIDTH}, not "
            f"{text!r}; --full prints the reference table at its own width"
        )
        raise argparse.ArgumentTypeError(msg)
    return width


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="package.module:callable, path/to/file.py:callable, or a built-in "
        f"model ({', '.join(BUILTINS)})",
    )
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="VALUE",
        help="a positional argument of the callable (a Python literal or a string)",
    )
    parser.add_argument(
        "--kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the callable",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--input-size",
        metavar="SIZES",
        help="input shape with the batch, e.g. 1,3,32,32 (several inputs: 1,8;1,8)",
    )
    source.add_argument(
        "--input-data",
        metavar="FILE",
        help="a .safetensors file of input tensors (keys 0, 1, ...: positional; "
        "other keys: keyword arguments)",
    )
    source.add_argument(
        "--input-ids",
        metavar="SHAPE",
        help="random int64 token ids of this shape, e.g. 2,64 (a language model; "
        "with an all-ones attention_mask when its forward takes one)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        metavar="N",
        help="token ids of --input-ids are drawn from 0..N-1 (default: the "
        "model's config.vocab_size)",
    )
    parser.add_argument(
        "--weights",
        metavar="FILE",
        help="a .safetensors state dict to load (no pickle)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scio-recorder",
        description="Look inside PyTorch networks while they run.",
        epilog="Run `scio-recorder COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {library_version()}"
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    # every command accepts --debug too; SUPPRESS keeps a command's parser from
    # writing False over a --debug given before the command
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    formatter = argparse.RawDescriptionHelpFormatter
    demo = sub.add_parser(
        "demo",
        help="train a small CNN, detect OoD inputs, explain, draw (half a minute)",
        description=(
            "On real hand-written digits shipped with the package (0-5 "
            "in-distribution, 6-9 near-OoD; noise, inverted and rotated digits "
            "far-OoD), for three seeds: train a small CNN, fit 32 of the 39 OoD "
            "detectors of the catalogue (--all: every one) with one pass, print "
            "AUROC and FPR95-ID as mean ± std, and write score histograms, ROC "
            "curves, a Grad-CAM overlay and the execution graph."
        ),
        epilog=EXAMPLES["demo"],
        formatter_class=formatter,
        parents=[common],
    )
    demo.add_argument(
        "--out",
        default="scio-demo",
        type=Path,
        help="folder for the pictures (default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the first seed: the demo runs seeds N, N+1, N+2 (one with --quick; "
        "default: %(default)s)",
    )
    demo.add_argument(
        "--quick", action="store_true", help="one seed, fewer epochs: a smoke run"
    )
    demo.add_argument(
        "--all",
        action="store_true",
        help="every detector of the catalogue, the 7 slowest included "
        "(scio_recorder.demo.SLOW): about twice as long",
    )
    summary = sub.add_parser(
        "summary",
        help="print the labelled layer table of a model",
        description="Print the layer table of a model, every module call labelled "
        "depth-idx, in at most --width columns (--full: the reference table); "
        "with --record, mark the recorded rows, run one pass and describe the "
        "recorded layers.",
        epilog=EXAMPLES["summary"],
        formatter_class=formatter,
        parents=[common],
    )
    _model_options(summary)
    summary.add_argument(
        "--depth",
        type=_depth,
        metavar="N",
        help="show the table down to depth N >= 0 (default: every depth)",
    )
    summary.add_argument(
        "--full",
        action="store_true",
        help="print the reference table (torchinfo's, as print(rnet) shows it) "
        "instead of the compact one",
    )
    summary.add_argument(
        "--width",
        type=_width,
        default=100,
        metavar="N",
        help="the compact table's most characters per line (default: %(default)s)",
    )
    summary.add_argument(
        "--record",
        nargs="+",
        default=[],
        metavar="SELECTOR",
        help="labels (1-3) or qualified names to record in one pass on the input",
    )
    graph = sub.add_parser(
        "graph",
        help="draw the execution graph of a model",
        description="Run one pass and draw its execution graph: module calls "
        "labelled like the table, the operations between them, shapes on edges.",
        epilog=EXAMPLES["graph"],
        formatter_class=formatter,
        parents=[common],
    )
    _model_options(graph)
    graph.add_argument(
        "--depth",
        type=_depth,
        metavar="N",
        help="fold calls deeper than N >= 0 into their ancestor (default: none)",
    )
    graph.add_argument(
        "--roll", action="store_true", help="one node per repeated module"
    )
    graph.add_argument(
        "--expand-nested", action="store_true", help="draw containers as boxes"
    )
    graph.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="graph.svg, .png, .pdf (needs Graphviz) or .dot; default: the text form",
    )
    check = sub.add_parser(
        "check",
        help="check a recording job: recording, batch, determinism, dtype, ...",
        description="Run the model on its input a few ways and report six checks, "
        "one line each (PASS, WARN or FAIL, the largest difference, where, the "
        "likely cause): recording (outputs with and without the recorder), batch "
        "(each row alone, its padding removed), determinism (two passes), dtype "
        "(against a wider copy), inplace (records later overwritten) and calls (the "
        "call plan). Exit code 1 when a check fails. Give a batch of several rows.",
        epilog=EXAMPLES["check"],
        formatter_class=formatter,
        parents=[common],
    )
    _model_options(check)
    check.add_argument(
        "--record",
        nargs="+",
        default=[],
        metavar="SELECTOR",
        help="labels (1-3) or qualified names to check (default: every call)",
    )
    check.add_argument(
        "--rows",
        type=int,
        default=8,
        metavar="N",
        help="rows run alone, the most padded first (default: %(default)s)",
    )
    check.add_argument(
        "--padding",
        choices=("none", "left", "right"),
        default="none",
        help="with --input-ids and an attention_mask: pad row r of B by r*T/(2B) "
        "tokens on this side (default: %(default)s)",
    )
    check.add_argument(
        "--position-ids",
        choices=("from_mask", "none"),
        default="from_mask",
        help="derive position_ids from the attention mask when the model takes "
        "them (as collect and activations.write do), or pass the batch as it is "
        "(default: %(default)s)",
    )
    return parser


# ------------------------------------------------------------------ models
def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _import_file(path: str, target: str) -> Any:
    """Import ``path/to/file.py`` as a module named after the file."""
    file = Path(path)
    if not file.is_file():
        msg = f"no file {path!r} (from {target!r})"
        raise CLIError(msg)
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        msg = f"cannot import {path!r} as a Python module"
        raise CLIError(msg)
    module = importlib.util.module_from_spec(spec)
    registered = sys.modules.setdefault(file.stem, module) is module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if registered:  # no half-imported module left behind
            del sys.modules[file.stem]
        raise
    return module


def _callable(target: str) -> tuple[Callable[..., Any], tuple[int, ...] | None]:
    if target in BUILTINS:
        factory, size = BUILTINS[target]
        return factory, size
    path, sep, attr = target.rpartition(":")
    if not sep or not path or not attr:
        msg = (
            f"unknown model {target!r}: give package.module:callable, "
            f"path/to/file.py:callable, or one of {', '.join(BUILTINS)}"
        )
        raise CLIError(msg)
    module: Any
    if path.endswith(".py"):
        module = _import_file(path, target)
    else:
        try:
            module = importlib.import_module(path)
        except ImportError as error:
            msg = f"cannot import {path!r}: {error}. Is the package installed?"
            local = Path(*path.split(".")).with_suffix(".py")
            if local.is_file():
                msg = (
                    f"cannot import {path!r}: {error}. There is a file {local}: "
                    f"to load a model from a file, write {local.as_posix()}:{attr}"
                )
            raise CLIError(msg) from error
    found = module
    for part in attr.split("."):
        if not hasattr(found, part):
            msg = f"{path!r} has no attribute {attr!r}"
            raise CLIError(msg)
        found = getattr(found, part)
    if not callable(found):
        msg = (
            f"{target!r} is not callable: name a class or a function returning a model"
        )
        raise CLIError(msg)
    return found, None


@contextlib.contextmanager
def _as_program(target: str) -> Iterator[None]:
    """Import, build and run ``target`` as if it were the program.

    ``sys.argv`` is ``[target]`` inside (restored after), so a module that
    parses the command line at import sees none of our arguments, and a
    ``sys.exit`` of the target becomes a :class:`CLIError` naming it (a silent
    ``sys.exit(0)`` would otherwise look like a success). ``KeyboardInterrupt``
    passes through.
    """
    saved = sys.argv
    sys.argv = [target]
    try:
        yield
    except SystemExit as error:
        status = 0 if error.code is None else error.code
        how = (
            f"with exit code {status}"
            if isinstance(status, int)
            else f"with the message {str(status)!r}"
        )
        msg = (
            f"the target {target!r} called sys.exit {how} while the CLI imported, "
            "built or ran it, so there is no model to show; if its module runs a "
            "script or parses the command line at import, put that code under "
            '`if __name__ == "__main__":`'
        )
        raise CLIError(msg) from error
    finally:
        sys.argv = saved


@dataclasses.dataclass
class _Inputs:
    """The model's input: the Recorder's keyword arguments, and how it was given."""

    kwargs: dict[str, Any]
    option: str
    """``--input-size``, ``--input-data``, ``--input-ids`` or ``default``."""
    described: str
    """The option as given, and the shapes and dtypes it made."""


def _shapes(tensors: Any) -> str:
    items = tensors.items() if isinstance(tensors, dict) else enumerate(tensors)
    return ", ".join(
        f"{key} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        for key, t in items
    )


def _model(args: argparse.Namespace) -> tuple[nn.Module, _Inputs]:
    """Build the model and its input."""
    factory, default_size = _callable(args.target)
    positional = [_literal(a) for a in args.arg]
    keywords = {}
    for item in args.kwarg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            msg = f"--kwarg takes KEY=VALUE, got {item!r}"
            raise CLIError(msg)
        keywords[key] = _literal(value)
    # a fixed seed: the same initial weights and random inputs at every run,
    # so the printed shapes and statistics repeat (and docs/cli.md's hold)
    torch.manual_seed(0)
    net = factory(*positional, **keywords)
    if not isinstance(net, nn.Module):
        msg = f"{args.target!r} returned a {type(net).__name__}, not a torch.nn.Module"
        raise CLIError(msg)
    if args.weights:
        _load_weights(net, args.weights)
    net.eval()
    return net, _inputs(args, default_size, net)


def _load_weights(net: nn.Module, path: str) -> None:
    from safetensors.torch import load_file  # noqa: PLC0415 (only with --weights)

    if not Path(path).is_file():
        msg = f"no weights file {path!r}"
        raise CLIError(msg)
    try:
        net.load_state_dict(load_file(path))
    except Exception as error:
        msg = f"cannot load {path!r} into the model: {first_line(error)}"
        raise CLIError(msg) from error


def _memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None


def _input_sizes(
    text: str, option: str = "--input-size", dtype: torch.dtype | None = None
) -> list[tuple[int, ...]]:
    """Parse and bound ``--input-size`` (``1,3,32,32`` or ``1,8;1,8``)."""
    example = "1,3,32,32 (several inputs: 1,8;1,8)"
    if option == "--input-ids":
        example = "2,64 (batch, sequence length)"
    try:
        sizes = [tuple(int(n) for n in part.split(",")) for part in text.split(";")]
    except ValueError as error:
        msg = f"bad {option} {text!r}: give integers with the batch, e.g. {example}"
        raise CLIError(msg) from error
    for n in (n for size in sizes for n in size):
        if not 0 < n <= MAX_DIM:
            msg = (
                f"bad {option} {text!r}: {n} is not a size; give integers "
                f"from 1 to {MAX_DIM} with the batch, e.g. {example}"
            )
            raise CLIError(msg)
    dtype = dtype or torch.get_default_dtype()
    elements = sum(math.prod(size) for size in sizes)
    needed = elements * torch.empty((), dtype=dtype).element_size()
    memory = _memory_bytes()
    if memory is not None and needed > memory:
        msg = (
            f"{option} {text!r} asks for {elements:,} input values "
            f"({needed / 2**30:,.3g} GiB as {dtype}), more than this machine's "
            f"memory ({memory / 2**30:,.3g} GiB); give a smaller shape (batch 1 "
            "is enough for a table or a graph)"
        )
        raise CLIError(msg)
    return sizes


def _input_data(path: str) -> dict[str, Any]:
    """Read ``--input-data``: a safetensors file of the model's inputs."""
    from safetensors import SafetensorError  # noqa: PLC0415 (only with a file)
    from safetensors.torch import load_file  # noqa: PLC0415

    if not Path(path).is_file():
        msg = f"no input file {path!r}"
        raise CLIError(msg)
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as error:
        msg = (
            f"cannot read --input-data {path!r}: it is not a safetensors file "
            f"({error}); write one with safetensors.torch.save_file("
            "{'0': x}, 'inputs.safetensors') (keys 0, 1, ...: positional "
            "inputs; other keys: keyword inputs); torch.save/pickle files are "
            "not read"
        )
        raise CLIError(msg) from error
    if all(key.isdigit() for key in tensors):
        return {"input_data": [tensors[k] for k in sorted(tensors, key=int)]}
    return {"input_data": dict(tensors)}


def _vocab_size(args: argparse.Namespace, net: nn.Module) -> int:
    """``--vocab-size``, else the model's ``config.vocab_size``."""
    vocab = args.vocab_size
    if vocab is None:
        vocab = getattr(getattr(net, "config", None), "vocab_size", None)
        if not isinstance(vocab, int) or isinstance(vocab, bool):
            msg = (
                "--input-ids needs the vocabulary size: give --vocab-size N (the "
                "model has no config.vocab_size to read it from)"
            )
            raise CLIError(msg)
    if vocab < 1:
        msg = f"bad --vocab-size {vocab}: give the number of tokens, an integer >= 1"
        raise CLIError(msg)
    return int(vocab)


def _input_ids(args: argparse.Namespace, net: nn.Module) -> _Inputs:
    """Random token ids for ``--input-ids``, with an attention mask if taken."""
    sizes = _input_sizes(args.input_ids, "--input-ids", torch.int64)
    if len(sizes) != 1:
        msg = f"bad --input-ids {args.input_ids!r}: give one shape, e.g. 2,64"
        raise CLIError(msg)
    vocab = _vocab_size(args, net)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, sizes[0], dtype=torch.int64, generator=generator)
    try:
        parameters = inspect.signature(net.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature
        parameters = {}  # type: ignore[assignment]
    first = next(iter(parameters.values()), None)
    data: dict[str, Any] | list[Any] = [ids]
    if (
        "attention_mask" in parameters
        and first is not None
        and first.kind in {first.POSITIONAL_OR_KEYWORD, first.KEYWORD_ONLY}
    ):
        data = {first.name: ids, "attention_mask": torch.ones_like(ids)}
    described = (
        f"--input-ids {args.input_ids} (int64 token ids in 0..{vocab - 1}, "
        f"vocabulary {vocab}: {_shapes(data)})"
    )
    return _Inputs({"input_data": data}, "--input-ids", described)


def _inputs(
    args: argparse.Namespace, default: tuple[int, ...] | None, net: nn.Module
) -> _Inputs:
    if args.vocab_size is not None and not args.input_ids:
        msg = "--vocab-size goes with --input-ids SHAPE (random token ids)"
        raise CLIError(msg)
    if args.input_ids:
        return _input_ids(args, net)
    if args.input_data:
        kwargs = _input_data(args.input_data)
        described = f"--input-data {args.input_data} ({_shapes(kwargs['input_data'])})"
        return _Inputs(kwargs, "--input-data", described)
    dtype = str(torch.get_default_dtype()).removeprefix("torch.")
    if args.input_size:
        sizes = _input_sizes(args.input_size)
        described = (
            f"--input-size {args.input_size} ({dtype} tensors of shapes "
            f"{', '.join(str(list(size)) for size in sizes)})"
        )
        size = sizes[0] if len(sizes) == 1 else sizes
        return _Inputs({"input_size": size}, "--input-size", described)
    if default is None:
        msg = (
            "give the model's input: --input-size 1,3,32,32, --input-data FILE, "
            "or --input-ids 1,16 for a language model"
        )
        raise CLIError(msg)
    described = f"the default input ({dtype} of shape {list(default)})"
    return _Inputs({"input_size": default}, "default", described)


_TOKEN_IDS = re.compile(r"embedding|'indices'|Long, Int|token", re.IGNORECASE)


def _forward_error(error: BaseException, given: _Inputs, where: str = "") -> CLIError:
    """Say which argument to fix when the model's forward raised on ``given``."""
    cause = error.__cause__ or error
    text = str(cause)
    raised = (
        f"the model's forward raised {type(cause).__name__}{where}: {first_line(cause)}"
    )
    if given.option in {"--input-size", "default"} and _TOKEN_IDS.search(text):
        hint = (
            f"it was given {given.described}; if it takes token ids, use "
            "--input-ids SHAPE --vocab-size N instead of --input-size (e.g. "
            "--input-ids 1,16; --vocab-size defaults to the model's "
            "config.vocab_size)"
        )
    elif given.option == "--input-ids":
        hint = (
            f"it was given {given.described}; check the shape of --input-ids and "
            "--vocab-size (or give every input with --input-data FILE)"
        )
    else:
        hint = (
            f"it was given {given.described}; fix --input-size or --input-data "
            "(or --input-ids SHAPE for token ids)"
        )
    return CLIError(f"{raised}; {hint}")


def _recorder(net: nn.Module, given: _Inputs, **options: Any) -> Recorder:
    try:
        return Recorder(net, force_static_flow=False, **given.kwargs, **options)
    except RuntimeError as error:
        raise _forward_error(error, given) from error


# ------------------------------------------------------------------ commands
def _selector(text: str) -> Any:
    depth, sep, idx = text.partition("-")
    if sep and depth.isdigit() and idx.isdigit():
        return (int(depth), int(idx))
    return text


def _summary(args: argparse.Namespace) -> int:
    net, inputs = _model(args)
    options = {} if args.depth is None else {"depth": args.depth}
    rnet = _recorder(net, inputs, **options)
    if args.record:  # before the table, so that it marks the recorded rows
        try:
            rnet.record(*(_selector(s) for s in args.record))
        except (KeyError, ValueError, TypeError) as error:
            said = str(error).strip("'\"")
            msg = (
                f"--record {' '.join(args.record)}: {said} (`scio-recorder "
                "summary` without --record lists the labels and names to record)"
            )
            raise CLIError(msg) from error
    if args.full:
        print(rnet.summary)
    else:
        try:
            print(rnet.compact(args.width))
        except ValueError as error:
            msg = f"--width {args.width}: {error}"
            raise CLIError(msg) from error
    if not args.record:
        return 0
    call_args, call_kwargs = rnet.example_inputs()
    with torch.no_grad():
        rnet(*call_args, **call_kwargs)
    print("\nrecorded in one pass on the input above:")
    print(_recorded_table(rnet, args.width))
    return 0


def _recorded_table(rnet: Recorder, width: int) -> str:
    """Return the recorded outputs of the latest pass: shapes and statistics.

    At most ``width`` characters a line: the statistics are left out from
    the right (max, min, std) before names and shapes are cut in the middle.
    """
    header = ["label", "name", "shape", "mean", "std", "min", "max"]
    rows = []
    for label, value in rnet.activations.items():
        row = rnet.table[label]
        cells = [row.label_str, row.name or "-"]
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            v = value.detach().double()
            std = v.std() if v.numel() > 1 else 0.0
            cells += [
                str(list(value.shape)),
                f"{v.mean():+.4g}",
                f"{std:.4g}",
                f"{v.min():+.4g}",
                f"{v.max():+.4g}",
            ]
        else:
            cells += [type(value).__name__, "-", "-", "-", "-"]
        rows.append(cells)
    # first uncut, leaving statistics out; then names and shapes cut too
    for flexible in ([], [[1], [2]]):
        for shown in range(len(header), 3, -1):
            lines = text_table(
                header[:shown],
                [cells[:shown] for cells in rows],
                width=width,
                flexible=flexible,
                right=range(3, shown),
            )
            if lines is not None:
                return "\n".join(lines)
    return "\n".join(  # pragma: no cover - --width >= 40 fits 4 cut columns
        "  ".join(cells[:4]) for cells in [header, *rows]
    )


def _graph(args: argparse.Namespace) -> int:
    """Draw the graph of one pass; no table is built first (:func:`graph_of`)."""
    from scio_recorder.graph import GraphError, trace_graph  # noqa: PLC0415 (when used)

    net, given = _model(args)
    call_args, call_kwargs = example_inputs(net, given.kwargs)
    try:
        with torch.no_grad():
            graph = trace_graph(
                net, None, call_args, call_kwargs, depth=args.depth, roll=args.roll
            )
    except GraphError as error:
        failed = error.graph.failed
        where = f" at {failed.title()}" if failed is not None else ""
        if args.output is None:
            print(error.graph)
            shown = "the graph up to there is printed above"
        else:
            written = args.output
            try:
                _write_graph(error.graph, args)
            except CLIError:  # cannot render: the DOT text still shows it
                written = args.output.with_suffix(".dot")
                dot = error.graph.to_dot(expand_nested=args.expand_nested)
                written.write_text(dot, encoding="utf-8")
            shown = (
                "the graph up to there (the failing call in red) was written to "
                f"{written}"
            )
        hint = _forward_error(error, given, where)
        msg = f"{hint}; {shown}"
        raise CLIError(msg) from error
    if args.output is None:
        print(graph)
        return 0
    _write_graph(graph, args)
    print(f"wrote {args.output} ({len(graph.nodes)} nodes, {len(graph.edges)} edges)")
    return 0


def _write_graph(graph: ExecutionGraph, args: argparse.Namespace) -> None:
    out: Path = args.output
    if out.suffix == ".dot":
        out.write_text(graph.to_dot(expand_nested=args.expand_nested), encoding="utf-8")
        return
    try:
        graph.render(out, expand_nested=args.expand_nested)
    except (RuntimeError, ValueError) as error:
        msg = f"{error} (or write -o graph.dot)"
        raise CLIError(msg) from error


def _padded(data: Any, side: str) -> Any:
    """Pad row ``r`` of ``B`` by ``r * T // (2 * B)`` tokens (id 0) on ``side``."""
    if side == "none":
        return data
    if not isinstance(data, dict) or "attention_mask" not in data:
        msg = (
            f"--padding {side} needs --input-ids and a model whose forward takes an "
            "attention_mask (the padding is marked there)"
        )
        raise CLIError(msg)
    ids = next(iter(data.values())).clone()
    mask = torch.ones_like(ids)
    rows, width = ids.shape
    for row in range(rows):
        pad = row * width // (2 * rows)
        if pad:
            where = slice(None, pad) if side == "left" else slice(width - pad, None)
            mask[row, where] = 0
    return {next(iter(data)): ids * mask, "attention_mask": mask}


def _check(args: argparse.Namespace) -> int:
    from scio_recorder._batches import Positions  # noqa: PLC0415 (when used)
    from scio_recorder.checks import check_recorder  # noqa: PLC0415

    if args.rows < 1:
        msg = f"--rows {args.rows}: give the number of rows to run alone, >= 1"
        raise CLIError(msg)
    net, given = _model(args)
    rnet = _recorder(net, given)
    if args.padding != "none":
        given.kwargs["input_data"] = _padded(
            given.kwargs.get("input_data"), args.padding
        )
    call_args, call_kwargs = example_inputs(net, given.kwargs)
    mode = None if args.position_ids == "none" else args.position_ids
    call_args, call_kwargs = Positions(net, mode).add(call_args, call_kwargs)
    layers = [_selector(s) for s in args.record] or None
    try:
        report = check_recorder(
            rnet, CallInputs(call_args, call_kwargs), layers=layers, rows=args.rows
        )
    except (KeyError, ValueError, TypeError) as error:
        if layers is None:
            raise
        said = str(error).strip("'\"")
        msg = f"--record {' '.join(args.record)}: {said}"
        raise CLIError(msg) from error
    print(report)
    return 1 if report.failed else 0


def _demo(args: argparse.Namespace) -> int:
    out: Path = args.out
    # Checked before the run (seconds), not when the pictures are drawn.
    if out.exists() and not out.is_dir():
        msg = f"--out {out} is a file, not a folder: give a folder for the pictures"
        raise CLIError(msg)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        msg = f"--out {out}: cannot make that folder ({error.strerror}); give another"
        raise CLIError(msg) from error
    from scio_recorder.demo import run_demo  # noqa: PLC0415 (heavier imports)

    if args.all:
        run_demo(out, seed=args.seed, quick=args.quick, detectors=None)
    else:
        run_demo(out, seed=args.seed, quick=args.quick)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo,
    "summary": _summary,
    "graph": _graph,
    "check": _check,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``scio-recorder`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments without the program name; ``sys.argv[1:]`` if
        None.

    Returns
    -------
    int
        Exit status: 0, or 2 for an error (printed as one line).

    Raises
    ------
    SystemExit
        On ``--help``, ``--version`` or a usage error, as :mod:`argparse` does.

    Examples
    --------
    >>> main(["summary", "nope"])
    2

    """
    args = _build_parser().parse_args(argv)
    target = getattr(args, "target", None)
    try:
        with contextlib.nullcontext() if target is None else _as_program(target):
            status = COMMANDS[args.command](args)
            sys.stdout.flush()  # a closed pipe fails here, not at the exit
            return status
    except BrokenPipeError:
        # The reader left (`scio-recorder summary ... | head`): stop quietly, as
        # Unix tools do; stdout goes nowhere so that the exit's flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as error:
        if args.debug:
            raise
        text = str(error).strip().replace("\n", " ") or type(error).__name__
        if not isinstance(error, CLIError):
            text = f"{type(error).__name__}: {text}"
        print(
            f"scio-recorder: error: {text} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 2
