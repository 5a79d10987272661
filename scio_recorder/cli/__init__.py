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
merge
    Merge the parts of an activation set written by independent workers
    (``activations.write(..., part=K, parts=N)``) into one set
    (:func:`scio_recorder.activations.merge`).

A model is ``package.module:callable`` (a class or a factory, called with
``--arg``/``--kwarg``), ``path/to/file.py:callable``, or a built-in name
(``demo``, ``resnet18_cifar``, ``mlp``, ``transformer``). Errors are one line
and exit code 2; ``--debug`` (before or after the command) shows the traceback.
While the target is imported, built and run, ``sys.argv`` is ``[TARGET]``, so
a module that parses the command line at import sees no arguments of ours; a
target that calls ``sys.exit`` is reported as an error, never as a success.

Run ``scio-recorder --help`` or ``scio-recorder COMMAND --help``.

This package is the face (:func:`main`, the entry point); the parser is in
``_parser``, the model a command runs and its inputs in ``_model``, one module
a command (``_summary``, ``_graph``, ``_check``, ``_demo``, ``_merge``), and
:func:`main` with the table of commands in ``_main``. A new command is its
module and one row of ``_main.COMMANDS`` and of the parser.
"""

from __future__ import annotations

__all__ = ["main"]

from ._main import main
