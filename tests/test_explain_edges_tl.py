"""Edge attribution against TransformerLens 4's, on the same local models.

TransformerLens 4.3.0 ships EAP on its ``TransformerBridge``
(``transformer_lens.tools.analysis.attribution_patch`` with
``EdgeAttributionConfig(granularity="edge")``; EAP-IG, ``ig_steps > 1``, raises
``NotImplementedError``). Its conventions, read from its source
(``tools/analysis/attribution_patching.py``), and how they map onto ours:

* nodes carry a position: writers ``embed`` (``hook_embed``), ``attn_head_out``
  (the head's ``attn.hook_result``) and ``mlp_out``; readers ``q_input``,
  ``k_input``, ``v_input`` (the split, per-head stream before the block's
  first norm), ``mlp_in`` (before the second norm) and ``logits`` (the last
  ``hook_resid_post``, before the final norm). An edge joins a writer and a
  reader at the same position: summed over positions, it is our edge;
* the score is ``(a_clean[u] - a_corrupt[u]) . d metric / d (input of v)``
  with the gradient on the *corrupt* run (denoising), ours
  ``(a_corrupted[u] - a_clean[u]) . g_v`` on the *clean* run (the authors'):
  TransformerLens's ``(clean=x, corrupt=y)`` is ours with
  ``(clean=y, corrupted=x)``;
* it runs the pairs one at a time, ``metric_fn`` on one example's logits, and
  averages the scores over the pairs; we sum over the batch: with a metric
  that averages over the batch, ours is its average;
* its ``hook_embed`` is the token embedding only, our ``"input"`` the stream
  entering the first block (positions added): the position embeddings are the
  same on both runs, so the differences are equal;
* grouped-query attention is refused (``n_key_value_heads != n_heads``); we
  score the model as it is.

Skipped when transformer_lens is not installed (CI installs none of the
peers); see tests/test_migrate.py for a virtual environment that has it.
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import pytest
import torch
from torch import Tensor

from scio_recorder import Recorder
from scio_recorder.explain import edge_attribution, faithfulness
from tests import lms
from tests.test_migrate import torchvision_operators

EPS32 = torch.finfo(torch.float32).eps


def metric(logits: Tensor) -> Tensor:
    """A logit difference at the last position, averaged over the batch."""
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


def pair(rows: int = 2) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(1, lms.VOCAB, (rows, 6), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(1, lms.VOCAB, (rows,), generator=gen)
    corrupted[0, 4] = 9
    return clean, corrupted


def models(name: str) -> torch.nn.Module:
    """The tiny models of tests/lms.py; ``"llama-mha"``: one key head a head."""
    torchvision_operators()  # before transformers imports a model (and torchvision)
    transformers = pytest.importorskip("transformers")
    if name == "gpt2":
        return lms.gpt2()
    if name == "llama-mha":
        config = copy.deepcopy(lms.llama().config)
        config.num_key_value_heads = config.num_attention_heads
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config).eval()
    return lms.llama()


def bridge_of(model: torch.nn.Module) -> Any:
    """TransformerLens 4's ``TransformerBridge`` on a copy of ``model``."""
    transformer_lens = pytest.importorskip("transformer_lens")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = {f"w{i}": i for i in range(lms.VOCAB)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, "w0"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    special = dict.fromkeys(("unk_token", "bos_token", "eos_token", "pad_token"), "w0")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        fast.save_pretrained(folder)
        bridge = transformer_lens.TransformerBridge.boot_transformers(
            folder, hf_model=copy.deepcopy(model)
        )
    return bridge.eval()


def our_name(node: Any) -> str:
    """TransformerLens's node, without its position, named as ours."""
    kind = node.kind
    if kind == "embed":
        return "input"
    if kind == "logits":
        return "logits"
    if kind in {"mlp_out", "mlp_in"}:
        return f"m{node.layer}"
    if kind == "attn_head_out":
        return f"a{node.layer}.h{node.head}"
    return f"a{node.layer}.h{node.head}<{kind[0]}>"  # q_input -> <q>, ...


def summed(edge_scores: dict[tuple[Any, Any], float]) -> dict[tuple[str, str], float]:
    """TransformerLens's per-position edge scores summed over positions."""
    out: dict[tuple[str, str], float] = {}
    for (u, v), score in edge_scores.items():
        assert u.position == v.position  # the stream joins a position to itself
        key = (our_name(u), our_name(v))
        out[key] = out.get(key, 0.0) + score
    return out


def tolerance(values: Tensor) -> float:
    # The bridge runs the model's weights through its own attention (another
    # order of the same products: test_migrate measured ~10 eps32 relative on
    # the streams); a score is a sum of ~200 products delta * gradient, each
    # side a few float32 roundings off. 256 eps32 of the largest score bounds
    # that; measured 6.2e-9 on GPT-2's scores of 2.7e-3 (~20 eps32 of it).
    return 256 * EPS32 * float(values.abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama-mha"])
def test_transformerlens_4_eap_edges_equal_ours(name):
    """EAP's scores, edge for edge, under the mapping of the module docstring."""
    model = models(name)
    bridge = bridge_of(model)
    analysis = pytest.importorskip("transformer_lens.tools.analysis")
    clean, corrupted = pair()

    theirs = analysis.attribution_patch(
        bridge,
        corrupted,  # their clean: the run whose activations are moved toward
        clean,  # their corrupt: the run whose gradient is taken
        metric,
        analysis.EdgeAttributionConfig(granularity="edge"),
    )
    rnet = Recorder(model, input_data={"input_ids": clean})
    ours = edge_attribution(
        rnet, {"input_ids": clean}, {"input_ids": corrupted}, metric
    )
    theirs_summed = summed(theirs.edge_scores)
    assert set(theirs_summed) == set(ours.edges())  # the same graph
    keys = list(ours.edges())
    ours_values = torch.tensor([float(ours[k]) for k in keys], dtype=torch.float64)
    their_values = torch.tensor([theirs_summed[k] for k in keys], dtype=torch.float64)
    assert float(ours_values.abs().max()) > 1e-4  # not a comparison of zeros
    atol = tolerance(ours_values)
    torch.testing.assert_close(their_values, ours_values, atol=atol, rtol=0)

    # the convention matters: the same arguments in the same order differ
    swapped = edge_attribution(
        rnet, {"input_ids": corrupted}, {"input_ids": clean}, metric
    )
    other = torch.tensor([float(swapped[k]) for k in keys], dtype=torch.float64)
    assert float((other - their_values).abs().max()) > 100 * atol


@pytest.mark.slow
def test_transformerlens_4_refuses_grouped_query_attention_we_score_it():
    """On the GQA Llama, TransformerLens 4 refuses the edges; we score them."""
    model = models("llama")
    bridge = bridge_of(model)
    analysis = pytest.importorskip("transformer_lens.tools.analysis")
    clean, corrupted = pair()
    config = analysis.EdgeAttributionConfig(granularity="edge")
    with pytest.raises(ValueError, match="GQA"):
        analysis.attribution_patch(bridge, corrupted, clean, metric, config)
    rnet = Recorder(model, input_data={"input_ids": clean})
    ours = edge_attribution(
        rnet, {"input_ids": clean}, {"input_ids": corrupted}, metric
    )
    # one key and value destination per group of 2 query heads
    assert "a0.h2<k>" in ours.nodes
    assert "a0.h1<k>" not in ours.nodes
    assert bool(torch.isfinite(ours.values).all())


@pytest.mark.slow
def test_transformerlens_4_faithfulness_equals_ours():
    """Every edge outside a circuit patched from the corrupt run: one number."""
    model = models("gpt2")
    bridge = bridge_of(model)
    analysis = pytest.importorskip("transformer_lens.tools.analysis")
    clean, corrupted = pair(rows=1)
    corrupted[:, -1] = (clean[:, -1] + 7) % lms.VOCAB  # a gap of 0.1 in the metric
    rnet = Recorder(model, input_data={"input_ids": clean})
    scores = edge_attribution(
        rnet, {"input_ids": clean}, {"input_ids": corrupted}, metric
    )
    circuit = scores.top(4)
    ours = faithfulness(
        rnet, {"input_ids": clean}, {"input_ids": corrupted}, metric, circuit
    )
    # their graph, to pick the circuit's edges at every position
    every = analysis.attribution_patch(
        bridge, clean, corrupted, metric, analysis.EdgeAttributionConfig("edge")
    )
    kept = [
        (u, v)
        for (u, v) in every.edge_scores
        if (our_name(u), our_name(v)) in set(circuit)
    ]
    assert len(kept) == len(circuit) * clean.shape[1]
    theirs = analysis.faithfulness(bridge, clean, corrupted, metric, kept)
    assert theirs.circuit_size == len(kept)
    # metrics of order 0.1 through two implementations' roundings (see
    # tolerance): 256 eps32 of the largest
    scale = max(abs(ours["clean"]), abs(ours["corrupted"]), abs(ours["circuit"]))
    atol = 256 * EPS32 * scale
    assert theirs.full_metric == pytest.approx(ours["clean"], abs=atol)
    assert theirs.corrupt_metric == pytest.approx(ours["corrupted"], abs=atol)
    span = abs(ours["clean"] - ours["corrupted"])
    assert span > 1e3 * atol  # the fraction is well defined
    close = 4 * atol / span
    assert theirs.recovered == pytest.approx(ours["faithfulness"], abs=close)
    assert abs(ours["faithfulness"] - 1) > 10 * close  # the patch moved the metric
