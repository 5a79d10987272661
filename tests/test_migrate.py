"""The migration pages' jobs, run by the peer library and by us: the numbers agree.

One test per page whose peer installs with pip (``docs/migrate/``):
TransformerLens 4, nnsight 0.8, pytorch-ood 0.4 and captum 0.9. Each runs
both sides of one job of its page on the same model and inputs and compares
the numbers; it is skipped when the peer is not installed (CI installs none
of them). To run them, in a virtual environment of their own::

    python -m venv /tmp/peers && . /tmp/peers/bin/activate
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    pip install -c <(echo torch==2.13.0) pytorch-ood captum nnsight transformer-lens
    pip install -c <(echo torch==2.13.0) -e '.[dev]'
    python -m pytest tests/test_migrate.py -m "slow or not slow" -p no:cacheprovider

pytorch-ood and TransformerLens import torchvision, whose compiled operators
may be missing (a torchvision wheel built for another torch):
:func:`torchvision_operators` declares the two its import needs, here in
the tests only.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from scio_recorder import Recorder

EPS32 = torch.finfo(torch.float32).eps
ROOT = Path(__file__).resolve().parent.parent


def torchvision_operators() -> None:
    """Declare ``torchvision::nms`` and ``qnms`` if torchvision's own are missing.

    torchvision registers fake kernels for them at import; without its
    compiled library the registration fails. Declared (never run) here.
    """
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # torchvision's own library already defines them
        return
    torchvision_operators.library = lib  # type: ignore[attr-defined] (kept alive)


def gpt2(folder: str | None = None):
    """A tiny GPT-2 (random weights); saved to ``folder`` with a tokenizer."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=100,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="eager",
        )
    ).eval()
    if folder is not None:
        tokenizers = pytest.importorskip("tokenizers")
        words = {f"w{i}": i for i in range(100)}
        tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, "w0"))
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            unk_token="w0",  # noqa: S106 (a token, not a password)
            bos_token="w0",  # noqa: S106 (a token, not a password)
            eos_token="w0",  # noqa: S106 (a token, not a password)
            pad_token="w0",  # noqa: S106 (a token, not a password)
        )
        model.save_pretrained(folder)
        fast.save_pretrained(folder)
    return model


@pytest.mark.slow
def test_transformerlens_4_cache_patch_and_pattern_match_ours():
    """docs/migrate/transformerlens.md: ``run_with_cache``, a patch, the pattern."""
    torchvision_operators()
    transformer_lens = pytest.importorskip("transformer_lens")
    from scio_recorder.explain import patch  # noqa: PLC0415
    from scio_recorder.views import attention_from_qk  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as folder:
        model = gpt2(folder)
        hf_model = copy.deepcopy(model)  # the bridge rebuilds the model it wraps
        bridge = transformer_lens.TransformerBridge.boot_transformers(
            folder, hf_model=hf_model
        )
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[:, 2] = (ids[:, 2] + 1) % 100

    # TransformerLens: the cache of a run
    logits, cache = bridge.run_with_cache(ids)
    # ours: the same residual streams, recorded on the Hugging Face model
    rnet = Recorder(model, input_data={"input_ids": ids})
    rnet.record("transformer.h.0", "transformer.h.1", "transformer.h.0.attn.c_attn")
    with torch.no_grad():
        ours = rnet(input_ids=ids).logits
    # The bridge runs the model's own weights through its own attention
    # (another order of the same products and softmax): a few float32
    # roundings of values of order 0.1 to 1, measured 7.5e-9 on the streams
    # and 1.8e-7 on the logits; 1e-6 absolute bounds ~ 10 eps32 of those.
    close = {"atol": 1e-6, "rtol": 1e-5}
    torch.testing.assert_close(logits, ours, **close)
    for i in range(2):
        stream = rnet.activations_of(f"transformer.h.{i}")[0]
        torch.testing.assert_close(
            cache[f"blocks.{i}.hook_resid_post"], stream, **close
        )
    # the attention pattern: recomputed from the recorded queries and keys;
    # the same products by another kernel, a few float32 roundings apart
    qkv = rnet.activations_of("transformer.h.0.attn.c_attn")[0]
    q, k, _ = qkv.split(32, dim=-1)
    torch.testing.assert_close(
        attention_from_qk(q, k, num_heads=4),
        cache["blocks.0.attn.hook_pattern"],
        **close,
    )

    # a patch: block 0's output at position 2 taken from the clean run
    def hook(resid, hook):
        resid[:, 2] = cache["blocks.0.hook_resid_post"][:, 2]
        return resid

    theirs = bridge.run_with_hooks(
        other, fwd_hooks=[("blocks.0.hook_resid_post", hook)]
    )
    with torch.no_grad():
        patched = patch(
            rnet,
            {"input_ids": ids},
            {"input_ids": other},
            "transformer.h.0",
            where=(slice(None), 2),
        ).logits
    torch.testing.assert_close(theirs, patched, **close)


@pytest.mark.slow
def test_nnsight_trace_save_and_edit_match_ours():
    """docs/migrate/nnsight.md: ``.output.save()`` and an edit in a trace."""
    nnsight = pytest.importorskip("nnsight")
    model = gpt2()
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(2))
    wrapped = nnsight.NNsight(model)
    with wrapped.trace(ids):
        saved = wrapped.transformer.h[0].output.save()
        wrapped.transformer.h[1].mlp.output[:, -1] = 0
        theirs = wrapped.output.logits.save()

    rnet = Recorder(model, input_data={"input_ids": ids})
    rnet.record("transformer.h.0")

    def zero_last(out):
        out = out.clone()
        out[:, -1] = 0
        return out

    with torch.no_grad():
        ours = rnet(
            input_ids=ids, activation_postproc={"transformer.h.1.mlp": zero_last}
        ).logits
    assert torch.equal(saved, rnet.activations_of("transformer.h.0")[0])
    assert torch.equal(theirs, ours)


class _Twice(nn.Module):
    """One module called twice in a forward."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3)

    def forward(self, x):
        return self.layer(self.layer(x))


def test_nnsight_0_8_reads_several_calls_with_tracer_iter_as_the_page_says():
    """docs/migrate/nnsight.md: several calls of one module, ``.all()``."""
    # The page used `.next()`, which nnsight 0.8.1 does not have, and a
    # module's `.all()`, which it deprecates for `tracer.all()`.
    nnsight = pytest.importorskip("nnsight")
    torch.manual_seed(0)
    net, x = _Twice(), torch.randn(2, 3)
    wrapped = nnsight.NNsight(net)
    assert not hasattr(wrapped.layer, "next")
    with wrapped.trace(x) as tracer:
        theirs = list().save()  # noqa: C408 (nnsight saves a list made in the trace)
        for _ in tracer.iter[:2]:
            theirs.append(wrapped.layer.output)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with wrapped.trace(x):  # (its own statement: nnsight reads the block)
            for _ in wrapped.layer.all():
                wrapped.layer.output.save()  # (a loop reaching no module never ends)
    deprecations = [
        str(w.message)
        for w in caught
        if issubclass(w.category, nnsight.NNsightDeprecationWarning)  # FutureWarning
    ]
    assert deprecations == ["model.all() is deprecated; use tracer.all() instead."]
    rnet = Recorder(net, input_data=x)
    labels = [layer.label for layer in rnet.table.calls_of(net.layer)]
    rnet.record(*labels)
    with torch.no_grad():
        rnet(x)
    ours = [rnet.activations_of(label)[0] for label in labels]
    assert len(theirs) == len(ours) == 2
    assert all(map(torch.equal, theirs, ours))


def digits_net():
    """A small classifier of the digits 0-5, trained for a few epochs."""
    from scio_recorder.data import load_digits, train_classifier  # noqa: PLC0415

    images, labels = load_digits()
    images = images.flatten(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 6))
    seen = labels < 6
    train_classifier(net, images[seen][:600], labels[seen][:600], epochs=5)
    return (
        net,
        images[seen][:600],
        labels[seen][:600],
        images[seen][600:],
        images[~seen],
    )


def test_pytorch_ood_0_4_fit_takes_the_loader_alone():
    """docs/migrate/pytorch-ood.md: `fit(loader)`, no `device=`; KNN's k = 50."""
    # The page said `detector.fit(loader, device=)`, which 0.4.0's is not.
    pytest.importorskip("pytorch_ood")
    torchvision_operators()
    import inspect  # noqa: PLC0415 (the check of this test)

    from pytorch_ood.api import Detector  # noqa: PLC0415 (skipped when absent)
    from pytorch_ood.detector import KNN, Mahalanobis  # noqa: PLC0415

    for fit in (Detector.fit, KNN.fit, Mahalanobis.fit):
        assert list(inspect.signature(fit).parameters) == ["self", "data_loader"]
    assert inspect.signature(KNN).parameters["k"].default == 50


@pytest.mark.slow
def test_pytorch_ood_detectors_and_auroc_match_ours():
    """docs/migrate/pytorch-ood.md: MSP, energy, Mahalanobis and the AUROC."""
    torchvision_operators()
    pytest.importorskip("pytorch_ood")
    from pytorch_ood.detector import EnergyBased, Mahalanobis, MaxSoftmax  # noqa: PLC0415
    from pytorch_ood.metrics import OODMetrics  # noqa: PLC0415

    from scio_recorder.ood import MSP, Energy, evaluate  # noqa: PLC0415
    from scio_recorder.ood import Mahalanobis as OurMahalanobis  # noqa: PLC0415

    net, train_x, train_y, test_x, unseen = digits_net()
    rnet = Recorder(net, input_size=(1, 64))
    ours = {
        "MSP": MSP(rnet),
        "Energy": Energy(rnet),
        "Mahalanobis": OurMahalanobis(rnet, layer="1"),
    }
    ours["Mahalanobis"].fit([(train_x, train_y)], target=1)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train_x, train_y), batch_size=100
    )
    theirs = {
        "MSP": MaxSoftmax(net),
        "Energy": EnergyBased(net),
        "Mahalanobis": Mahalanobis(net[:2]).fit(loader),
    }
    results = evaluate(ours, [test_x], [unseen], input=None)
    for name, detector in theirs.items():
        inside, outside = detector.predict(test_x), detector.predict(unseen)
        if name != "Mahalanobis":
            # the same softmax or logsumexp of the same logits: equal up to
            # the rounding of the reduction, ~ a few eps32 of the score
            torch.testing.assert_close(
                inside, results.id_scores[name], atol=0, rtol=1e-6
            )
        metrics = OODMetrics()
        metrics.update(
            torch.cat([inside, outside]),
            torch.cat([torch.zeros(len(inside)), -torch.ones(len(outside))]).long(),
        )
        # pytorch-ood's Mahalanobis is ours times a positive constant (its
        # covariance is not divided by N, its score halved, a 1e-6 ridge):
        # the same ranking, the same AUROC
        assert metrics.compute()["AUROC"] == pytest.approx(
            results[name]["AUROC"], abs=1e-6
        ), name


@pytest.mark.slow
def test_captum_gradcam_and_layer_activation_match_ours():
    """docs/migrate/captum.md: ``LayerGradCam`` and ``LayerActivation``."""
    captum_attr = pytest.importorskip("captum.attr")
    from scio_recorder.explain import grad_cam  # noqa: PLC0415
    from scio_recorder.models import digits_cnn  # noqa: PLC0415

    torch.manual_seed(0)
    net = digits_cnn(num_classes=6).eval()
    x = torch.rand(4, 1, 8, 8)
    layer = net.features[5]  # the last convolution, [B, 64, 4, 4]
    rnet = Recorder(net, input_size=(1, 1, 8, 8))
    target = torch.tensor([0, 1, 2, 3])
    theirs = captum_attr.LayerGradCam(net, layer).attribute(
        x, target=target, relu_attributions=True
    )[:, 0]
    # scaled to [0, 1] as ours is (a map of zeros stays zero)
    top = theirs.flatten(1).amax(dim=1).clamp(min=torch.finfo(theirs.dtype).tiny)
    theirs = theirs / top[:, None, None]
    ours = grad_cam(rnet, x, layer="features.5", target=target, upsample=False)
    # The same gradients and sums: ours takes the gradient with autograd's
    # grad, captum with hooks of its own. A few roundings of values in [0, 1].
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)

    activation = captum_attr.LayerActivation(net, layer).attribute(x)
    rnet.record("features.5")
    rnet(x)
    assert torch.equal(activation, rnet.activations_of("features.5")[0])


@pytest.mark.slow
def test_nnsight_invokes_source_skip_and_stop_match_ours():
    """docs/migrate/nnsight.md, "More of what nnsight users do": four jobs, both ways.

    nnsight batches its invokes as we batch the prompts, and runs the same
    modules on the same tensors; a batched matmul may still round otherwise
    than two of one row (another kernel), so rows compare up to a few float32
    roundings of values of order 1: ``atol = rtol = 64 * eps32``.
    """
    nnsight = pytest.importorskip("nnsight")
    from scio_recorder.calls import CallRecorder  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as folder:
        model = gpt2(folder)
        lm = nnsight.TransformersModel(
            folder, task="text-generation", dispatch=True, attn_implementation="eager"
        )
        lm._module.eval()  # loaded in train mode: dropout
        close = {"atol": 64 * EPS32, "rtol": 64 * EPS32}
        rnet = Recorder(model, input_data={"input_ids": torch.zeros(1, 4).long()})
        rnet.record("transformer.h.0")
        prompts = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])

        # several prompts in one trace / one batch
        with lm.trace() as tracer:
            with tracer.invoke("w1 w2 w3 w4"):
                first = lm.transformer.h[0].output.save()
            with tracer.invoke("w5 w6 w7 w8"):
                second = lm.transformer.h[0].output.save()
        with torch.no_grad():
            rnet(input_ids=prompts)
        ours = rnet.activations_of("transformer.h.0")[0]
        torch.testing.assert_close(ours[0], first[0], **close)
        torch.testing.assert_close(ours[1], second[0], **close)

        # .source: the attention weights inside block 0's attention
        with lm.trace("w1 w2 w3 w4"):
            source = lm.transformer.h[0].attn.source
            theirs = source.attention_interface_1.output[1].save()
        path = "transformers.models.gpt2.modeling_gpt2.eager_attention_forward"
        with CallRecorder(path) as calls, torch.no_grad():
            model(input_ids=prompts[:1])
        torch.testing.assert_close(calls.get(path, 0)[1], theirs, **close)

        # .skip: block 0 passes its input through
        with lm.trace("w1 w2 w3 w4"):
            lm.transformer.h[0].skip(lm.transformer.h[0].input)
            skipped = lm.output.logits.save()
        kept = {}

        def keep(hidden):
            kept["input"] = hidden

        with torch.no_grad():
            logits = rnet(
                input_ids=prompts[:1],
                input_postproc={"transformer.h.0": keep},
                activation_postproc={"transformer.h.0": lambda _: kept["input"]},
            ).logits
        torch.testing.assert_close(logits, skipped, **close)
        with torch.no_grad():
            plain = model(input_ids=prompts[:1]).logits
        assert not torch.allclose(plain, logits)  # the skip changed something

        # tracer.stop / early_exit
        with lm.trace("w1 w2 w3 w4") as tracer:
            hidden = lm.transformer.h[0].output.save()
            tracer.stop()
        with torch.no_grad():
            assert rnet(input_ids=prompts[:1], early_exit=True) is None
        torch.testing.assert_close(
            rnet.activations_of("transformer.h.0")[0], hidden, **close
        )


def page_blocks(page: str, heading: str) -> list[str]:
    """The ```python blocks of a migration page's section, in order."""
    text = (ROOT / "docs" / "migrate" / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else None]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.mark.slow
def test_transformerlens_direct_logit_attribution_matches_the_pages():
    """docs/migrate/transformerlens.md, "Direct logit attribution": TL's own.

    The page's two blocks run on the model TL's bridge wraps; TL decomposes
    the final residual (``decompose_resid``, ``stack_head_results``), applies
    the final LayerNorm's frozen scale (``apply_ln_to_stack``) and projects
    on the answer's unembedding. Without ``fold_ln`` (the bridge keeps the
    model's weights) the LayerNorm's weight is folded by hand, as
    ``HookedTransformer``'s ``fold_ln`` folds it into ``W_U``.
    """
    torchvision_operators()
    transformer_lens = pytest.importorskip("transformer_lens")
    with tempfile.TemporaryDirectory() as folder:
        model = gpt2(folder)
        ln = model.transformer.ln_f
        with torch.no_grad():  # a LayerNorm that is not the identity
            generator = torch.Generator().manual_seed(4)
            ln.weight.copy_(1 + torch.rand(32, generator=generator))
            ln.bias.copy_(torch.randn(32, generator=generator))
        bridge = transformer_lens.TransformerBridge.boot_transformers(
            folder, hf_model=copy.deepcopy(model)
        )
    tokens = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(3))
    namespace = {"Recorder": Recorder, "torch": torch, "model": model, "tokens": tokens}
    blocks = page_blocks("transformerlens.md", "Direct logit attribution")
    assert len(blocks) == 2
    for block in blocks:  # each block asserts that its parts sum up
        exec(block, namespace)  # noqa: S102 (the page's own code)
    answer = namespace["answer"]

    logits, cache = bridge.run_with_cache(tokens)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(input_ids=tokens).logits)
    direction = bridge.tokens_to_residual_directions(answer) * ln.weight  # fold_ln
    stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
    assert labels[:2] == ["embed", "pos_embed"]
    theirs = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1) @ direction
    # the page sums the token and position embeddings (one input recorded)
    theirs = torch.cat([theirs[:2].sum(0, keepdim=True), theirs[2:]]).detach()
    heads, names = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    assert names[4:] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    their_heads = cache.apply_ln_to_stack(heads[4:], layer=-1, pos_slice=-1)
    their_heads = (their_heads @ direction).detach()
    # TL in float32, the page in float64: float32 roundings of terms of order
    # 1 to 10 (a 32-term product, a scale), measured 1e-6; 1e-5 bounds ~ 100
    # eps32 of them
    close = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(namespace["dla"].float(), theirs, **close)
    torch.testing.assert_close(namespace["per_head"].float(), their_heads, **close)


@pytest.mark.slow
def test_pytorch_ood_outlier_exposure_loss_is_the_pages():
    """docs/migrate/pytorch-ood.md: the page's loss is ``OutlierExposureLoss``."""
    torchvision_operators()
    pytest.importorskip("pytorch_ood")
    from pytorch_ood.loss import OutlierExposureLoss  # noqa: PLC0415

    (block,) = [
        b
        for b in page_blocks("pytorch-ood.md", "Training losses and data sets")
        if "def outlier_exposure" in b
    ]
    source = re.search(
        r"def outlier_exposure.*?return loss\.mean\(\)\n", block, re.DOTALL
    )
    assert source is not None
    namespace = {"torch": torch, "nn": nn}
    exec(source[0], namespace)  # noqa: S102 (the page's own code)
    ours = namespace["outlier_exposure"]
    generator = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(40, 6, generator=generator)
    targets = torch.randint(-1, 6, (40,), generator=generator)
    assert (targets < 0).any()
    assert (targets >= 0).any()
    for alpha in (0.5, 2.0):
        theirs = OutlierExposureLoss(alpha=alpha)
        for keep in (targets >= 0, targets < 0, torch.ones(40, dtype=torch.bool)):
            # the same terms, summed in the same order: a few float32
            # roundings of a mean of values of order 1 to 10
            torch.testing.assert_close(
                ours(logits[keep], targets[keep], alpha=alpha),
                theirs(logits[keep], targets[keep]),
                atol=0,
                rtol=16 * EPS32,
            )
