"""The model a command runs and its inputs: built-ins, targets, weights, sizes, ids."""

from __future__ import annotations

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

from scio_recorder import Recorder
from scio_recorder._support.errors import CLIError, first_line
from scio_recorder.models import (
    demo_model,
    resnet18_cifar,
    tiny_mlp,
    transformer_encoder,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator


BUILTINS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "demo": (demo_model, (1, 3, 32, 32)),
    "resnet18_cifar": (resnet18_cifar, (1, 3, 32, 32)),
    "mlp": (tiny_mlp, (1, 16)),
    "transformer": (transformer_encoder, (1, 16, 256)),
}
"""Built-in models by name, with their default input size."""


MAX_DIM = 2**31 - 1
"""The largest size of one dimension that ``--input-size`` accepts."""


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
    cause = error  # the model's own error, under the wrappers that name a hint
    while cause.__cause__ is not None:
        cause = cause.__cause__
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


def _selector(text: str) -> Any:
    depth, sep, idx = text.partition("-")
    if sep and depth.isdigit() and idx.isdigit():
        return (int(depth), int(idx))
    return text
