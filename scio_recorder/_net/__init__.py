"""The user's net as the library finds it and leaves it.

Below the engine: the engine, the layer table, the graph and the checks
import from here, and nothing here imports another part of the library.
The face imports none of its modules; import them by name:

* :mod:`.preserve`: leave a net as it was around the passes the library
  runs on its own (modes, parameters, buffers, RNG, devices);
* :mod:`.quantized`: quantized layers through which torch passes no
  gradient;
* :mod:`.outputs`: where the logits are in a net's output.
"""

__all__ = ["outputs", "preserve", "quantized"]
