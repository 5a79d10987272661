"""An SAE's latents in activation sets, stored sparsely (`activations.SparseLatents`).

The oracle is ``sae.encode`` of the layer's kept rows, taken by a
hand-written forward hook on the same model and batches: the writer
encodes the same ``[tokens, d]`` float32 rows of each batch, so the dense
latents read back equal it bit for bit (bfloat16 values: it cast).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.activations import ActivationDataset, SparseLatents, write
from tests.test_sae import VOCAB, D, gpt2, random_sae

D_SAE = 64
BLOCK = "transformer.h.1"


@pytest.fixture(scope="module")
def lm():
    model = gpt2()
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        ids = torch.randint(1, VOCAB, (3, 8), generator=g)
        mask = torch.ones(3, 8, dtype=torch.long)
        mask[0, :3] = 0  # left padding
        mask[2, 6:] = 0  # right padding
        batches.append({"input_ids": ids, "attention_mask": mask})
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"]})
    return model, rnet, batches


def kept_rows(model, batches):
    """The block's kept rows of each batch ([tokens, d]), by a hand hook."""
    seen = []
    handle = model.transformer.h[1].register_forward_hook(
        lambda _m, _a, o: seen.append(o)
    )
    try:
        with torch.no_grad():
            for batch in batches:  # each row numbered from 0, as write does
                mask = batch["attention_mask"]
                positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
                model(**batch, position_ids=positions)
    finally:
        handle.remove()
    return [
        y[batch["attention_mask"].bool()]
        for y, batch in zip(seen, batches, strict=True)
    ]


def test_latents_read_back_dense_are_encode_s(lm, tmp_path):
    """Top-k latents, shuffled, padding left out: dense = encode of the kept rows."""
    model, rnet, batches = lm
    sae = random_sae("topk", k=6)
    ds = write(
        rnet,
        batches,
        tmp_path / "set",
        layers={"block": BLOCK, "latents": SparseLatents(sae, BLOCK)},
        shuffle_buffer=16,
        seed=3,
    )
    with torch.no_grad():
        expected = torch.cat([sae.encode(rows) for rows in kept_rows(model, batches)])
        blocks = torch.cat(kept_rows(model, batches))
    # The unshuffled order is rows then positions: sort the index to get it.
    rows, columns = ds.index.unbind(1)
    order = torch.argsort(rows * 100 + columns)
    values = ds[order]
    assert torch.equal(values["block"], blocks)
    assert torch.equal(values["latents"], expected)
    assert ds.dims == {"block": D, "latents": D_SAE}
    assert ds.dtypes["latents"] == torch.float32
    assert ds.sparse == {
        "latents": {
            "size": D_SAE,
            "k": 6,
            "values": torch.float32,
            "indices": torch.int16,
            "nonzeros": False,
        }
    }
    entry = json.loads((tmp_path / "set" / "manifest.json").read_text())["layers"]
    assert entry["latents"]["dtype"] == "uint8"
    assert entry["latents"]["shape"] == [6 * (4 + 2)]  # float32 values, int16 indices
    assert (
        "sparse latents (top 6 of 64) of SparseAutoencoder" in entry["latents"]["call"]
    )
    one = ds[int(order[0])]
    assert torch.equal(one["latents"], expected[0])


def test_latents_read_back_sparse_are_the_pairs(lm, tmp_path):
    """latents='sparse': the k largest, largest first, indices int64; loaders too."""
    _, rnet, batches = lm
    sae = random_sae("topk", k=6)
    write(rnet, batches, tmp_path / "set", layers={"f": SparseLatents(sae, BLOCK)})
    dense = ActivationDataset(tmp_path / "set")
    pairs = ActivationDataset(tmp_path / "set", latents="sparse")
    got = pairs[:]
    assert sorted(got) == ["f.indices", "f.values"]
    indices, values = got["f.indices"], got["f.values"]
    assert indices.dtype == torch.int64
    assert values.shape == (len(pairs), 6)
    rebuilt = torch.zeros(len(pairs), D_SAE).scatter_(1, indices, values)
    assert torch.equal(rebuilt, dense[:]["f"])
    assert bool((values[:, :-1].abs() >= values[:, 1:].abs()).all())
    batch = next(iter(pairs.loader(5, index=True)))
    assert sorted(batch) == ["f.indices", "f.values", "index"]
    items = torch.utils.data.DataLoader(pairs, batch_size=4)
    assert torch.equal(next(iter(items))["f.values"], values[:4])


def test_k_below_the_nonzeros_keeps_the_largest_or_refuses(lm, tmp_path):
    """A ReLU SAE: k keeps the k largest; nonzeros=True refuses more, naming them."""
    model, rnet, batches = lm
    sae = random_sae("relu")
    ds = write(
        rnet,
        batches[:1],
        tmp_path / "top",
        layers={"f": SparseLatents(sae, BLOCK, k=5)},
    )
    with torch.no_grad():
        full = sae.encode(kept_rows(model, batches[:1])[0])
    most = int((full != 0).sum(1).max())
    assert most > 5
    top = full.abs().topk(5, dim=1).indices
    expected = torch.zeros_like(full).scatter_(1, top, full.gather(1, top))
    assert torch.equal(ds[:]["f"], expected)
    latents = {"f": SparseLatents(sae, BLOCK, k=most - 1, nonzeros=True)}
    msg = (
        f"Layer 'f': a token has {most} nonzero latents, more than `k={most - 1}` "
        f"stores with `nonzeros=True`: write the set again with `k={most}` or more"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        write(rnet, batches[:1], tmp_path / "refused", layers=latents)
    exact = write(
        rnet,
        batches[:1],
        tmp_path / "exact",
        layers={"f": SparseLatents(sae, BLOCK, k=most, nonzeros=True)},
    )
    assert torch.equal(exact[:]["f"], full)


def test_statistics_describe_the_latents_stored_not_every_latent(lm, tmp_path):
    """`stats=True` on top-k pairs of a ReLU SAE: the statistics of the latents
    read back (the k kept, zeros elsewhere), not of the SAE's whole output."""
    # They were of every latent: on a ReLU SAE with many nonzeros, the mean
    # and the norm of latents the set does not hold.
    model, rnet, batches = lm
    sae = random_sae("relu")
    ds = write(
        rnet,
        batches[:2],
        tmp_path / "set",
        layers={"f": SparseLatents(sae, BLOCK, k=3)},
        stats=True,
        shuffle_buffer=8,
    )
    with torch.no_grad():
        full = torch.cat([sae.encode(rows) for rows in kept_rows(model, batches[:2])])
    assert int((full != 0).sum(1).max()) > 3  # some latents are not stored
    x = ds[:]["f"].double()  # float32 values stored as computed: no cast
    mean = x.sum(0) / x.shape[0]
    var = ((x - mean) ** 2).sum(0) / x.shape[0]
    norm = torch.linalg.vector_norm(x, dim=1).sum() / x.shape[0]
    got = ds.stats["f"]
    # Chan's merge of per-batch float64 summaries against one two-pass sum
    # over the same float32 values: a few float64 roundings of O(1) sums.
    torch.testing.assert_close(got["mean"], mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["var"], var, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["norm"], norm, rtol=1e-12, atol=1e-12)
    assert int(got["count"]) == x.shape[0]
    assert not torch.allclose(got["mean"], full.double().mean(0))


def test_values_in_bfloat16_and_indices_in_int32_for_large_saes(lm, tmp_path):
    """dtype=bfloat16 casts the values; past 32,768 latents indices are int32."""
    model, rnet, batches = lm
    sae = random_sae("topk", d_sae=40_000, k=3)
    ds = write(
        rnet,
        batches[:1],
        tmp_path / "set",
        layers={"f": SparseLatents(sae, BLOCK)},
        dtype=torch.bfloat16,
        stats=True,
    )
    assert ds.sparse["f"]["indices"] == torch.int32
    assert ds.dtypes["f"] == torch.bfloat16
    with torch.no_grad():
        full = sae.encode(kept_rows(model, batches[:1])[0])
    assert torch.equal(ds[:]["f"], full.to(torch.bfloat16))
    assert bool(
        (ActivationDataset(ds.path, latents="sparse")[:]["f.indices"] > 32767).any()
    )
    # Statistics are of the dense latents, before the cast (float64).
    assert torch.allclose(
        ds.stats["f"]["mean"], full.double().mean(0), rtol=1e-12, atol=0
    )


def test_a_set_with_latents_appends_and_is_checked(lm, tmp_path):
    """An append with the same SAE adds tokens; with another dtype it is refused."""
    _, rnet, batches = lm
    sae = random_sae("topk", k=6)
    layers = {"f": SparseLatents(sae, BLOCK)}
    first = write(rnet, batches[:1], tmp_path / "set", layers=layers)
    both = write(rnet, batches[1:], tmp_path / "set", layers=layers, append=True)
    assert len(both) == len(first) + len(
        write(rnet, batches[1:], tmp_path / "b", layers=layers)
    )
    with pytest.raises(
        ValueError, match=r"is stored as .*append with the set's `dtype`"
    ):
        write(
            rnet,
            batches[1:],
            tmp_path / "set",
            layers=layers,
            append=True,
            dtype=torch.float16,
        )
    with pytest.raises(ValueError, match=r"are stored sparsely \(`SparseLatents`\)"):
        both.to_arrow(tmp_path / "arrow")


def test_a_damaged_sparse_entry_and_bad_arguments_are_named(lm, tmp_path):
    """The manifest's sparse entry is checked; SparseLatents checks its arguments."""
    _, rnet, batches = lm
    sae = random_sae("topk", k=6)
    write(rnet, batches[:1], tmp_path / "set", layers={"f": SparseLatents(sae, BLOCK)})
    path = tmp_path / "set" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["layers"]["f"]["sparse"]["k"] = 7
    path.write_text(json.dumps(manifest))
    with pytest.raises(
        ValueError, match=r"layer 'f': its 'sparse' entry .* does not match"
    ):
        ActivationDataset(tmp_path / "set")
    with pytest.raises(ValueError, match=r"^`SparseLatents` needs `k`"):
        SparseLatents(random_sae("relu"), BLOCK)
    with pytest.raises(
        ValueError, match=r"^`k` must be from 1 to the SAE's 64 latents"
    ):
        SparseLatents(sae, BLOCK, k=65)
    with pytest.raises(TypeError, match=r"^`SparseLatents` takes an SAE"):
        SparseLatents(nn.Linear(2, 2), BLOCK)
    with pytest.raises(ValueError, match=r"^`latents` must be 'dense' or 'sparse'"):
        ActivationDataset(tmp_path / "set", latents="coo")
