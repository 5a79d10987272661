"""The whole catalogue on the demo CNN, a ResNet-18, a ViT and a Hugging Face model.

Every detector of ``scio_recorder.ood`` (built by
``scio_recorder.ood.benchmark.catalogue`` with layers named for each net)
fits and scores on the unmodified models, from their configs: the feature
maps of the convolutional blocks and the token maps of the encoder blocks
feed the multi-layer detectors, the classifier head is found by the
detectors that read the last ``nn.Linear``. The formulas are checked
against hand-written oracles in the other ``test_ood_*`` files. Here: each
one runs, gives one finite score per sample, and refuses what it cannot do
with a message. The two CNNs take longer (``slow``).
"""

from __future__ import annotations

import pytest
import torch

from scio_recorder import Recorder
from scio_recorder.models import demo_model, resnet18_cifar, vit_tiny
from scio_recorder.ood.benchmark import catalogue

transformers = pytest.importorskip("transformers")

# SHE needs a fit sample of every class that the net classifies correctly:
# these nets are untrained (it is exercised on the trained digits CNN).
UNTRAINED = {"SHE"}
# They move the input (a gradient step, squeezing, noise): a language
# model's token ids cannot be moved, and each refuses them naming the input.
MOVE_THE_INPUT = ["ODIN", "AdaScale", "FeatureSqueezing", "Odds"]


def demo():
    torch.manual_seed(0)
    rnet = Recorder(demo_model().eval(), input_size=(1, 3, 32, 32))
    train = [(torch.randn(32, 3, 32, 32), torch.arange(32) % 10) for _ in range(2)]
    layers = {"penultimate": "classifier.2", "blocks": ("features.1", "features.4")}
    return rnet, train, torch.randn(4, 3, 32, 32), layers


def resnet():
    torch.manual_seed(0)
    # 8 x 8 inputs (1 x 1 after layer4) and one batch: a ResNet-18 is slow.
    # Shuffled labels: Gram holds out samples 9, 19, 29, 39, which for
    # `arange(40) % 10` would be all of class 9 (and it needs every class).
    rnet = Recorder(resnet18_cifar().eval(), input_size=(1, 3, 8, 8))
    train = [(torch.randn(40, 3, 8, 8), torch.randperm(40) % 10)]
    layers = {"penultimate": "avgpool", "blocks": ("layer3", "layer4")}
    return rnet, train, torch.randn(4, 3, 8, 8), layers


def vit():
    torch.manual_seed(0)
    rnet = Recorder(vit_tiny().eval(), input_size=(1, 3, 32, 32))
    train = [(torch.randn(32, 3, 32, 32), torch.arange(32) % 10) for _ in range(2)]
    layers = {
        "penultimate": "norm",
        "blocks": ("encoder.layers.0", "encoder.layers.1"),
    }
    return rnet, train, torch.randn(4, 3, 32, 32), layers


def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    rnet = Recorder(model, input_data={"input_ids": torch.randint(0, 100, (2, 8))})
    train = [(torch.randint(0, 100, (32, 8)), torch.arange(32) % 3) for _ in range(2)]
    layers = {
        "penultimate": "bert.pooler.activation",
        "blocks": ("bert.encoder.layer.0.output", "bert.encoder.layer.1.output"),
    }
    return rnet, train, torch.randint(0, 100, (4, 8)), layers


MODELS = {"demo": demo, "resnet": resnet, "vit": vit, "bert": bert}
SLOW = {"demo", "resnet"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
        for name in MODELS
    ],
)
def model(request):
    return request.param, MODELS[request.param]()


def test_every_detector_fits_and_scores_the_unmodified_model(model):
    name, (rnet, train, x, layers) = model
    detectors = catalogue(rnet, **layers)
    assert len(detectors) == 42
    for key, detector in detectors.items():
        if key in UNTRAINED or (name == "bert" and key in MOVE_THE_INPUT):
            continue
        detector.fit(train, input=0, target=1)
        scores = detector(x)
        assert scores.shape == (4,), key
        assert torch.isfinite(scores.double()).all(), key


@pytest.mark.parametrize("name", MOVE_THE_INPUT)
def test_detectors_moving_the_input_refuse_token_ids_naming_it(name):
    # ODIN and AdaScale move the input along its gradient, FeatureSqueezing
    # squeezes it, Odds adds noise: token ids have none of these (they would
    # have to move the embeddings, which they do not).
    rnet, _, x, layers = bert()
    detector = catalogue(rnet, **layers)[name]
    with pytest.raises(
        TypeError,
        match=rf"^{name} perturbs the net's first positional input, which must be "
        r"a floating tensor; got a torch\.int64",
    ):
        detector.score_inputs((x,), {})  # its own passes, fitted or not
