"""Small example networks, built in code with random weights.

Nothing here downloads weights: every model is freshly initialised by PyTorch's
default initialisers, so seed with :func:`torch.manual_seed` for reproducible
weights. The models serve the command-line demo, the documentation and the
overhead benchmark (``benchmarks/overhead.py``).

Examples
--------
>>> import torch
>>> from scio_recorder.models import demo_model
>>> net = demo_model().eval()
>>> net(torch.randn(4, 3, 32, 32)).shape
torch.Size([4, 10])
"""

from __future__ import annotations

import collections

import torch
from torch import Tensor, nn

__all__ = [
    "BasicBlock",
    "DemoCNN",
    "EncoderNet",
    "ResNetCIFAR",
    "TinyViT",
    "demo_model",
    "digits_cnn",
    "resnet18_cifar",
    "tiny_mlp",
    "transformer_encoder",
    "vit_tiny",
]


def tiny_mlp(
    in_features: int = 16, hidden: int = 32, out_features: int = 10
) -> nn.Sequential:
    """Build a three-layer perceptron.

    The layers are ``Linear, ReLU, Linear, ReLU, Linear``, so the middle
    ``Linear`` is the submodule named ``"2"``.

    Parameters
    ----------
    in_features : int, default 16
        Size of each input sample.
    hidden : int, default 32
        Width of both hidden layers.
    out_features : int, default 10
        Size of each output sample.

    Returns
    -------
    nn.Sequential
        The perceptron, randomly initialised.

    Examples
    --------
    >>> import torch
    >>> net = tiny_mlp()
    >>> net(torch.randn(1, 16)).shape
    torch.Size([1, 10])
    >>> [type(layer).__name__ for layer in net]
    ['Linear', 'ReLU', 'Linear', 'ReLU', 'Linear']
    """
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, out_features),
    )


class BasicBlock(nn.Module):
    """Residual block of ResNet-18, laid out like torchvision's ``BasicBlock``.

    ``conv-bn-relu-conv-bn``, plus a shortcut (a ``1x1`` convolution and batch
    norm when the shape changes, else the identity), then ``relu`` after the
    addition. As in torchvision, one in-place ``ReLU`` module is called twice.

    Parameters
    ----------
    in_planes : int
        Number of input channels.
    planes : int
        Number of output channels.
    stride : int, default 1
        Stride of the first convolution and of the shortcut.
    """

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(
            in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(
            planes, planes, kernel_size=3, stride=1, padding=1, bias=False
        )
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block.

        Parameters
        ----------
        x : Tensor
            Input of shape ``(batch, in_planes, height, width)``.

        Returns
        -------
        Tensor
            Output of shape ``(batch, planes, height / stride, width / stride)``.
        """
        identity = x if self.downsample is None else self.downsample(x)
        out: Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: Tensor = self.relu(out + identity)
        return result


class ResNetCIFAR(nn.Module):
    """ResNet-18 layout for ``32x32`` inputs (see :func:`resnet18_cifar`).

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    blocks_per_stage : tuple of int, default (2, 2, 2, 2)
        Number of :class:`BasicBlock` in each of the four stages.
    """

    def __init__(
        self,
        num_classes: int = 10,
        blocks_per_stage: tuple[int, int, int, int] = (2, 2, 2, 2),
    ) -> None:
        super().__init__()
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_stage(64, blocks_per_stage[0], stride=1)
        self.layer2 = self._make_stage(128, blocks_per_stage[1], stride=2)
        self.layer3 = self._make_stage(256, blocks_per_stage[2], stride=2)
        self.layer4 = self._make_stage(512, blocks_per_stage[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)

    def _make_stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for block_stride in [stride] + [1] * (blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, block_stride))
            self.in_planes = planes * BasicBlock.expansion
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Compute the logits.

        Parameters
        ----------
        x : Tensor
            Images of shape ``(batch, 3, 32, 32)``.

        Returns
        -------
        Tensor
            Logits of shape ``(batch, num_classes)``.
        """
        out: Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = self.layer4(out)
        out = self.avgpool(out)
        out = out.flatten(1)
        logits: Tensor = self.fc(out)
        return logits


def resnet18_cifar(num_classes: int = 10) -> ResNetCIFAR:
    """Build a ResNet-18 for ``32x32`` images, such as CIFAR-10.

    The layout follows torchvision's ``resnet18`` and its attribute names
    (``conv1``, ``bn1``, ``relu``, ``layer1`` ... ``layer4``, ``avgpool``,
    ``fc``), except that the stem is a ``3x3`` convolution with stride 1 and no
    max-pooling, the usual adaptation to small images. Each stage holds two
    :class:`BasicBlock`; the stages have 64, 128, 256 and 512 channels and
    strides 1, 2, 2 and 2.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.

    Returns
    -------
    ResNetCIFAR
        The network, randomly initialised and in training mode.

    Examples
    --------
    >>> import torch
    >>> net = resnet18_cifar().eval()
    >>> net(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    >>> net.layer3(torch.randn(2, 128, 16, 16)).shape
    torch.Size([2, 256, 8, 8])
    """
    return ResNetCIFAR(num_classes=num_classes)


class EncoderNet(nn.Module):
    """Stack of Transformer encoder layers over ``(batch, seq, d_model)`` inputs.

    A thin wrapper around :class:`torch.nn.TransformerEncoder`, kept as the
    submodule ``encoder`` (see :func:`transformer_encoder`).

    Parameters
    ----------
    d_model : int
        Number of expected features in the input.
    nhead : int
        Number of attention heads.
    num_layers : int
        Number of encoder layers.
    dim_feedforward : int
        Width of the feed-forward sublayers.
    """

    def __init__(
        self, d_model: int, nhead: int, num_layers: int, dim_feedforward: int
    ) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward=dim_feedforward, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers)

    def forward(self, x: Tensor) -> Tensor:
        """Encode a batch of sequences.

        Parameters
        ----------
        x : Tensor
            Input of shape ``(batch, seq, d_model)``.

        Returns
        -------
        Tensor
            Output of the same shape.
        """
        out: Tensor = self.encoder(x)
        return out


def transformer_encoder(
    d_model: int = 256, nhead: int = 8, num_layers: int = 4, dim_feedforward: int = 1024
) -> EncoderNet:
    """Build a Transformer encoder taking inputs of shape ``(batch, seq, d_model)``.

    The encoder layers are :class:`torch.nn.TransformerEncoderLayer` with
    ``batch_first=True``. In evaluation mode and without gradients PyTorch runs
    each of them through a fused "fast path", which it abandons for any layer
    holding a forward hook, on itself or on a submodule.

    Parameters
    ----------
    d_model : int, default 256
        Number of expected features in the input.
    nhead : int, default 8
        Number of attention heads.
    num_layers : int, default 4
        Number of encoder layers.
    dim_feedforward : int, default 1024
        Width of the feed-forward sublayers.

    Returns
    -------
    EncoderNet
        The network, randomly initialised and in training mode.

    Examples
    --------
    >>> import torch
    >>> net = transformer_encoder(d_model=32, nhead=4, num_layers=2).eval()
    >>> net(torch.randn(3, 5, 32)).shape
    torch.Size([3, 5, 32])
    >>> len(net.encoder.layers)
    2
    """
    return EncoderNet(d_model, nhead, num_layers, dim_feedforward)


class DemoCNN(nn.Module):
    """Tiny convolutional classifier for ``(batch, 3, 32, 32)`` images.

    Two submodules, ``features`` and ``classifier``, both
    :class:`torch.nn.Sequential`, so that layers sit at two depths. The network
    has no data-dependent control flow: :func:`torch.fx.symbolic_trace` traces it.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16, 32),
            nn.ReLU(),
            nn.Linear(32, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Compute the logits.

        Parameters
        ----------
        x : Tensor
            Images of shape ``(batch, 3, 32, 32)``.

        Returns
        -------
        Tensor
            Logits of shape ``(batch, num_classes)``.
        """
        out: Tensor = self.classifier(self.features(x))
        return out


def demo_model(num_classes: int = 10) -> DemoCNN:
    """Build the tiny CNN used by ``scio-recorder demo``.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.

    Returns
    -------
    DemoCNN
        The network, randomly initialised and in training mode.

    Examples
    --------
    >>> import torch
    >>> net = demo_model()
    >>> net(torch.randn(4, 3, 32, 32)).shape
    torch.Size([4, 10])
    >>> _ = torch.fx.symbolic_trace(net)  # no data-dependent control flow
    """
    return DemoCNN(num_classes=num_classes)


def digits_cnn(num_classes: int = 10, *, in_channels: int = 1) -> nn.Sequential:
    """Build the small CNN of the digits benchmark, for ``8 x 8`` images.

    The net :mod:`scio_recorder.ood.benchmark` and ``scio-recorder demo``
    train on :func:`scio_recorder.data.load_digits`: three 3x3 convolutions
    (16, 32, 64 channels; a 2x2 max pooling after the second), global
    average pooling, then a hidden linear layer of 64 units and the
    classifier. Two :class:`torch.nn.Sequential` halves, ``features`` and
    ``classifier``, as :class:`DemoCNN`: ``features.3`` (32 x 8 x 8) and
    ``features.6`` (64 x 4 x 4) are the ReLUs after the 2nd and 3rd
    convolutions, ``classifier.2`` the penultimate ReLU (64 features).
    About 28,000 parameters; it learns the digits in seconds on a CPU.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 1
        Channels of the input images.

    Returns
    -------
    nn.Sequential
        The network, randomly initialised and in training mode.

    Examples
    --------
    >>> import torch
    >>> net = digits_cnn(6)
    >>> net(torch.randn(4, 1, 8, 8)).shape
    torch.Size([4, 6])
    >>> net.features[6], net.classifier[2]
    (ReLU(), ReLU())
    """
    features = nn.Sequential(
        nn.Conv2d(in_channels, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
    )
    classifier = nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )
    return nn.Sequential(
        collections.OrderedDict([("features", features), ("classifier", classifier)])
    )


class TinyViT(nn.Module):
    """A small Vision Transformer (see :func:`vit_tiny`).

    Submodules: ``patch`` (the patch-embedding ``nn.Conv2d``), ``encoder``
    (an ``nn.TransformerEncoder``, pre-norm, ``batch_first``), ``norm`` (the
    final ``nn.LayerNorm``) and ``head`` (the classification
    ``nn.Linear``); parameters ``cls_token`` and ``pos_embed``.

    Parameters
    ----------
    image_size, patch_size, dim, depth, heads, mlp_dim, num_classes, channels
        As for :func:`vit_tiny`.
    """

    def __init__(  # noqa: PLR0913 (a ViT's shape)
        self,
        *,
        image_size: int,
        patch_size: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        num_classes: int,
        channels: int = 3,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            msg = (
                f"vit_tiny: image_size={image_size} is not a multiple of "
                f"patch_size={patch_size}; choose sizes that tile the image."
            )
            raise ValueError(msg)
        tokens = (image_size // patch_size) ** 2 + 1
        self.patch = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, mlp_dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Classify a batch of images.

        Parameters
        ----------
        x : Tensor
            Images of shape ``(batch, channels, image_size, image_size)``.

        Returns
        -------
        Tensor
            Logits of shape ``(batch, num_classes)``, from the CLS token.
        """
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embed
        out: Tensor = self.head(self.norm(self.encoder(tokens))[:, 0])
        return out


def vit_tiny(  # noqa: PLR0913 (a ViT's shape)
    num_classes: int = 10,
    *,
    image_size: int = 32,
    patch_size: int = 8,
    dim: int = 32,
    depth: int = 2,
    heads: int = 2,
    mlp_dim: int = 64,
) -> TinyViT:
    """Build a tiny Vision Transformer for ``(batch, 3, image_size, image_size)``.

    Patch embedding by a strided ``nn.Conv2d``, a learnt CLS token and
    positional embedding, ``depth`` pre-norm ``nn.TransformerEncoderLayer``
    (no dropout), a final ``nn.LayerNorm`` and a linear head on the CLS
    token. Small enough for tests and examples (about 24k parameters with
    the defaults).

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    image_size : int, default 32
        Height and width of the input images.
    patch_size : int, default 8
        Side of a patch (it must divide ``image_size``).
    dim : int, default 32
        Token width.
    depth : int, default 2
        Number of encoder layers.
    heads : int, default 2
        Attention heads (they must divide ``dim``).
    mlp_dim : int, default 64
        Width of the feed-forward sublayers.

    Returns
    -------
    TinyViT
        The network, randomly initialised and in training mode.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> net = vit_tiny(3).eval()
    >>> net(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 3])
    >>> rnet = Recorder(net, input_size=(1, 3, 32, 32))
    >>> [row.describe() for row in rnet.table.values() if not row.recordable]
    ['2-1 (ModuleList `encoder.layers`)']
    >>> rnet.record("encoder.layers.1")
    >>> _ = rnet(torch.randn(2, 3, 32, 32))
    >>> rnet.activations[(3, 2)].shape  # 16 patches and the CLS token
    torch.Size([2, 17, 32])
    """
    return TinyViT(
        image_size=image_size,
        patch_size=patch_size,
        dim=dim,
        depth=depth,
        heads=heads,
        mlp_dim=mlp_dim,
        num_classes=num_classes,
    )
