"""Edge attribution: EAP, EAP-IG and exact patching against independent oracles.

Oracles, none sharing code with the package:

* hand-written PyTorch hooks on the Hugging Face modules (:class:`Hooks`):
  the sources' terms, the gradient at each destination's input (a head's
  query/key/value input through its own columns of the projection, built as
  a forward-graph of its own, not a vector-Jacobian product), and a two-pass
  hand patch of one edge;
* a port of the authors' reference code (:func:`authors_scores`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from scio_recorder import Recorder
from scio_recorder.explain import Components, EdgeScores, edge_attribution, faithfulness
from tests import lms

EPS = torch.finfo(torch.float32).eps


def metric(logits: Tensor) -> Tensor:
    """A logit difference at the last position, averaged over the batch."""
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


def pair(seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, lms.VOCAB, (2, 6), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(1, lms.VOCAB, (2,), generator=gen)
    corrupted[0, 4] = 9
    return clean, corrupted


# -- the hand-written hooks -----------------------------------------------------


@dataclass
class Dest:
    name: str
    norm: nn.Module
    proj: nn.Module | None = None
    cols: slice | None = None


@dataclass
class Source:
    name: str
    module: nn.Module
    kind: str  # "input" (block 0's input), "head" (o-proj input), "output"
    cols: slice | None = None


class Hooks:
    """The graph of a GPT-2 or Llama model, read and patched with torch hooks."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.sources: list[Source] = []
        self.dests: list[Dest] = []
        cfg = model.config
        if hasattr(model, "transformer"):
            blocks, final = model.transformer.h, model.transformer.ln_f
            heads = groups = cfg.n_head
            size = cfg.n_embd // heads
            width = cfg.n_embd
        else:
            blocks, final = model.model.layers, model.model.norm
            heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
            size = cfg.hidden_size // heads
        self.sources.append(Source("input", blocks[0], "input"))
        for layer, blk in enumerate(blocks):
            gpt2 = hasattr(blk, "ln_1")
            ln1 = blk.ln_1 if gpt2 else blk.input_layernorm
            o_proj = blk.attn.c_proj if gpt2 else blk.self_attn.o_proj
            for h in range(heads):
                cols = slice(h * size, (h + 1) * size)
                self.sources.append(Source(f"a{layer}.h{h}", o_proj, "head", cols))
                if gpt2:
                    for i, letter in enumerate("qkv"):
                        qkv = slice(i * width + h * size, i * width + (h + 1) * size)
                        self.dests.append(
                            Dest(f"a{layer}.h{h}<{letter}>", ln1, blk.attn.c_attn, qkv)
                        )
                else:
                    self.dests.append(
                        Dest(f"a{layer}.h{h}<q>", ln1, blk.self_attn.q_proj, cols)
                    )
            if not gpt2:
                for g in range(groups):
                    cols = slice(g * size, (g + 1) * size)
                    first = g * heads // groups
                    for letter in "kv":
                        proj = getattr(blk.self_attn, f"{letter}_proj")
                        self.dests.append(
                            Dest(f"a{layer}.h{first}<{letter}>", ln1, proj, cols)
                        )
            self.sources.append(Source(f"m{layer}", blk.mlp, "output"))
            ln2 = blk.ln_2 if gpt2 else blk.post_attention_layernorm
            self.dests.append(Dest(f"m{layer}", ln2))
        self.dests.append(Dest("logits", final))

    def terms(self, ids: Tensor) -> dict[str, Tensor]:
        """Each source's term in the stream, on ``ids``."""
        out: dict[str, Tensor] = {}
        handles = self.term_hooks(out)
        with torch.no_grad():
            self.model(input_ids=ids)
        for handle in handles:
            handle.remove()
        return out

    def term_hooks(self, out: dict[str, Tensor]) -> list[Any]:
        """Hooks writing each source's term into ``out`` as the pass makes it."""
        handles = []
        for s in self.sources:
            if s.kind == "output":
                handles.append(s.module.register_forward_hook(
                    lambda m, a, o, s=s: out.__setitem__(s.name, o.detach().clone())
                ))  # fmt: skip
            else:
                handles.append(s.module.register_forward_pre_hook(
                    lambda m, a, s=s: out.__setitem__(s.name, self._term(s, a[0]))
                ))  # fmt: skip
        return handles

    def circuit(
        self, clean: Tensor, corrupted: Tensor, keep: set[tuple[str, str]]
    ) -> Tensor:
        """The metric on ``clean`` with every edge outside ``keep`` patched."""
        corrupt = self.terms(corrupted)
        live: dict[str, Tensor] = {}

        def key(name: str) -> tuple[float, int]:
            if name == "input":
                return (-1, 1)
            if name == "logits":
                return (float("inf"), 0)
            layer = int(name[1:].split(".", maxsplit=1)[0])
            return (layer, 0 if name[0] == "a" else 1)

        def shift(v: str) -> Tensor:
            changes = [
                corrupt[u.name] - live[u.name]
                for u in self.sources
                if key(u.name) < key(v.split("<", maxsplit=1)[0])
                and (u.name, v) not in keep
            ]
            return sum(changes, torch.zeros_like(corrupt["input"]))

        handles = self.term_hooks(live)
        try:
            value, _ = self.run(
                clean, {d.name: (lambda v=d.name: shift(v)) for d in self.dests}
            )
        finally:
            for handle in handles:
                handle.remove()
        return value

    def _term(self, s: Source, x: Tensor) -> Tensor:
        if s.kind == "input":
            return x.detach().clone()
        w = s.module.weight
        z = x.detach()[..., s.cols]
        return z @ (
            w[s.cols] if type(s.module).__name__ == "Conv1D" else w[:, s.cols].T
        )

    def run(  # noqa: C901 (the hooks of every destination)
        self,
        ids: Tensor,
        shifts: dict[str, Tensor] | None = None,
        *,
        grads: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The metric with ``shifts[v]`` added to the input of ``v`` only.

        With ``grads``, a zero added to each destination's input (a head's:
        in its own copy of the stream, through its own columns) and the
        metric's gradient with respect to each.
        """
        shifts = shifts or {}
        zeros: dict[str, Tensor] = {}
        seen: dict[nn.Module, Tensor] = {}
        by_norm: dict[nn.Module, list[Dest]] = {}
        by_proj: dict[nn.Module, list[Dest]] = {}
        for d in self.dests:
            by_norm.setdefault(d.norm, []).append(d)
            if d.proj is not None:
                by_proj.setdefault(d.proj, []).append(d)

        def extra(d: Dest, x: Tensor) -> Tensor:
            add = shifts.get(d.name, torch.zeros_like(x))
            if callable(add):  # computed as the pass reaches d
                add = add()
            if grads:
                zeros[d.name] = torch.zeros_like(x, requires_grad=True)
                add = add + zeros[d.name]
            return add

        def pre(norm: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            x = args[0]
            seen[norm] = x
            whole = [d for d in by_norm[norm] if d.proj is None]
            if not whole:
                return None
            return (x + extra(whole[0], x), *args[1:])

        def post(proj: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
            out = out.clone()
            for d in by_proj[proj]:
                x = seen[d.norm]
                own = proj.forward(d.norm.forward(x + extra(d, x)))
                out[..., d.cols] = own[..., d.cols]
            return out

        handles = [norm.register_forward_pre_hook(pre) for norm in by_norm]
        handles += [proj.register_forward_hook(post) for proj in by_proj]
        try:
            with torch.enable_grad():
                value = metric(self.model(input_ids=ids).logits)
                if not grads:
                    return value.detach(), {}
                names = list(zeros)
                got = torch.autograd.grad(value, [zeros[n] for n in names])
                return value.detach(), dict(zip(names, got, strict=True))
        finally:
            for handle in handles:
                handle.remove()

    def eap(self, clean: Tensor, corrupted: Tensor) -> dict[tuple[str, str], float]:
        a_clean, a_corr = self.terms(clean), self.terms(corrupted)
        _, g = self.run(clean, grads=True)
        return {
            (u.name, v.name): float(
                ((a_corr[u.name] - a_clean[u.name]).double() * g[v.name].double()).sum()
            )
            for u in self.sources
            for v in self.dests
        }


def models() -> list[Any]:
    return [pytest.param(lms.gpt2, id="gpt2"), pytest.param(lms.llama, id="llama-gqa")]


def rnet_of(model: nn.Module, ids: Tensor) -> Recorder:
    return Recorder(model, input_data={"input_ids": ids})


@pytest.mark.slow
@pytest.mark.parametrize("make", models())
def test_eap_equals_hand_written_hooks(make: Any) -> None:
    model = make()
    clean, corrupted = pair()
    scores = edge_attribution(rnet_of(model, clean), clean, corrupted, metric)
    want = Hooks(model).eap(clean, corrupted)
    checked = 0
    for (u, v), value in want.items():
        if (u, v) in set(scores.edges()):
            assert abs(float(scores[u, v]) - value) <= 1e-6, (u, v)
            checked += 1
    assert checked == len(scores) > 0
    assert scores.values.abs().max() > 1e-4  # not all zero


@pytest.mark.slow
@pytest.mark.parametrize("make", models())
def test_eap_ig_one_step_is_eap_and_exact_one_edge_is_a_hand_patch(make: Any) -> None:
    model = make()
    clean, corrupted = pair(1)
    rnet = rnet_of(model, clean)
    eap = edge_attribution(rnet, clean, corrupted, metric)
    for variant in ("inputs", "activations"):
        one = edge_attribution(
            rnet, clean, corrupted, metric, "eap-ig", steps=1, ig=variant
        )
        # the same gradients, through other kernels: float32 rounding of the terms
        tol = 64 * EPS * float(eap.values.abs().max())
        torch.testing.assert_close(one.values, eap.values, rtol=0, atol=tol)
    hooks = Hooks(model)
    a_clean, a_corr = hooks.terms(clean), hooks.terms(corrupted)
    base, _ = hooks.run(clean)
    exact = edge_attribution(rnet, clean, corrupted, metric, "exact", max_edges=7)
    picked = ["a0.h1<k>", "m0", "logits", "a1.h0<q>", "a1.h1<v>"]
    for u, v in [e for e in exact.edges() if e[1] in picked]:
        delta = a_corr[u] - a_clean[u]
        patched, _ = hooks.run(clean, {exact.aliases.get(v, v): delta})
        want = float(patched) - float(base)
        # two runs of float32 logits, differenced
        assert abs(float(exact[u, v]) - want) <= 1e-6, (u, v)


def test_edge_names_and_indexing() -> None:
    model = lms.llama()  # 4 query heads, 2 key/value heads
    clean, corrupted = pair()
    scores = edge_attribution(rnet_of(model, clean), clean, corrupted, metric)
    assert scores.sources[:6] == ["input", "a0.h0", "a0.h1", "a0.h2", "a0.h3", "m0"]
    assert "a0.h0<k>" in scores.destinations
    assert "a0.h2<v>" in scores.destinations
    assert "a0.h1<k>" not in scores.destinations  # one per key/value head
    assert torch.equal(scores["input", "a0.h1<k>"], scores["input", "a0.h0<k>"])
    assert scores.nodes[-1] == "logits"
    with pytest.raises(KeyError, match="a head's inputs"):
        scores["input", "a0.h0"]
    with pytest.raises(KeyError, match="no edge"):
        scores["m1", "a0.h0<q>"]
    with pytest.raises(KeyError, match="not a source"):
        scores["logits", "m0"]
    assert "edges" in repr(scores)


def test_refusals_say_what_to_do() -> None:
    model = lms.gpt2()
    clean, corrupted = pair()
    rnet = rnet_of(model, clean)
    with pytest.raises(ValueError, match="one length"):
        edge_attribution(rnet, clean, corrupted[:, :5], metric)
    with pytest.raises(ValueError, match="batch"):
        edge_attribution(rnet, clean, corrupted[:1], metric)
    with pytest.raises(ValueError, match="none of"):
        edge_attribution(rnet, clean, corrupted, metric, "atp")
    with pytest.raises(ValueError, match="steps"):
        edge_attribution(rnet, clean, corrupted, metric, "eap", steps=3)
    with pytest.raises(ValueError, match="one number"):
        edge_attribution(rnet, clean, corrupted, lambda logits: logits[:, -1])
    toy = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2))
    with pytest.raises(ValueError, match="components="):
        edge_attribution(toy, torch.ones(1, 2), torch.zeros(1, 2), lambda o: o.sum())


# -- a linear toy: every method agrees ------------------------------------------


class Linear(nn.Module):
    """x = embed; x += attend(x) (a fixed pattern); x += mlp(x) (linear); logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(7, 4)
        self.attend = Mix()
        self.mlp = nn.Linear(4, 4)
        self.out = nn.Linear(4, 5)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        x = x + self.attend(x)
        x = x + self.mlp(x)
        return self.out(x)


class Mix(nn.Module):
    """Attention with a fixed (causal, uniform) pattern: linear in its input."""

    def __init__(self) -> None:
        super().__init__()
        self.value = nn.Linear(4, 4, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        pattern = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
        return pattern @ self.value(x)


def test_linear_toy_all_methods_agree() -> None:
    net = Linear().eval()
    clean = torch.tensor([[1, 2, 3, 4], [2, 2, 5, 6]])
    corrupted = torch.tensor([[1, 0, 3, 6], [2, 1, 5, 6]])
    rnet = Recorder(net, input_data=[clean])
    parts = Components("embed", ["attend", "mlp"], "out")
    scores = {
        method: edge_attribution(
            rnet, clean, corrupted, lambda y: y[:, -1, 2].mean(), method,
            steps=3 if method == "eap-ig" else None, components=parts,
        )
        for method in ("eap", "eap-ig", "exact")
    }  # fmt: skip
    assert scores["eap"].nodes == ["input", "attend", "mlp", "logits"]
    assert len(scores["eap"]) == 6
    tol = 64 * EPS * float(scores["exact"].values.abs().max())
    for method in ("eap", "eap-ig"):
        torch.testing.assert_close(
            scores[method].values, scores["exact"].values, rtol=0, atol=tol
        )
    assert scores["exact"].values.abs().max() > 1e-3


def test_scores_are_edge_scores() -> None:
    scores = EdgeScores(torch.tensor([[1.0, 2.0]]), ["input"], ["a", "logits"])
    assert list(scores.edges()) == [("input", "a"), ("input", "logits")]
    assert float(scores["input", "logits"]) == 2.0


# -- a port of the authors' code --------------------------------------------------
# Ported from hannamw/EAP-IG (MIT licence), commit
# 795f5607b25638935aec89aee3c1cb4bd9ed72f1: `make_hooks_and_matrices`
# (src/eap/utils.py), `get_scores_eap` and `get_scores_eap_ig`
# (src/eap/attribute.py), and the graph's indices (src/eap/graph.py:
# `_forward_index`, `_backward_index`, `prev_index`), for GPT-2. The
# TransformerLens hook points are emulated by torch hooks on the Hugging Face
# modules: hook_embed -> block 0's input (its position term cancels in the
# differences), attn.hook_result -> each head's slice of c_proj's input times
# its rows of the weight, hook_{q,k,v}_input -> per-head copies of ln_1's
# input (each head's projection computed from its own copy, as TL's
# use_split_qkv_input), hook_mlp_in / hook_mlp_out -> ln_2's input / the MLP's
# output, blocks.{L-1}.hook_resid_post -> ln_f's input. The one change, marked:
# the EAP-IG loop runs over the paper's k = 1..m instead of range(0, steps).


def authors_scores(  # noqa: C901, PLR0915 (a port, kept in the authors' shape)
    model: nn.Module, clean: Tensor, corrupted: Tensor, steps: int | None = None
) -> tuple[Tensor, list[str], list[str]]:
    cfg = model.config
    n_layers, n_heads = cfg.n_layer, cfg.n_head
    d_model, size = cfg.n_embd, cfg.n_embd // cfg.n_head
    n_forward = 1 + n_layers * (n_heads + 1)
    n_backward = n_layers * (3 * n_heads + 1) + 1
    batch_size, n_pos = clean.shape
    scores = torch.zeros((n_forward, n_backward), dtype=torch.float64)
    activation_difference = torch.zeros((batch_size, n_pos, n_forward, d_model))

    def activation_hook(index: Any, acts: Tensor, add: bool = True) -> None:
        if add:
            activation_difference[:, :, index] += acts.detach()
        else:
            activation_difference[:, :, index] -= acts.detach()

    def gradient_hook(prev_index: int, bwd_index: Any, gradients: Tensor) -> None:
        grads = gradients.detach()
        if grads.ndim == 3:
            grads = grads.unsqueeze(2)
        s = torch.einsum(
            "bpfh,bpkh->fk",
            activation_difference[:, :, :prev_index].double(),
            grads.double(),
        )
        s = s.squeeze(1)
        scores[:prev_index, bwd_index] += s

    blocks = model.transformer.h

    def hooks(  # noqa: C901 (the authors' hooks, one place)
        mode: str, input_replacement: Tensor | None = None
    ) -> list[Any]:
        handles = []
        add = mode == "corrupted"
        record = mode in {"corrupted", "clean"}

        def embed_hook(module: nn.Module, args: tuple[Any, ...]) -> Any:
            x = args[0]
            if input_replacement is not None:
                x = input_replacement.clone()
                x.requires_grad = True  # as the authors' input_interpolation_hook
            if record:
                activation_hook(0, x, add)
            return (x, *args[1:]) if input_replacement is not None else None

        handles.append(blocks[0].register_forward_pre_hook(embed_hook))
        for layer, blk in enumerate(blocks):
            i = 1 + layer * (n_heads + 1)

            def result_hook(m: nn.Module, args: tuple[Any, ...], i: int = i) -> None:
                z = args[0].detach().reshape(batch_size, n_pos, n_heads, size)
                w = m.weight.reshape(n_heads, size, d_model)
                if record:
                    activation_hook(
                        slice(i, i + n_heads), torch.einsum("bphs,hsd->bphd", z, w), add
                    )

            def mlp_hook(
                m: nn.Module, a: Any, out: Tensor, index: int = i + n_heads
            ) -> None:
                if record:
                    activation_hook(index, out, add)

            handles.append(blk.attn.c_proj.register_forward_pre_hook(result_hook))
            handles.append(blk.mlp.register_forward_hook(mlp_hook))
            if mode != "grad":
                continue
            seen: dict[str, Tensor] = {}

            def ln1_hook(
                m: nn.Module, args: tuple[Any, ...], seen: dict = seen
            ) -> None:
                seen["x"] = args[0]

            def qkv_hook(  # noqa: PLR0917 (a torch hook, then defaults)
                m: nn.Module, a: Any, out: Tensor, blk: Any = blk, layer: int = layer,
                seen: dict = seen,
            ) -> Tensor:  # fmt: skip
                out = out.clone()
                prev_index = 1 + layer * (n_heads + 1)
                for q in range(3):  # q, k, v
                    split = (
                        seen["x"].unsqueeze(2).repeat(1, 1, n_heads, 1)
                    )  # hook_{q}_input
                    bwd = slice(
                        layer * (3 * n_heads + 1) + q * n_heads,
                        layer * (3 * n_heads + 1) + (q + 1) * n_heads,
                    )
                    split.register_hook(partial_hook(prev_index, bwd))
                    for h in range(n_heads):
                        own = m.forward(blk.ln_1.forward(split[:, :, h]))
                        cols = slice(
                            q * d_model + h * size, q * d_model + (h + 1) * size
                        )
                        out[..., cols] = own[..., cols]
                return out

            def in_hook(
                m: nn.Module, args: tuple[Any, ...], prev: int, bwd: int
            ) -> Any:
                x = args[0].clone()
                x.register_hook(partial_hook(prev, bwd))
                return (x, *args[1:])

            handles.append(blk.ln_1.register_forward_pre_hook(ln1_hook))
            handles.append(blk.attn.c_attn.register_forward_hook(qkv_hook))
            mlp_prev = 1 + layer * (n_heads + 1) + n_heads
            mlp_bwd = layer * (3 * n_heads + 1) + 3 * n_heads
            handles.append(blk.ln_2.register_forward_pre_hook(
                lambda m, a, p=mlp_prev, b=mlp_bwd: in_hook(m, a, p, b)
            ))  # fmt: skip
        if mode == "grad":
            handles.append(model.transformer.ln_f.register_forward_pre_hook(
                lambda m, a: in_hook(m, a, n_forward, -1)
            ))  # fmt: skip
        return handles

    def partial_hook(prev_index: int, bwd_index: Any) -> Any:
        return lambda grad: gradient_hook(prev_index, bwd_index, grad)

    def run(ids: Tensor, mode: str, replacement: Tensor | None = None) -> Tensor:
        handles = hooks(mode, replacement)
        try:
            return model(input_ids=ids).logits
        finally:
            for handle in handles:
                handle.remove()

    with torch.no_grad():
        run(corrupted, "corrupted")
        input_corrupted = activation_difference[:, :, 0].clone()
        run(clean, "clean")
        input_clean = input_corrupted - activation_difference[:, :, 0]
    if steps is None:  # get_scores_eap
        metric(run(clean, "grad")).backward()
    else:  # get_scores_eap_ig
        for step in range(1, steps + 1):  # the authors: range(0, steps)
            new_input = input_corrupted + (step / steps) * (
                input_clean - input_corrupted
            )
            metric(run(clean, "grad", new_input)).backward()
        scores /= steps
    scores /= batch_size  # the authors' mean over examples
    sources = ["input"] + [
        name for i in range(n_layers) for name in
        [*(f"a{i}.h{h}" for h in range(n_heads)), f"m{i}"]
    ]  # fmt: skip
    dests = [
        *(
            name for i in range(n_layers) for name in
            [*(f"a{i}.h{h}<{x}>" for x in "qkv" for h in range(n_heads)), f"m{i}"]
        ),
        "logits",
    ]  # fmt: skip
    return scores, sources, dests


@pytest.mark.slow
@pytest.mark.parametrize("steps", [None, 3])
def test_a_port_of_the_authors_code_gives_the_same_scores(steps: int | None) -> None:
    model = lms.gpt2()
    clean, corrupted = pair(2)
    method = "eap" if steps is None else "eap-ig"
    ours = edge_attribution(
        rnet_of(model, clean), clean, corrupted, metric, method, steps
    )
    theirs, sources, dests = authors_scores(model, clean, corrupted, steps)
    for u, v in ours.edges():
        got = float(ours[u, v]) / len(clean)  # the authors divide by the batch
        want = float(theirs[sources.index(u), dests.index(v)])
        assert abs(got - want) <= 1e-6, (u, v, got, want)
    assert theirs.abs().max() > 1e-5


def test_atp_qk_fix_recovers_a_saturated_head() -> None:
    """Head a1.h0's softmax made saturated by hand: EAP scores 0, AtP* the effect."""
    model = lms.gpt2()
    with torch.no_grad():  # queries and keys of layer 1, head 0, scaled up
        weight = model.transformer.h[1].attn.c_attn.weight
        weight[:, 0:8] *= 300.0
        weight[:, 16:24] *= 300.0
    clean = torch.randint(
        1, lms.VOCAB, (1, 6), generator=torch.Generator().manual_seed(0)
    )
    corrupted = clean.clone()
    corrupted[0, 2] = 18  # moves the head's maximum (found by a search over tokens)
    rnet = rnet_of(model, clean)
    exact = edge_attribution(rnet, clean, corrupted, metric, "exact")
    eap = edge_attribution(rnet, clean, corrupted, metric)
    fixed = edge_attribution(rnet, clean, corrupted, metric, qk_fix=True)
    edge = ("input", "a1.h0<k>")
    effect = float(exact[edge])
    assert abs(effect) > 1e-3
    assert abs(float(eap[edge])) < 0.01 * abs(effect)  # the saturated softmax
    assert abs(float(fixed[edge]) - effect) < 0.3 * abs(effect)  # linear after A
    others = [
        j for j, d in enumerate(eap.destinations) if "<q>" not in d and "<k>" not in d
    ]
    assert torch.equal(fixed.values[:, others], eap.values[:, others])
    with pytest.raises(ValueError, match="qk_fix"):
        edge_attribution(rnet, clean, corrupted, metric, "exact", qk_fix=True)
    llama = lms.llama()
    with pytest.raises(ValueError, match="qk_fix"):
        edge_attribution(rnet_of(llama, clean), clean, corrupted, metric, qk_fix=True)


@pytest.mark.slow
@pytest.mark.parametrize("make", models())
def test_faithfulness_equals_a_hand_run(make: Any) -> None:
    model = make()
    clean, corrupted = pair(3)
    rnet = rnet_of(model, clean)
    scores = edge_attribution(rnet, clean, corrupted, metric)
    circuit = scores.top(12)
    got = faithfulness(rnet, clean, corrupted, metric, circuit)
    hooks = Hooks(model)
    keep = {(u, scores.aliases.get(v, v)) for u, v in circuit}
    want = float(hooks.circuit(clean, corrupted, keep))
    assert abs(got["circuit"] - want) <= 1e-6
    every = faithfulness(rnet, clean, corrupted, metric, list(scores.edges()))
    none = faithfulness(rnet, clean, corrupted, metric, [])
    # all edges kept: the clean run; none: the corrupted run (sums of terms)
    assert abs(every["circuit"] - got["clean"]) <= 1e-5
    assert abs(none["circuit"] - got["corrupted"]) <= 1e-5
    assert abs(got["clean"] - got["corrupted"]) > 1e-4
    assert got["faithfulness"] == pytest.approx(
        (got["circuit"] - got["corrupted"]) / (got["clean"] - got["corrupted"])
    )


def test_top_above_save_load(tmp_path: Any) -> None:
    values = torch.tensor([[0.5, -2.0, 0.0], [0.0, 1.0, 0.25]], dtype=torch.float64)
    real = torch.tensor([[True, True, True], [False, True, True]])
    scores = EdgeScores(values, ["input", "a0.h0"], ["a0.h0<q>", "m0", "logits"], real)
    assert scores.top(2) == [("input", "m0"), ("a0.h0", "m0")]
    assert scores.above(0.3) == [
        ("input", "m0"),
        ("a0.h0", "m0"),
        ("input", "a0.h0<q>"),
    ]
    path = tmp_path / "graph.safetensors"
    scores.save(path, circuit=scores.top(2))
    again, circuit = EdgeScores.load(path)
    assert torch.equal(again.values, values)
    assert torch.equal(again.real, real)
    assert again.sources == scores.sources
    assert again.destinations == scores.destinations
    assert circuit == [("input", "m0"), ("a0.h0", "m0")]
    scores.save(path)
    assert EdgeScores.load(path)[1] is None
    with pytest.raises(ValueError, match="n="):
        scores.top(-1)
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(ValueError, match="no graph"):
        EdgeScores.load(path)
