"""Running a recorder over the user's net: inputs, checks, copies, forms.

Above the engine, the layer table and the selection (it imports them), and
below the public modules and subpackages that run nets (the recorder, the
checks, collect, activations, OoD, explain, SAE, the CLI).  The face
imports none of its modules (the static-flow check loads fake tensors);
import them by name:

* :mod:`.batches`: how the net's inputs come out of a batch, and how
  batches move between devices;
* :mod:`.flow`: the static-flow check and the fake reference pass;
* :mod:`.watch`: the values a forward reads into Python, and whether they
  change anything (what :mod:`.flow` watches);
* :mod:`.views`: what a recorder shows (its records, selection, table and
  printed forms), the base of :class:`~scio_recorder.Recorder`;
* :mod:`.copies`: copies of a recorder that place their own hooks;
* :mod:`.monitors`: detectors scoring every step of ``generate``
  (``monitors=``, ``stop_when=``), through the :class:`~.monitors.Monitor`
  protocol the per-token detectors satisfy;
* :mod:`.fingerprint`: deterministic descriptions of a run's arguments,
  for the fingerprints of resumes.
"""

__all__ = ["batches", "copies", "fingerprint", "flow", "monitors", "views", "watch"]
