"""How far a quantized model's records drift from the float model's.

A Llama from a config (random weights, no download), quantized three ways:
torchao's int8 weight-only (``Int8WeightOnlyConfig``) and dynamic
(``Int8DynamicActivationInt8WeightConfig``), and bitsandbytes' 8-bit
(transformers' ``load_in_8bit`` on the CPU, where bitsandbytes imports).
Each is wrapped with the defaults and records every block's output and the
logits over a stream of token batches, as the float model's recorder does.

* per-layer relative error: ``||q - f|| / ||f||`` over all the stream's
  records of that layer (Frobenius norms), ``q`` the quantized model's
  record and ``f`` the float model's;
* top-token agreement: the fraction of positions whose most likely next
  token is the float model's;
* gradients: what ``record(grads=...)`` does (a refusal, or the gradient to
  the input embeddings, compared with the float model whose weights are the
  dequantized int8 weights, where the quantizer has a ``dequantize``).

``python benchmarks/quantized.py --help`` lists the options; ``--quick``
runs a small model on two batches.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

# `benchmarks/transformers.py` would shadow the library: drop this script's
# folder, first on `sys.path`, before importing it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
import transformers  # noqa: E402 (after the path fix)
from torch import nn  # noqa: E402 (after the path fix)

from scio_recorder import Recorder  # noqa: E402 (after the path fix)


def llama(args: argparse.Namespace) -> nn.Module:
    """The float model (the same weights every call)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=args.width,
        intermediate_size=args.width * 8 // 3 // 32 * 32,
        num_hidden_layers=args.layers,
        num_attention_heads=args.width // 32,
        num_key_value_heads=max(1, args.width // 64),
        vocab_size=args.vocab,
        max_position_embeddings=args.seq,
    )
    return transformers.LlamaForCausalLM(config).eval()


def torchao_model(plain: nn.Module, kind: str) -> nn.Module:
    """``plain`` quantized by torchao (weight-only or dynamic int8)."""
    from torchao.quantization import (  # noqa: PLC0415 (optional)
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    model = copy.deepcopy(plain)
    config = Int8WeightOnlyConfig() if kind == "weight-only" else None
    quantize_(model, config or Int8DynamicActivationInt8WeightConfig())
    return model


def bnb_model(plain: nn.Module) -> nn.Module:
    """``plain`` saved and loaded in 8 bits by transformers and bitsandbytes."""
    import bitsandbytes  # noqa: F401, PLC0415 (optional: fails here if missing)

    folder = tempfile.mkdtemp()
    plain.save_pretrained(folder)
    config = transformers.BitsAndBytesConfig(load_in_8bit=True)
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=config, device_map="cpu"
    ).eval()


def records(model: nn.Module, stream: list[torch.Tensor], layers: list[str]) -> dict:
    """Every layer's records over the stream, and the logits, concatenated."""
    rnet = Recorder(model, input_data={"input_ids": stream[0]})
    rnet.record(*layers)
    kept: dict[str, list[torch.Tensor]] = {name: [] for name in [*layers, "logits"]}
    with torch.no_grad():
        for ids in stream:
            kept["logits"].append(rnet(input_ids=ids).logits)
            for name in layers:
                kept[name].append(rnet.activations_of(name)[0])
    return {name: torch.cat(values) for name, values in kept.items()}


def relative(q: torch.Tensor, f: torch.Tensor) -> float:
    return float((q - f).norm() / f.norm())


def dequantized(model: nn.Module, plain: nn.Module) -> nn.Module | None:
    """The float model with the quantized weights, dequantized (if it can)."""
    out = copy.deepcopy(plain)
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if module is not model else None
        if weight is None:
            continue
        if getattr(weight, "SCB", None) is not None:  # bitsandbytes: row scales
            value = weight.float() * weight.SCB.float()[:, None] / 127
        elif type(weight).__name__ == "Int8Tensor":  # torchao
            value = weight.dequantize().float()
        else:
            continue
        with torch.no_grad():
            out.get_submodule(name).weight.copy_(value)
    return out


def gradients(model: nn.Module, plain: nn.Module, ids: torch.Tensor) -> str:
    """What ``record(grads=...)`` does, and how close the gradient is."""
    rnet = Recorder(model, input_data={"input_ids": ids})
    try:
        rnet.record(grads=["model.layers.0"])
    except ValueError as error:
        # the message's first clause: "... but 15 of its layers (...) quantize
        # their input to int8" without the names, up to its first colon
        said = re.sub(r" \(`[^)]*\)", "", str(error)).split(":")[0]
        return f"refused ({said})"
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    rnet(inputs_embeds=embeds).logits.square().sum().backward()
    reference = dequantized(model, plain)
    if reference is None or embeds.grad is None:
        return "computed"
    plain_embeds = reference.get_input_embeddings()(ids).detach().requires_grad_()
    reference(inputs_embeds=plain_embeds).logits.square().sum().backward()
    error = relative(embeds.grad, plain_embeds.grad)
    return f"computed; {error:.1e} from the dequantized float model's"


def main() -> None:
    """Print the fidelity table as Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a small model, 2 batches")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.width, args.vocab, args.seq, args.batches = 2, 64, 100, 16, 2
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # transformers' and the quantizers' notes
    plain = llama(args)
    gen = torch.Generator().manual_seed(1)
    stream = [
        torch.randint(0, args.vocab, (4, args.seq), generator=gen)
        for _ in range(args.batches)
    ]
    layers = [f"model.layers.{i}" for i in range(args.layers)]
    want = records(plain, stream, layers)
    variants: dict[str, Any] = {
        "torchao int8 weight-only": lambda: torchao_model(plain, "weight-only"),
        "torchao int8 dynamic": lambda: torchao_model(plain, "dynamic"),
        "bitsandbytes 8-bit": lambda: bnb_model(plain),
    }
    columns: dict[str, dict[str, str]] = {}
    for name, make in variants.items():
        try:
            model = make()
        except ImportError as error:
            print(f"{name}: not run ({error})")
            continue
        got = records(model, stream, layers)
        column = {layer: f"{relative(got[layer], want[layer]):.2e}" for layer in layers}
        column["logits"] = f"{relative(got['logits'], want['logits']):.2e}"
        agree = got["logits"].argmax(-1) == want["logits"].argmax(-1)
        column["top token"] = f"{float(agree.float().mean()):.3f}"
        column["gradients"] = gradients(model, plain, stream[0])
        columns[name] = column
    params = sum(p.numel() for p in plain.parameters()) / 1e6
    tokens = sum(ids.numel() for ids in stream)
    print(
        f"Llama, {args.layers} layers, width {args.width}, {params:.1f}M parameters "
        f"(random weights), {tokens} tokens in {args.batches} batches; "
        f"torch {torch.__version__}\n"
    )
    print("| record | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for row in [*layers, "logits", "top token", "gradients"]:
        cells = " | ".join(column[row] for column in columns.values())
        label = {"top token": "top-token agreement"}.get(row, row)
        print(f"| {label} | {cells} |")


if __name__ == "__main__":
    main()
