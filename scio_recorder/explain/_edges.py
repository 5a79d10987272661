r"""Edge attribution: a score for every edge between a decoder's components.

The *graph* is that of Hanna et al.'s EAP-IG code (named the same): the
residual stream of a decoder is the sum of its components' outputs, so the
input of a component (read before its normalisation) is a sum over the
components before it; an *edge* ``u -> v`` is the term of ``u`` in the input
of ``v``.

* sources: ``"input"`` (the stream entering the first block), each head
  ``"a{l}.h{h}"`` (its slice of the output projection's input times its
  slice of the projection's weight: the head's term, bias excluded), each
  MLP ``"m{l}"`` (its output);
* destinations: each head's query, key and value inputs
  ``"a{l}.h{h}<q>"``, ``"<k>"``, ``"<v>"`` (the stream entering the block's
  first norm, reaching the head through its slice of the projection only),
  each MLP ``"m{l}"`` (the stream entering its norm), and ``"logits"`` (the
  stream entering the final norm).

Under grouped-query attention the model is taken as it is: a key/value head
serves a group of query heads, so its key and value inputs are one
destination per group, named after the group's first query head
(``"a{l}.h{g * n}<k>"``); any query head of the group names it in
``scores[u, v]``.

The layout is found for GPT-2 and Llama-style decoders (``transformer.h``
with ``ln_1``/``attn.c_attn``/``attn.c_proj``/``ln_2``/``mlp``; ``model.layers``
with ``input_layernorm``/``self_attn.{q,k,v,o}_proj``/
``post_attention_layernorm``/``mlp``), or named for any net
(:class:`Components`: modules each reading the stream at its input and adding
its output to it).
"""

from __future__ import annotations

__all__ = ["edge_attribution", "faithfulness"]

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._engine.state import CallInputs
from scio_recorder._net.outputs import logits_of
from scio_recorder._net.quantized import refuse_gradients

from ._base import (
    arguments,
    check_callable,
    check_flag,
    check_pair,
    check_recorder,
    run_net,
)
from ._circuits import EdgeScores
from ._nodes import (
    Components,
    Dest,
    Layout,
    Source,
    find_layout,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scio_recorder.recorder import Recorder

_WHO = "edge_attribution"
_METHODS = ("eap", "eap-ig", "exact")


def _real(layout: Layout) -> Tensor:
    src = torch.tensor([s.order for s in layout.sources])
    dst = torch.tensor([d.order for d in layout.dests])
    return src[:, None] < dst[None, :]


# -- reading and editing a pass -----------------------------------------------


def _term(rnet: Recorder, source: Source, value: Tensor) -> Tensor:
    """Return a source's term in the stream from what its module saw."""
    if source.kind != "head":
        return value
    module = dict(rnet.net.named_modules())[source.module]
    weight: Tensor = module.weight
    z = value[..., source.cols]
    if type(module).__name__ == "Conv1D":  # GPT-2's [in, out] weight
        return z @ weight[source.cols, :]
    return z @ weight[:, source.cols].T


def _split(
    rnet: Recorder, dest: Dest, stream: Tensor, extra: Tensor | None = None
) -> Tensor:
    """Return ``proj(norm(stream + extra))`` at the destination's columns."""
    modules = dict(rnet.net.named_modules())
    x = stream if extra is None else stream + extra
    # `.forward`: not a call of the module (hooks, the recorder's call plan)
    normed = modules[dest.norm].forward(x)
    projected: Tensor = modules[dest.proj].forward(normed)
    return projected[..., dest.cols]


@dataclass
class _Run:
    """What one pass kept: the sources' terms and the destinations' inputs."""

    terms: dict[str, Tensor]
    inputs: dict[str, Tensor]
    metric: Tensor
    grads: dict[str, Tensor] = field(default_factory=dict)
    projected: dict[str, Tensor] = field(default_factory=dict)
    """The projections' outputs (the heads' queries, keys and values)."""


def _pass(  # noqa: C901, PLR0913, PLR0915 (one pass, every option)
    rnet: Recorder,
    layout: Layout,
    inputs: Any,
    metric: Callable[[Tensor], Tensor],
    *,
    gradients: bool = False,
    replace_input: Tensor | None = None,
    patches: dict[str, Tensor] | None = None,
    per_copy: int | None = None,
    circuit: tuple[Tensor, dict[str, Tensor]] | None = None,
) -> _Run:
    """Run ``inputs`` once; keep the sources' terms and the destinations' inputs.

    With ``gradients``, also the metric's gradient at each destination's
    input (a head's: through its slice of the projection only). With
    ``replace_input``, the stream entering the first block is replaced; with
    ``patches``, ``patches[v]`` is added to the input of destination ``v``
    (and of it only). With ``per_copy``, the metric is taken on each
    ``per_copy`` rows and returned as a vector. With ``circuit = (keep,
    corrupted terms)``, each edge ``u -> v`` not kept is patched: the term
    of ``u`` in this run is replaced by its corrupted one in the input of
    ``v`` (the authors' ``evaluate_graph``).
    """
    terms: dict[str, Tensor] = {}
    seen: dict[str, Tensor] = {}
    live: dict[str, Tensor] = {}
    projected: dict[str, Tensor] = {}
    leaves: dict[str, Tensor] = {}
    patches = patches or {}
    index = {s.name: i for i, s in enumerate(layout.sources)}
    real = _real(layout)

    def extra(dest: Dest) -> Tensor | None:
        """Return what is added to ``dest``'s input in this run, or None."""
        added = patches.get(dest.name)
        if circuit is None:
            return added
        keep, corrupted_terms = circuit
        j = layout.dests.index(dest)
        for name, i in index.items():
            if real[i, j] and not keep[i, j]:
                change = corrupted_terms[name] - terms[name]
                added = change if added is None else added + change
        return added

    in_edits: dict[str, Callable[[Any], Any]] = {}
    out_edits: dict[str, Callable[[Any], Any]] = {}
    by_module: dict[str, list[Source]] = {}
    for source in layout.sources:
        by_module.setdefault(source.module, []).append(source)
    norms = {dest.norm for dest in layout.dests}
    projs: dict[str, list[Dest]] = {}
    for dest in layout.dests:
        if dest.proj is not None:
            projs.setdefault(dest.proj, []).append(dest)

    def read_input(module: str) -> Callable[[Any], Any]:
        def edit(value: Tensor) -> Tensor | None:
            out = value
            if replace_input is not None and any(
                s.kind == "input" and s.name == "input"
                for s in by_module.get(module, [])
            ):
                out = replace_input.to(value.dtype)
            for source in by_module.get(module, []):
                if source.kind in {"input", "head"}:
                    terms[source.name] = _term(rnet, source, out).detach().clone()
            heads = any(s.kind == "head" for s in by_module.get(module, []))
            if gradients and heads:  # the heads' outputs' gradient (AtP*'s fix)
                leaves[f"z:{module}"] = torch.zeros_like(out, requires_grad=True)
                out = out + leaves[f"z:{module}"]
            if module in norms:
                seen[module] = out.detach().clone()
                live[module] = out  # in the graph: a patched head's path to it
                whole = [d for d in layout.dests if d.norm == module and d.proj is None]
                for dest in whole:
                    added = extra(dest)
                    if added is not None:
                        out = out + added
                    if gradients:  # a zero added: the gradient along this path only
                        leaves[dest.name] = torch.zeros_like(out, requires_grad=True)
                        out = out + leaves[dest.name]
            return None if out is value else out

        return edit

    def read_output(module: str) -> Callable[[Any], Any]:
        def edit(value: Any) -> Any:
            starts = any(
                s.kind == "output" and s.name == "input"
                for s in by_module.get(module, [])
            )
            if replace_input is not None and starts:
                return replace_input.to(value.dtype)
            for source in by_module.get(module, []):
                if source.kind == "output":
                    kept = value if isinstance(value, Tensor) else value[0]
                    terms[source.name] = kept.detach().clone()
            if module not in projs:
                return None
            projected[module] = value.detach().clone()
            out = value
            dests = projs[module]
            patched = [(d, extra(d)) for d in dests]
            if any(added is not None for _, added in patched):
                out = out.clone()
                for dest, added in patched:
                    if added is not None:
                        new = _split(rnet, dest, live[dest.norm], added)
                        out[..., dest.cols] = new
            if gradients:
                leaves[module] = torch.zeros_like(out, requires_grad=True)
                out = out + leaves[module]
            return None if out is value else out

        return edit

    for module in {*by_module, *norms}:
        in_edits[module] = read_input(module)
    for module in {*by_module, *projs}:
        out_edits[module] = read_output(module)
    grad_mode = torch.enable_grad() if gradients else torch.no_grad()
    with grad_mode:
        output = run_net(
            rnet,
            inputs,
            activation_postproc=out_edits,
            input_postproc=in_edits,
            dont_record=True,
        )
        logits = logits_of(output)
        if per_copy is None:
            value = _one(metric(logits))
        else:
            value = torch.stack(
                [
                    _one(metric(logits[i : i + per_copy]))
                    for i in range(0, logits.shape[0], per_copy)
                ]
            )
        run = _Run(terms, seen, value.detach(), projected=projected)
        if gradients:
            names = list(leaves)
            grads = torch.autograd.grad(
                value, [leaves[n] for n in names], allow_unused=True
            )
            got = {
                n: torch.zeros_like(leaves[n]) if g is None else g
                for n, g in zip(names, grads, strict=True)
            }
            for dest in layout.dests:
                if dest.proj is None:
                    run.grads[dest.name] = got[dest.name]
            run.grads.update({n: g for n, g in got.items() if n.startswith("z:")})
            run.grads.update(_through_projections(rnet, layout, seen, got, patches))
    return run


def _through_projections(
    rnet: Recorder,
    layout: Layout,
    seen: dict[str, Tensor],
    got: dict[str, Tensor],
    patches: dict[str, Tensor],
) -> dict[str, Tensor]:
    """Return each head destination's gradient at its norm's input.

    The gradient at the projection's output, restricted to the head's
    columns, pulled back through the projection and the norm: one batched
    vector-Jacobian product per norm.
    """
    modules = dict(rnet.net.named_modules())
    out: dict[str, Tensor] = {}
    by_norm: dict[str, list[Dest]] = {}
    for dest in layout.dests:
        if dest.proj is not None:
            by_norm.setdefault(dest.norm, []).append(dest)
    for norm, dests in by_norm.items():
        stream = seen[norm].detach()
        with torch.enable_grad():
            x = torch.stack(
                [
                    stream + patches[d.name] if d.name in patches else stream
                    for d in dests
                ]
            ).requires_grad_(True)  # noqa: FBT003
            normed = modules[norm].forward(x)
            total = torch.zeros((), dtype=stream.dtype, device=stream.device)
            for i, dest in enumerate(dests):
                projected = modules[dest.proj].forward(normed[i])
                cotangent = got[dest.proj][..., dest.cols]  # type: ignore[index]
                total = total + (projected[..., dest.cols] * cotangent).sum()
            (grad,) = torch.autograd.grad(total, x)
        for i, dest in enumerate(dests):
            out[dest.name] = grad[i]
    return out


def _one(value: Any) -> Tensor:
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.reshape(())
    shown = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
    msg = (
        f"{_WHO}: `metric` returned {shown}; it must return one number as a "
        "tensor, e.g. `lambda logits: (logits[:, -1, 3] - logits[:, -1, 5]).mean()`."
    )
    raise ValueError(msg)


# -- the methods ----------------------------------------------------------------


def _scores(
    layout: Layout, diffs: dict[str, Tensor], grads: dict[str, Tensor]
) -> Tensor:
    """Return ``[sources, destinations]``: diff . grad, summed over every dimension."""
    src = torch.stack([diffs[s.name].double() for s in layout.sources])
    dst = torch.stack([grads[d.name].double() for d in layout.dests])
    values = torch.einsum("u...,v...->uv", src, dst)
    return values * _real(layout)


def _eap_ig_inputs(  # noqa: PLR0913, PLR0917 (the run's parts)
    rnet: Recorder,
    layout: Layout,
    clean: Any,
    metric: Callable[[Tensor], Tensor],
    runs: tuple[_Run, _Run],
    steps: int,
) -> dict[str, Tensor]:
    """Average the destinations' gradients over inputs from corrupted to clean.

    The paper's rule: the stream entering the first block at
    ``corrupted + k / m (clean - corrupted)``, ``k = 1..m``.
    """
    clean_run, corrupted_run = runs
    start, end = corrupted_run.terms["input"], clean_run.terms["input"]
    total: dict[str, Tensor] = {}
    for k in range(1, steps + 1):
        point = start + (k / steps) * (end - start)
        run = _pass(rnet, layout, clean, metric, gradients=True, replace_input=point)
        for name, grad in run.grads.items():
            total[name] = grad.double() + total.get(name, 0)
    return {name: grad / steps for name, grad in total.items()}


def _eap_ig_activations(  # noqa: PLR0913, PLR0917 (the run's parts)
    rnet: Recorder,
    layout: Layout,
    clean: Any,
    metric: Callable[[Tensor], Tensor],
    runs: tuple[_Run, _Run],
    steps: int,
) -> dict[str, Tensor]:
    """Average the gradients over runs each interpolating one layer's outputs.

    The authors' ``get_scores_ig_activations``: for the input and each
    layer's attention and MLP outputs in turn, ``k = 1..m``, the clean run
    with that node's term at ``corrupted + k / m (clean - corrupted)``; the
    gradients of all those runs averaged.
    """
    clean_run, corrupted_run = runs
    groups: dict[int, list[Source]] = {}
    for source in layout.sources:
        groups.setdefault(source.order, []).append(source)
    total: dict[str, Tensor] = {}
    count = 0
    for sources in groups.values():
        for k in range(1, steps + 1):
            shift = {}
            for source in sources:
                delta = corrupted_run.terms[source.name] - clean_run.terms[source.name]
                shift[source.name] = (1 - k / steps) * delta
            run = _shifted(rnet, layout, clean, metric, shift)
            count += 1
            for name, grad in run.grads.items():
                total[name] = grad.double() + total.get(name, 0)
    return {name: grad / count for name, grad in total.items()}


def _shifted(
    rnet: Recorder,
    layout: Layout,
    clean: Any,
    metric: Callable[[Tensor], Tensor],
    shift: dict[str, Tensor],
) -> _Run:
    """Run clean with ``shift[u]`` added to source ``u``'s term downstream.

    A source's term reaches every later destination through the stream, so
    adding it to the input of every destination after it is adding it to
    the source's output.
    """
    patches: dict[str, Tensor] = {}
    order = {s.name: s.order for s in layout.sources}
    for dest in layout.dests:
        for name, delta in shift.items():
            if order[name] < dest.order:
                patches[dest.name] = delta + patches.get(dest.name, 0)
    return _pass(rnet, layout, clean, metric, gradients=True, patches=patches)


def _exact(  # noqa: PLR0913, PLR0917 (the run's parts)
    rnet: Recorder,
    layout: Layout,
    clean: Any,
    metric: Callable[[Tensor], Tensor],
    runs: tuple[_Run, _Run],
    batch: int,
    max_edges: int,
) -> Tensor:
    """Patch each edge alone, ``max_edges`` edges (copies of the batch) a pass."""
    clean_run, corrupted_run = runs
    real = _real(layout)
    edges = [
        (i, j)
        for i in range(len(layout.sources))
        for j in range(len(layout.dests))
        if real[i, j]
    ]
    values = torch.zeros(real.shape, dtype=torch.float64)
    args, kwargs = arguments(clean)
    for first in range(0, len(edges), max_edges):
        chunk = edges[first : first + max_edges]
        copies = len(chunk)
        rows = torch.arange(batch).repeat(copies)
        patches: dict[str, Tensor] = {}
        for c, (i, j) in enumerate(chunk):
            source, dest = layout.sources[i], layout.dests[j]
            delta = corrupted_run.terms[source.name] - clean_run.terms[source.name]
            if dest.name not in patches:
                shape = (copies * batch, *delta.shape[1:])
                patches[dest.name] = delta.new_zeros(shape)
            patches[dest.name][c * batch : (c + 1) * batch] = delta
        inputs = _rows(args, kwargs, batch, rows)
        run = _pass(rnet, layout, inputs, metric, patches=patches, per_copy=batch)
        for c, (i, j) in enumerate(chunk):
            values[i, j] = float(run.metric[c]) - float(clean_run.metric)
    return values


def _qk_fix(  # noqa: PLR0913, PLR0917 (the run's parts)
    rnet: Recorder,
    layout: Layout,
    clean: Any,
    clean_run: _Run,
    diffs: dict[str, Tensor],
    values: Tensor,
) -> Tensor:
    r"""Return ``values`` with the edges into queries and keys scored as AtP*.

    Kramár et al. (2024): the attention pattern of the edge's head is
    recomputed with the patched query (or key), $A'$, and only what follows
    it is linearised: $\sum \partial m / \partial z_h \cdot (A' - A) V_h$,
    $z_h = A V_h$ the head's output. A saturated softmax, whose gradient is
    about 0, no longer hides the effect of moving its maximum.
    """
    modules = dict(rnet.net.named_modules())
    real = _real(layout)
    values = values.clone()
    kwargs = arguments(clean)[1]
    keep = kwargs.get("attention_mask")
    with torch.no_grad():
        for j, dest in enumerate(layout.dests):
            qk = dest.qk
            if qk is None or dest.proj is None:
                continue
            out = clean_run.projected[dest.proj]
            q, k, v = out[..., qk.queries], out[..., qk.keys], out[..., qk.values]
            grad_z = clean_run.grads[f"z:{qk.output}"][..., qk.head]
            scale = float(
                getattr(modules[qk.attention], "scaling", q.shape[-1] ** -0.5)
            )
            length = q.shape[1]
            mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
            mask = mask[None].expand(q.shape[0], length, length)
            if isinstance(keep, Tensor) and keep.dim() == 2:  # noqa: PLR2004 ([batch, keys])
                mask = mask & keep.to(q.device).bool()[:, None, :]

            def pattern(
                queries: Tensor, keys: Tensor, mask: Tensor = mask, scale: float = scale
            ) -> Tensor:
                scores = (queries @ keys.transpose(-1, -2)) * scale
                low = torch.finfo(scores.dtype).min
                return torch.softmax(scores.masked_fill(~mask, low), dim=-1)

            base = pattern(q, k)
            slope = (grad_z @ v.transpose(-1, -2)).double()  # d m / d pattern
            stream = clean_run.inputs[dest.norm]
            for i, source in enumerate(layout.sources):
                if not real[i, j]:
                    continue
                new = _split(rnet, dest, stream, diffs[source.name])
                moved = pattern(new, k) if qk.letter == "q" else pattern(q, new)
                values[i, j] = ((moved - base).double() * slope).sum()
    return values


def _rows(
    args: Sequence[Any], kwargs: dict[str, Any], batch: int, rows: Tensor
) -> CallInputs:
    def take(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch:
            return value.index_select(0, rows.to(value.device))
        return value

    return CallInputs(
        tuple(take(v) for v in args), {k: take(v) for k, v in kwargs.items()}
    )


def edge_attribution(  # noqa: PLR0913, PLR0917 (the interface, then options)
    rnet: Recorder,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Tensor], Tensor],
    method: str = "eap",
    steps: int | None = None,
    *,
    ig: str = "inputs",
    components: Components | None = None,
    max_edges: int = 64,
    qk_fix: bool = False,
) -> EdgeScores:
    r"""Return a score for every edge ``u -> v`` of the net's graph.

    With $\Delta_u = a_u(\text{corrupted}) - a_u(\text{clean})$ the change
    of source ``u``'s term in the stream and $g_v = \partial m /
    \partial x_v$ the metric's gradient at destination ``v``'s input (read
    before its normalisation; a head's through its own slice of the
    projection), the score of ``u -> v`` is:

    * ``"eap"`` (Syed et al. 2023): $\Delta_u \cdot g_v$, $g_v$ on the clean
      run, summed over the batch, positions and hidden units (the first-order
      estimate of the metric's change; the authors' code also divides by the
      number of examples): 2 forwards and 1 backward whatever the number of
      edges;
    * ``"eap-ig"`` (Hanna et al. 2024): $\Delta_u \cdot \frac1m \sum_{k=1}^m
      g_v^{(k)}$, $g_v^{(k)}$ taken with the stream entering the first
      block at $x_\text{corr} + \frac km (x_\text{clean} - x_\text{corr})$
      (``ig="inputs"``), or (``ig="activations"``) with each layer's
      terms so interpolated in turn, the gradients of all those runs
      averaged (the authors' ``get_scores_ig_activations``). $k$ runs over
      ``1..m`` as in the paper, so that one step is EAP; the authors' code
      loops over ``range(0, steps)`` (``k = 0..m-1``), whose one step is the
      gradient on the corrupted input;
    * ``"exact"``: $m(\text{clean with } \Delta_u \text{ added to } v\text{'s
      input only}) - m(\text{clean})$, ``max_edges`` edges (copies of the
      batch) a pass. EAP and EAP-IG estimate it.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (use ``net.eval()``): a GPT-2 or Llama-style
        decoder, or any net with ``components=``.
    clean, corrupted : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`), of one shape.
    metric : callable
        ``metric(logits) -> scalar tensor``, ``logits`` the net's
        (``[batch, positions, vocabulary]``; for ``"exact"``, one batch's
        rows at a time).
    method : str, default "eap"
        ``"eap"``, ``"eap-ig"`` or ``"exact"``.
    steps : int or None
        EAP-IG's $m$ (default 5); refused for the other methods.
    ig : str, default "inputs"
        EAP-IG's variant: ``"inputs"`` or ``"activations"``.
    components : Components or None
        The net's components, for a net other than GPT-2 or Llama.
    max_edges : int, default 64
        Exact patching: the most edges in one pass.
    qk_fix : bool, default False
        With ``"eap"``, score the edges into heads' queries and keys with
        AtP*'s QK fix (Kramár et al. 2024): the head's attention pattern
        recomputed with the patched query or key, only what follows it
        linearised, so that a saturated softmax does not hide an edge. For
        nets whose projections give the attention's queries and keys as
        they are (GPT-2; not rotary ones such as Llama).

    Returns
    -------
    EdgeScores
        ``scores[u, v]``, ``scores.nodes``, ``scores.values`` (float64).

    Raises
    ------
    TypeError
        ``rnet`` is not a :class:`~scio_recorder.Recorder`, ``metric`` is not
        callable.
    ValueError
        An unknown method or variant, ``steps`` given for a method without
        steps, ``clean`` and ``corrupted`` of different batch sizes or
        lengths, a net whose layout is not found without ``components=``,
        ``metric`` not returning one number.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> class Toy(nn.Module):  # x = embed; x += a(x); logits = out(x)
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.embed, self.a, self.out = (
    ...             nn.Embedding(5, 3),
    ...             nn.Linear(3, 3),
    ...             nn.Linear(3, 2),
    ...         )
    ...
    ...     def forward(self, ids):
    ...         x = self.embed(ids)
    ...         return self.out(x + self.a(x))
    >>> net = Toy()
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 4, dtype=torch.long)])
    >>> parts = Components("embed", ["a"], "out")
    >>> metric = lambda logits: logits[:, -1, 0].mean()
    >>> clean, corrupted = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 3, 0]])
    >>> scores = edge_attribution(rnet, clean, corrupted, metric, components=parts)
    >>> scores.nodes
    ['input', 'a', 'logits']
    >>> exact = edge_attribution(
    ...     rnet, clean, corrupted, metric, "exact", components=parts
    ... )
    >>> bool(torch.allclose(scores.values, exact.values, atol=1e-6))  # linear: exact
    True

    """
    check_recorder(rnet, _WHO)
    check_callable(metric, "metric", _WHO, "lambda logits: logits[:, -1, 3].mean()")
    steps = _check_options(method, steps, ig, max_edges, qk_fix=qk_fix)
    batch = check_pair(clean, corrupted, ("clean", "corrupted"), _WHO)
    _check_lengths(clean, corrupted)
    if method != "exact":
        refuse_gradients(rnet.net, _WHO)
    layout = find_layout(rnet.net, components, _WHO)
    if qk_fix and (method != "eap" or not any(d.qk for d in layout.dests)):
        msg = (
            f"{_WHO}: `qk_fix=True` is AtP*'s fix of EAP on nets whose query and "
            "key projections give the attention's queries and keys as they are "
            f"(GPT-2); it does not apply to method={method!r} on "
            f"{type(rnet.net).__name__}: leave `qk_fix=False`."
        )
        raise ValueError(msg)
    corrupted_run = _pass(rnet, layout, corrupted, metric)
    if method == "exact":
        clean_run = _pass(rnet, layout, clean, metric)
        values = _exact(
            rnet, layout, clean, metric, (clean_run, corrupted_run), batch, max_edges
        )
        return _result(layout, values)
    clean_run = _pass(rnet, layout, clean, metric, gradients=True)
    grads = clean_run.grads
    if method == "eap-ig":
        runs = (clean_run, corrupted_run)
        if ig == "inputs":
            grads = _eap_ig_inputs(rnet, layout, clean, metric, runs, steps)
        else:
            grads = _eap_ig_activations(rnet, layout, clean, metric, runs, steps)
    diffs = {
        s.name: corrupted_run.terms[s.name] - clean_run.terms[s.name]
        for s in layout.sources
    }
    values = _scores(layout, diffs, grads)
    if qk_fix:
        values = _qk_fix(rnet, layout, clean, clean_run, diffs, values)
    return _result(layout, values)


def _check_options(
    method: str, steps: int | None, ig: str, max_edges: int, *, qk_fix: bool
) -> int:
    """Refuse options of the wrong kind; return EAP-IG's number of steps."""
    if method not in _METHODS:
        msg = f"{_WHO}: `method={method!r}` is none of {list(_METHODS)}."
        raise ValueError(msg)
    if method != "eap-ig" and steps is not None:
        msg = f"{_WHO}: `steps` is for `method='eap-ig'`; leave it None for {method!r}."
        raise ValueError(msg)
    if ig not in {"inputs", "activations"}:
        msg = f"{_WHO}: `ig={ig!r}` must be 'inputs' or 'activations'."
        raise ValueError(msg)
    check_flag(qk_fix, "qk_fix", _WHO)
    steps = 5 if steps is None else steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        msg = f"{_WHO}: `steps={steps!r}` must be a positive int."
        raise ValueError(msg)
    if not isinstance(max_edges, int) or isinstance(max_edges, bool) or max_edges < 1:
        msg = f"{_WHO}: `max_edges={max_edges!r}` must be a positive int."
        raise ValueError(msg)
    return steps


def _result(layout: Layout, values: Tensor) -> EdgeScores:
    return EdgeScores(
        values,
        [s.name for s in layout.sources],
        [d.name for d in layout.dests],
        _real(layout),
        layout.aliases,
    )


def _check_lengths(clean: Any, corrupted: Any) -> None:
    """Refuse a clean/corrupted pair whose tensors differ in shape."""
    a = [*arguments(clean)[0], *arguments(clean)[1].values()]
    b = [*arguments(corrupted)[0], *arguments(corrupted)[1].values()]
    for x, y in zip(a, b, strict=False):
        if isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape != y.shape:
            msg = (
                f"{_WHO}: `clean` has shape {list(x.shape)} and `corrupted` "
                f"{list(y.shape)}: an edge's score compares the two runs position "
                "by position, so they must have one length; pad the shorter (with "
                "an `attention_mask`) or pick pairs of one length."
            )
            raise ValueError(msg)


def faithfulness(  # noqa: PLR0913 (the interface of edge_attribution, then edges)
    rnet: Recorder,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Tensor], Tensor],
    edges: Sequence[tuple[str, str]],
    *,
    components: Components | None = None,
) -> dict[str, float]:
    r"""Return the metric of a circuit: every edge outside ``edges`` patched.

    One pass on ``clean`` in which, for every edge ``u -> v`` not in
    ``edges``, the term of ``u`` in the input of ``v`` is replaced by its
    value on ``corrupted`` (the authors' ``evaluate_graph`` with
    ``intervention="patching"``): the circuit's edges carry the clean run,
    the others the corrupted one. With every edge, the clean run; with none,
    the corrupted run.

    Parameters
    ----------
    rnet, clean, corrupted, metric, components
        As for :func:`edge_attribution`.
    edges : sequence of (str, str)
        The circuit, e.g. ``scores.top(20)``.

    Returns
    -------
    dict
        ``"circuit"``, ``"clean"`` and ``"corrupted"``: the metric on the
        three runs; ``"faithfulness"``: $(m_\mathrm{circuit} -
        m_\mathrm{corrupted}) / (m_\mathrm{clean} - m_\mathrm{corrupted})$
        (NaN when the clean and corrupted metrics are equal).

    Raises
    ------
    KeyError
        An edge that is not in the graph.
    ValueError, TypeError
        As :func:`edge_attribution`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> class Toy(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.embed, self.a, self.out = (
    ...             nn.Embedding(5, 3),
    ...             nn.Linear(3, 3),
    ...             nn.Linear(3, 2),
    ...         )
    ...
    ...     def forward(self, ids):
    ...         x = self.embed(ids)
    ...         return self.out(x + self.a(x))
    >>> rnet = Recorder(Toy(), input_data=[torch.zeros(1, 4, dtype=torch.long)])
    >>> parts = Components("embed", ["a"], "out")
    >>> clean, corrupted = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 3, 0]])
    >>> metric = lambda logits: logits[:, -1, 0].mean()
    >>> every = [("input", "a"), ("input", "logits"), ("a", "logits")]
    >>> run = faithfulness(rnet, clean, corrupted, metric, every, components=parts)
    >>> run["circuit"] == run["clean"], round(run["faithfulness"], 6)
    (True, 1.0)

    """
    check_recorder(rnet, "faithfulness")
    check_callable(
        metric, "metric", "faithfulness", "lambda logits: logits[:, -1, 3].mean()"
    )
    check_pair(clean, corrupted, ("clean", "corrupted"), "faithfulness")
    _check_lengths(clean, corrupted)
    layout = find_layout(rnet.net, components, _WHO)
    graph = _result(layout, torch.zeros(len(layout.sources), len(layout.dests)))
    keep = graph.mask(list(edges))
    corrupted_run = _pass(rnet, layout, corrupted, metric)
    clean_run = _pass(rnet, layout, clean, metric)
    run = _pass(rnet, layout, clean, metric, circuit=(keep, corrupted_run.terms))
    m, m_clean, m_corr = (
        float(run.metric),
        float(clean_run.metric),
        float(corrupted_run.metric),
    )
    span = m_clean - m_corr
    return {
        "circuit": m,
        "clean": m_clean,
        "corrupted": m_corr,
        "faithfulness": (m - m_corr) / span if span else float("nan"),
    }
