"""The library's own exceptions and warnings, in one module.

Each is re-exported where users import it: :class:`CallPlanError` and
:class:`InPlaceWarning` from ``scio_recorder`` (and
``scio_recorder.recorder``), :class:`NotFittedError` from
``scio_recorder.ood``; :class:`CLIError` is the command line's own. Each
subclasses the builtin a caller would catch without knowing it
(``RuntimeError``, ``UserWarning``, ``Exception``).

Two stay beside what they carry, which this module (below every other)
cannot name without an import circle: ``scio_recorder.graph.GraphError``
holds the execution graph up to the failure, and the engine's
``EarlyExit`` (a ``BaseException`` that ends an early-exit pass, caught by
the pass itself) holds that pass's state.
"""

from __future__ import annotations

__all__ = [
    "CLIError",
    "CallPlanError",
    "InPlaceWarning",
    "NotFittedError",
    "first_line",
]


class CallPlanError(RuntimeError):
    """A recorded module was not called as often as in the reference pass.

    Labels name calls by their rank, so when the number of calls differs no
    label can be trusted: the pass keeps no activations.
    """


class InPlaceWarning(UserWarning):
    """A record was modified in place after it was taken.

    Raised (as a warning) at the end of a pass, once per label and recorder,
    when a tensor of ``rnet.activations`` changed after it was recorded by an
    in-place operation that the reference pass did not run (a
    ``Dropout(inplace=True)`` in train mode on a table built in eval mode):
    the records that the reference pass saw overwritten are copies, exact.
    Silence it with ``warnings.simplefilter("ignore", InPlaceWarning)``, or
    keep exact records with ``rnet.record(..., clone=True)``.
    """


class NotFittedError(RuntimeError):
    """A detector that needs fitting was asked to score before it was fitted.

    Fit it (``detector.fit(batches)``) or load a fitted state
    (``detector.load(path)``) first.
    """


class CLIError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def first_line(error: BaseException) -> str:
    r"""Return the first line of an error's message (``""`` for none).

    For messages that quote another library's error in one line.

    Examples
    --------
    >>> first_line(ValueError("\nshape mismatch\nmore detail"))
    'shape mismatch'
    >>> first_line(KeyError())
    ''

    """
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
