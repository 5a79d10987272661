"""The library's plumbing: what any part may use, importing none of them.

Nothing here imports another part of the library, so every part (the
engine, the layer table, the subpackages, the public modules) may import
from here.  The face imports none of its modules (``import scio_recorder``
stays cheap); import them by name:

* :mod:`.errors`: the library's exceptions and warnings;
* :mod:`.extras`: how to install what an optional extra brings;
* :mod:`.files`: what every written file shares (atomic writes, the
  version, dtypes);
* :mod:`.lazy`: names of a public face imported when first used;
* :mod:`.lock`: the lock file of a folder one run at a time may write;
* :mod:`.parts`: the checks shared by the parts that independent workers
  write (``part=K, parts=N``) with no process group;
* :mod:`.progress`: progress bars;
* :mod:`.public`: the public import path of the library's own objects;
* :mod:`.ranks`: where a process stands in a :mod:`torch.distributed` group;
* :mod:`.render`: plain-text and HTML tables that fit a width (every text
  table of the library is written by it);
* :mod:`.tree`: the one walk over nested values.
"""

__all__ = [
    "errors",
    "extras",
    "files",
    "lazy",
    "lock",
    "parts",
    "progress",
    "public",
    "ranks",
    "render",
    "tree",
]
