"""The per-pass machinery of a recorder, behind :class:`~scio_recorder.Recorder`.

Four modules, each one concept, dependencies flowing down the list:

* :mod:`.passes`: :class:`~.passes.Passes`, the one object that opens,
  checks, publishes and closes every pass of a recorder (``rnet(x)``, a
  scope's direct passes, compiled passes), and holds its plan, hooks and
  latest records;
* :mod:`.compiled`: the pass as ``torch.compile`` traces it and
  ``torch.export`` exports it;
* :mod:`.hooks`: the forward hooks placed on recorded modules, the registry
  in which they find the pass in progress, and what they become in a copy
  of the net;
* :mod:`.state`: the state of one pass, the records it leaves, their views;
* :mod:`.plan`: what a selection asks at each call, computed once per
  selection.

Nothing here is public; the recorder (:mod:`scio_recorder.recorder`) is the
face, and :mod:`scio_recorder.scope` uses :class:`~.passes.Passes` for the
passes of a scope.
"""
