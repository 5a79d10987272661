"""Measure `scio_recorder.activations.write` and the reading of what it wrote.

A GPT-2 language model from a config (random weights, GPT-2's vocabulary of
50,257 tokens, no download), 12 layers of width 256, CPU, one thread, eval
mode, batches of 8 x 128 token ids with an attention mask (right padding:
each row keeps 64 to 128 tokens). Four residual streams are stored (the
outputs of blocks 2, 5, 8 and 11), in float32.

Writing, as paired ratios (every round runs every scenario once over the
same batches, in a freshly shuffled order; a ratio is the median over rounds
of the two scenarios' times in the same round, so slow drifts of a shared
machine cancel):

* ``plain``: the model over the batches, ``model(**batch)``, nothing kept;
* ``write``: ``write(rnet, batches, folder, layers=4 blocks)`` into a new
  folder (unshuffled);
* ``write_shuffled``: the same with ``shuffle_buffer=65536``;
* ``write_full_pass``: ``write`` with the pass run to its end
  (``early_exit=False``; ``write`` stops it after the last stored block);
* ``hand_memmap``: four forward hooks keeping the blocks' outputs and a
  loop writing the kept tokens (and their row and column) into
  ``np.lib.format.open_memmap`` files sized beforehand.
* ``write_no_checksum``: ``write`` without the shards' CRC-32
  (``_shards.CHECKSUM`` off): ``write / write_no_checksum`` is what the
  checksums cost a write.

Tokens per second count the tokens kept (the mask's ones). Before timing, the
set written is checked against the memmaps (equal bit for bit), and the
hooks' and the plain model's logits are the same; a failed check prints
``CHECK FAILED`` and exits with status 1.

Peak memory: how far a write raises its process's resident memory above
what it was before the write (``VmHWM`` reset once the model is built,
minus ``VmRSS`` then; each run in a fresh process with glibc's malloc
pinned to unmap freed blocks, Linux), for several numbers of batches, with
shards of 8,192 tokens (32 MiB), next to a plain forward's own; flat means
the number of tokens written does not show.

Reading: opening the set and reading it once, with and without checking
the shards' CRC-32 (``ActivationDataset(path, verify=...)``, a fresh
dataset each time: each shard is checked on its first read), as a paired
ratio; then a set of four layers of width 256 over ``--read-batches`` batches
(written by a 4-layer model of that width, which writes fast), read with a
``DataLoader(ds, batch_size=4096, shuffle=True)`` and with
``ds.loader(4096, shuffle=True)`` (a batch per gather), each with 0 and 2
workers, in tokens per second over one epoch (starting the workers
included).

An SAE's latents (a random top-k SAE on the middle block: ``d_sae = 16 x
width``, ``k = 32``), paired in the same way: the block itself stored dense
(``layer``), its latents stored sparsely (``SparseLatents``: 32 index-value
pairs a token), and its latents stored dense (the SAE attached with
``sae.attach`` and its latents' layer written), each alone, with the size
of the shards on disk. Checked first: the sparse latents read back dense
equal ``sae.encode`` of the stored layer's rows, batch by batch, bit for
bit.

SAELens's ``CacheActivationsRunner`` is timed where ``sae_lens`` and
``datasets`` import (they are not dependencies; a virtual environment with
``pip install sae-lens`` and this package has both), on a TransformerLens
model of the same shape (see :func:`saelens`); otherwise the report says so.

``python benchmarks/activations.py --help`` lists the options.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import gc
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# This script's folder holds `transformers.py`: run as a script, its folder is
# first on `sys.path`, where `import transformers` would find it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402 (after the path fix)
import torch  # noqa: E402 (after the path fix)
import transformers  # noqa: E402 (after the path fix)

from scio_recorder import Recorder  # noqa: E402 (after the path fix)
from scio_recorder.activations import (  # noqa: E402 (after the path fix)
    ActivationDataset,
    SparseLatents,
    _shards,  # the checksum switch
    write,
)
from scio_recorder.sae import (  # noqa: E402 (after the path fix)
    SparseAutoencoder,
    attach,
    splice,
)

if TYPE_CHECKING:
    from collections.abc import Callable

FULL = {"layers": 12, "width": 256, "vocab": 50257, "rows": 8, "positions": 128}
QUICK = {"layers": 2, "width": 64, "vocab": 1000, "rows": 4, "positions": 32}
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILED.append(what)
        print(f"CHECK FAILED: {what}", file=sys.stderr)


def build(size: dict[str, int]) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=size["layers"],
        n_embd=size["width"],
        n_head=max(1, size["width"] // 64),
        vocab_size=size["vocab"],
        n_positions=1024,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def make_batches(size: dict[str, int], count: int, seed: int) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    rows, positions = size["rows"], size["positions"]
    out = []
    for _ in range(count):
        ids = torch.randint(1, size["vocab"], (rows, positions), generator=gen)
        lengths = torch.randint(positions // 2, positions + 1, (rows,), generator=gen)
        mask = (torch.arange(positions)[None, :] < lengths[:, None]).long()
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def stored_blocks(layers: int) -> list[int]:
    """Four blocks evenly spaced, the last included (2, 5, 8, 11 of 12)."""
    return sorted({max(0, (k + 1) * layers // 4 - 1) for k in range(4)})


def hand_memmap(
    model: Any, blocks: list[int], batches: list[dict[str, Any]], folder: Path
) -> dict[int, np.ndarray]:
    """Forward hooks, and the kept tokens copied into memmaps sized beforehand."""
    total = sum(int(b["attention_mask"].sum()) for b in batches)
    width = model.config.n_embd
    maps = {
        i: np.lib.format.open_memmap(
            folder / f"h{i}.npy", mode="w+", dtype=np.float32, shape=(total, width)
        )
        for i in blocks
    }
    index = np.lib.format.open_memmap(
        folder / "index.npy", mode="w+", dtype=np.int64, shape=(total, 2)
    )
    kept: dict[int, torch.Tensor] = {}
    handles = [
        model.transformer.h[i].register_forward_hook(
            lambda _m, _a, o, i=i: kept.__setitem__(i, o)
        )
        for i in blocks
    ]
    at = rows = 0
    try:
        with torch.no_grad():
            for batch in batches:
                model(**batch)
                keep = batch["attention_mask"].bool()
                n = int(keep.sum())
                for i in blocks:
                    maps[i][at : at + n] = kept[i][keep].numpy()
                where = keep.nonzero()
                where[:, 0] += rows
                index[at : at + n] = where.numpy()
                at += n
                rows += keep.shape[0]
    finally:
        for handle in handles:
            handle.remove()
    for array in (*maps.values(), index):
        array.flush()
    return maps


class Job:
    """One scenario: a call that writes (if it does) into a fresh folder."""

    def __init__(self, call: Callable[[Path], Any], root: Path) -> None:
        self.call, self.root = call, root

    def run(self) -> float:
        folder = Path(tempfile.mkdtemp(dir=self.root))
        try:
            start = time.perf_counter()
            self.call(folder)
            return time.perf_counter() - start
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def paired(jobs: dict[str, Job], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(rounds):
        order = list(jobs)
        random.shuffle(order)
        for name in order:
            gc.collect()
            times[name].append(jobs[name].run())
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def _spread(times: dict[str, list[float]], a: str, b: str) -> str:
    """The quartiles of the per-round ratios ``a / b``, as ``q1-q3``."""
    values = [x / y for x, y in zip(times[a], times[b], strict=True)]
    if len(values) < 2:
        return f"{values[0]:.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.3f}-{q3:.3f}"


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def writing(
    size: dict[str, int], batches: list[dict[str, Any]], rounds: int, root: Path
) -> list[str]:
    model = build(size)
    blocks = stored_blocks(size["layers"])
    names = [f"transformer.h.{i}" for i in blocks]
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"][:1]})
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)

    def plain(_folder: Path) -> None:
        with torch.no_grad():
            for batch in batches:
                model(**batch)

    def ours(folder: Path, **options: Any) -> ActivationDataset:
        return write(rnet, batches, folder, layers=names, **options)

    def full_pass(folder: Path) -> None:
        ours(folder, early_exit=False)

    def no_checksum(folder: Path) -> None:
        _shards.CHECKSUM = False
        try:
            ours(folder)
        finally:
            _shards.CHECKSUM = True

    # checks, untimed
    with tempfile.TemporaryDirectory(dir=root) as where:
        ds = ours(Path(where) / "set")
        maps = hand_memmap(model, blocks, batches, Path(where))
        got = ds[:]
        check(len(ds) == tokens, "the set holds every kept token")
        check(
            all(
                torch.equal(got[n], torch.from_numpy(np.asarray(maps[i])))
                for i, n in zip(blocks, names, strict=True)
            ),
            "the set equals the hand-written memmaps bit for bit",
        )
        index = np.load(Path(where) / "index.npy")
        check(torch.equal(ds.index, torch.from_numpy(index)), "the indexes agree")
        # the checksums' own cost: the CRC-32 of every byte the write stored
        stored = [(ds.path / e["file"]).read_bytes() for e in ds.manifest["shards"]]
        crc_seconds = min(
            _timed(lambda: [zlib.crc32(b) for b in stored]) for _ in range(5)
        )
        stored_bytes = sum(len(b) for b in stored)
    jobs = {
        "plain": Job(plain, root),
        "write": Job(ours, root),
        "write_shuffled": Job(lambda f: ours(f, shuffle_buffer=65536), root),
        "hand_memmap": Job(lambda f: hand_memmap(model, blocks, batches, f), root),
        "write_no_checksum": Job(no_checksum, root),
    }
    jobs["write_full_pass"] = Job(full_pass, root)
    for job in jobs.values():  # warm-up
        job.run()
    times = paired(jobs, rounds)
    lines = [
        "| scenario | median s | tokens/s | ratio to plain | write / scenario |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in jobs:
        median = statistics.median(times[name])
        versus = "" if name == "write" else f"{ratio(times, 'write', name):.3f}"
        lines.append(
            f"| {name} | {median:.2f} | {tokens / median:,.0f} | "
            f"{ratio(times, name, 'plain'):.3f} | {versus} |"
        )
    speed = {name: ratio(times, "plain", name) for name in jobs}
    lines.append(
        f"\n{len(batches)} batches, {tokens:,} tokens kept, layers {names}, "
        "early exit on. Throughput of `write` "
        f"over `plain`: {speed['write']:.3f} (target >= 0.9); over `hand_memmap`: "
        f"{ratio(times, 'hand_memmap', 'write'):.3f} (target >= 1.0). The "
        f"shards' CRC-32 cost a write {ratio(times, 'write', 'write_no_checksum'):.3f}"
        " times its time without them (paired; per-round ratios "
        f"{_spread(times, 'write', 'write_no_checksum')}); computing them alone "
        f"takes {crc_seconds * 1e3:.1f} ms for the {stored_bytes / 2**20:.1f} MiB "
        f"stored ({stored_bytes / 2**20 / crc_seconds:,.0f} MiB/s), "
        f"{100 * crc_seconds / statistics.median(times['write']):.2f} % of a "
        "write's median time."
    )
    return lines


def _status(field: str) -> float:
    """Return a field of ``/proc/self/status`` in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pin_malloc() -> bool:
    """Map every block of 128 KiB or more, unmapped when freed (mallopt(3)).

    Then the resident memory follows the memory in use, whatever ran before
    (as ``benchmarks/calibration.py`` does); glibc only.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    threshold = 128 * 1024
    # M_MMAP_THRESHOLD is -3, M_TRIM_THRESHOLD -1 (<malloc.h>)
    return mallopt(-3, threshold) == 1 and mallopt(-1, threshold) == 1


def memory_probe(size_name: str, count: int, folder: str) -> None:
    """Write ``count`` batches in this process; print tokens and peak growth.

    ``count`` 0 runs a plain forward over 4 batches instead (the model's
    own share). The growth is the peak resident memory during the run
    (``VmHWM``, reset once the model, the recorder and the batches are
    built) minus the resident memory before it (Linux); elsewhere, the
    process's peak.
    """
    pin_malloc()
    size = QUICK if size_name == "quick" else FULL
    batches = make_batches(size, count or 4, seed=1)
    model = build(size)
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"][:1]})
    names = [f"transformer.h.{i}" for i in stored_blocks(size["layers"])]
    linux = Path("/proc/self/clear_refs").exists()
    if linux:
        Path("/proc/self/clear_refs").write_text("5")
        before = _status("VmRSS")
    if count:
        tokens = len(write(rnet, batches, folder, layers=names, shard_size=8192))
    else:
        with torch.no_grad():
            for batch in batches:
                model(**batch)
        tokens = 0
    if linux:
        growth = _status("VmHWM") - before
    else:
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{tokens} {growth:.1f}")


def memory(size_name: str, counts: list[int], root: Path) -> list[str]:
    lines = ["| run | tokens | peak growth MiB |", "|---|---:|---:|"]
    for count in [0, *counts]:
        with tempfile.TemporaryDirectory(dir=root) as where:
            out = subprocess.run(  # noqa: S603 (this interpreter, this file)
                [
                    sys.executable,
                    __file__,
                    "--memory-probe",
                    f"{size_name},{count},{where}/set",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
        tokens, peak = int(out[-2]), float(out[-1])
        what = f"write, {count} batches" if count else "plain forward, 4 batches"
        lines.append(f"| {what} | {tokens:,} | {peak:.0f} |")
    return lines


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("shard-*.safetensors"))


def latents(
    size: dict[str, int], batches: list[dict[str, Any]], rounds: int, root: Path
) -> list[str]:
    """An SAE's latents stored sparsely, against the layer and the latents dense."""
    model = build(size)
    block = f"transformer.h.{size['layers'] // 2}"
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"][:1]})
    torch.manual_seed(1)
    width = size["width"]
    sae = SparseAutoencoder(width, 16 * width, activation="topk", k=32)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    rows = batches[0]["input_ids"].shape[0]
    sizes: dict[str, int] = {}

    def layer(folder: Path) -> None:
        write(rnet, batches, folder / "set", layers={"x": block})
        sizes["layer"] = shard_bytes(folder / "set")

    def sparse(folder: Path) -> None:
        write(rnet, batches, folder / "set", layers={"f": SparseLatents(sae, block)})
        sizes["sparse_latents"] = shard_bytes(folder / "set")

    def dense(folder: Path) -> None:
        with attach(rnet, {block: splice(sae, keep_error=True)}):
            inside = Recorder(
                model, input_data={"input_ids": batches[0]["input_ids"][:1]}
            )
            write(inside, batches, folder / "set", layers={"f": f"{block}.sae.latents"})
        sizes["dense_latents"] = shard_bytes(folder / "set")

    # check, untimed: the sparse latents, read dense, are encode of the rows
    with tempfile.TemporaryDirectory(dir=root) as where:
        both = write(
            rnet,
            batches,
            Path(where) / "set",
            layers={"x": block, "f": SparseLatents(sae, block)},
        )
        got = both[:]
        batch_of = both.index[:, 0] // rows
        with torch.no_grad():
            equal = all(
                torch.equal(
                    got["f"][batch_of == b], sae.encode(got["x"][batch_of == b])
                )
                for b in range(len(batches))
            )
        check(equal, "the sparse latents are encode of the layer's rows, bit for bit")
    jobs = {
        "layer": Job(layer, root),
        "sparse_latents": Job(sparse, root),
        "dense_latents": Job(dense, root),
    }
    for job in jobs.values():  # warm-up
        job.run()
    times = paired(jobs, rounds)
    lines = [
        "| stored | bytes/token on disk | MiB | tokens/s | time / layer |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in jobs:
        median = statistics.median(times[name])
        lines.append(
            f"| {name} | {sizes[name] / tokens:,.0f} | {sizes[name] / 2**20:,.2f} | "
            f"{tokens / median:,.0f} | {ratio(times, name, 'layer'):.3f} |"
        )
    lines.append(
        f"\n{len(batches)} batches, {tokens:,} tokens kept, {block} (width {width}), "
        f"a top-k SAE with {16 * width:,} latents and k = 32 (float32 values, "
        f"{'int16' if 16 * width <= 32768 else 'int32'} indices); the bytes include "
        "each token's index (16 bytes) and the safetensors headers."
    )
    return lines


def reading(size: dict[str, int], count: int, rounds: int, root: Path) -> list[str]:
    """Tokens per second of the three ways to read a set, over an epoch each.

    The set holds four layers of the model's width over ``count`` batches,
    written by a 4-layer model of that width with a small vocabulary (the
    reading does not depend on the model, and this one writes fast).
    """
    small = dict(size, layers=4, vocab=1000)
    batches = make_batches(small, count, seed=3)
    model = build(small)
    names = [f"transformer.h.{i}" for i in range(4)]
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"][:1]})
    lines = ["| reader | tokens/s |", "|---|---:|"]
    with tempfile.TemporaryDirectory(dir=root) as where:
        ds = write(rnet, batches, Path(where) / "set", layers=names, shard_size=8192)
        gen = torch.Generator().manual_seed(0)
        readers: dict[str, Callable[[], Any]] = {
            f"DataLoader(ds, batch_size=4096, shuffle=True, num_workers={w})": (
                lambda w=w: torch.utils.data.DataLoader(
                    ds, batch_size=4096, shuffle=True, num_workers=w, generator=gen
                )
            )
            for w in (0, 2)
        }
        readers |= {
            f"ds.loader(4096, shuffle=True, num_workers={w})": (
                lambda w=w: ds.loader(4096, shuffle=True, num_workers=w, generator=gen)
            )
            for w in (0, 2)
        }

        def first_read(verify: bool) -> Callable[[], int]:
            def run() -> int:
                opened = ActivationDataset(Path(where) / "set", verify=verify)
                return sum(b[names[0]].shape[0] for b in opened.loader(4096))

            return run

        checked: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for verify in random.sample([True, False], 2):
                start = time.perf_counter()
                check(first_read(verify)() == len(ds), "every token is read")
                checked[verify].append(time.perf_counter() - start)
        cost = statistics.median(
            a / b for a, b in zip(checked[True], checked[False], strict=True)
        )
        lines.append(
            f"| open + one epoch of `ds.loader(4096)`, `verify=True` "
            f"(each shard's CRC-32 on its first read) | "
            f"{len(ds) / statistics.median(checked[True]):,.0f} |"
        )
        lines.append(
            f"| the same, `verify=False` | "
            f"{len(ds) / statistics.median(checked[False]):,.0f} |"
        )
        for name, make in readers.items():
            samples = []
            for _ in range(rounds):
                start = time.perf_counter()
                count_read = sum(batch[names[0]].shape[0] for batch in make())
                samples.append(time.perf_counter() - start)
                check(count_read == len(ds), f"{name} reads every token")
            lines.append(f"| {name} | {len(ds) / statistics.median(samples):,.0f} |")
        lines.append(
            f"\n{len(ds):,} tokens of {len(names)} layers of width "
            f"{ds.dims[names[0]]} (float32, {len(ds) * len(names) * ds.dims[names[0]] * 4 / 2**20:,.0f} MiB), "
            f"{len(ds.manifest['shards'])} shards; an epoch includes starting the "
            f"workers. A first read checking the CRC-32 took {cost:.3f} times one "
            "without (paired, median over rounds)."
        )
    return lines


def saelens(size: dict[str, int], count: int, rounds: int, root: Path) -> list[str]:
    """Our write against SAELens's `CacheActivationsRunner`, four streams each.

    SAELens caches one hook point per run (one forward per layer, each
    stopping after its layer): the four streams are four runs, on a
    TransformerLens ``HookedTransformer`` of GPT-2's shape (its own
    implementation, random weights), over the same token ids, without
    padding (SAELens packs full contexts), unshuffled. Each side is also
    timed as a plain forward of its own model.
    """
    import datasets  # type: ignore[import-not-found]  # noqa: PLC0415 (optional)
    import sae_lens  # type: ignore[import-not-found]  # noqa: PLC0415 (optional)
    from sae_lens import cache_activations_runner as runner_module  # type: ignore[import-not-found]  # noqa: PLC0415
    from sae_lens.config import CacheActivationsRunnerConfig  # type: ignore[import-not-found]  # noqa: PLC0415
    from transformer_lens import HookedTransformer, HookedTransformerConfig  # type: ignore[import-not-found]  # noqa: PLC0415

    width, positions = size["width"], size["positions"]
    tl_model = HookedTransformer(
        HookedTransformerConfig(
            n_layers=size["layers"],
            d_model=width,
            n_heads=max(1, width // 64),
            d_head=min(64, width),
            d_mlp=4 * width,
            d_vocab=size["vocab"],
            n_ctx=1024,
            act_fn="gelu_new",
            normalization_type="LN",
            device="cpu",
        )
    ).eval()
    runner_module.load_model = lambda **_: tl_model  # no download
    batches = make_batches(size, count, seed=2)
    for batch in batches:
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    ids = torch.cat([b["input_ids"] for b in batches])
    tokens = ids.numel()
    table = datasets.Dataset.from_dict({"input_ids": ids.tolist()})
    blocks = stored_blocks(size["layers"])
    model = build(size)
    rnet = Recorder(model, input_data={"input_ids": ids[:1]})
    names = [f"transformer.h.{i}" for i in blocks]

    def cache(folder: Path) -> None:
        for i in blocks:
            config = CacheActivationsRunnerConfig(
                dataset_path="in-memory",
                model_name="random-gpt2-shape",
                hook_name=f"blocks.{i}.hook_resid_post",
                d_in=width,
                context_size=positions,
                training_tokens=tokens,
                model_batch_size=size["rows"],
                new_cached_activations_path=str(folder / f"h{i}"),
                prepend_bos=False,
                shuffle=False,
                streaming=False,
                buffer_size_gb=tokens * width * 4 / 1e9,
            )
            runner_module.CacheActivationsRunner(config, override_dataset=table).run()

    def tl_plain(_folder: Path) -> None:
        with torch.no_grad():
            for batch in batches:
                tl_model(batch["input_ids"])

    def hf_plain(_folder: Path) -> None:
        with torch.no_grad():
            for batch in batches:
                model(**batch)

    jobs = {
        "hf_plain": Job(hf_plain, root),
        "write": Job(lambda f: write(rnet, batches, f, layers=names), root),
        "tl_plain": Job(tl_plain, root),
        "saelens_4_runs": Job(cache, root),
    }
    for job in jobs.values():
        job.run()
    times = paired(jobs, rounds)
    lines = [
        "| scenario | median s | tokens/s | ratio to its plain forward |",
        "|---|---:|---:|---:|",
    ]
    for name, base in (
        ("hf_plain", "hf_plain"),
        ("write", "hf_plain"),
        ("tl_plain", "tl_plain"),
        ("saelens_4_runs", "tl_plain"),
    ):
        median = statistics.median(times[name])
        lines.append(
            f"| {name} | {median:.2f} | {tokens / median:,.0f} | "
            f"{ratio(times, name, base):.3f} |"
        )
    lines.append(
        f"\nsae_lens {sae_lens.__version__}, {tokens:,} tokens (no padding), four "
        f"streams; `write` over SAELens's four runs, in tokens/s: "
        f"{ratio(times, 'saelens_4_runs', 'write'):.3f}."
    )
    return lines


def saelens_available() -> bool:
    try:
        import datasets  # type: ignore[import-not-found]  # noqa: PLC0415, F401 (optional)
        import sae_lens  # type: ignore[import-not-found]  # noqa: PLC0415, F401 (optional)
    except ImportError:
        return False
    return True


def main() -> int:
    """Print the Markdown report; return 1 if a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4, help="batches per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory", default="4,16,64", help="batch counts")
    parser.add_argument(
        "--read-batches", type=int, default=64, help="batches of the set read"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument(
        "--parts",
        default="writing,saelens,latents,memory,reading",
        help="the sections to run, comma-separated (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # transformers' notes on the config
    torch.set_num_threads(1)
    if args.memory_probe:
        name, count, folder = args.memory_probe.split(",")
        memory_probe(name, int(count), folder)
        return 0
    size = QUICK if args.quick else FULL
    if args.quick:
        args.batches, args.rounds, args.memory, args.read_batches = 4, 2, "4", 4
    random.seed(args.seed)
    batches = make_batches(size, args.batches, args.seed)
    print(
        f"# benchmarks/activations.py, {dt.datetime.now(tz=dt.UTC).date()}, "
        f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, one thread"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
    )
    print(
        f"\n## GPT-2, {size['layers']} layers, width {size['width']}, batches of "
        f"{size['rows']} x {size['positions']}\n"
    )
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as root:
        if "writing" in parts:
            print(f"Writing, {args.rounds} rounds:\n")
            print("\n".join(writing(size, batches, args.rounds, Path(root))))
        if "saelens" not in parts:
            pass
        elif saelens_available() and not args.quick:
            print(f"\nAgainst SAELens, {args.rounds} rounds:\n")
            print("\n".join(saelens(size, args.batches, args.rounds, Path(root))))
        else:
            print(
                "\nSAELens: `sae_lens` (and `datasets`) do not import here: its "
                "`CacheActivationsRunner` was not timed."
            )
        if "latents" in parts:
            print(f"\nAn SAE's latents, {args.rounds} rounds:\n")
            print("\n".join(latents(size, batches, args.rounds, Path(root))))
        if "memory" in parts:
            print(
                "\nPeak memory of a write (a process each, shards of 8,192 tokens):\n"
            )
            counts = [int(n) for n in args.memory.split(",")]
            size_name = "quick" if args.quick else "full"
            print("\n".join(memory(size_name, counts, Path(root))))
        if "reading" in parts:
            print(f"\nReading, {args.rounds} epochs each:\n")
            print("\n".join(reading(size, args.read_batches, args.rounds, Path(root))))
    if FAILED:
        print("\n" + "\n".join(f"CHECK FAILED: {what}" for what in FAILED))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
