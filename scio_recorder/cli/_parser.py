"""The parser of ``scio-recorder``: the commands, their options, help and examples."""

from __future__ import annotations

import argparse
from pathlib import Path

from scio_recorder._support.files import library_version

from ._model import BUILTINS

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
            "far-OoD), for three seeds: train a small CNN, fit 35 of the 42 OoD "
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
    merge = sub.add_parser(
        "merge",
        help="merge the parts of an activation set written by independent workers",
        description="Merge the parts written by activations.write(..., part=K, "
        "parts=N) in FOLDER into one activation set (part 0's rows first, the "
        "statistics merged); a missing part, or one written with other "
        "arguments, is named.",
        epilog="examples:\n  scio-recorder merge acts",
        formatter_class=formatter,
        parents=[common],
    )
    merge.add_argument("folder", type=Path, metavar="FOLDER", help="the set's folder")
    return parser
