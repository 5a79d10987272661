"""`scio_recorder._run.batches`: inputs out of batches, (args, kwargs), device moves.

And the position ids of padded batches: a row's activations never depend on
its padding nor its batch-mates, through every path of the library that
feeds batches to a net (``activations.write``, ``collect``, a fitted
detector's scores, ``patch_sweep``, ``logit_lens``), for absolute (GPT-2,
GPT-Neo, BERT) and rotary (Llama) positions, left and right padding. The
oracle is each row run alone, unpadded, through the plain model (its own
position numbering), read by a hand-written hook.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import warnings

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from scio_recorder import CallInputs, Recorder
from scio_recorder._run.batches import (
    Positions,
    as_arguments,
    batch_getter,
    first_batch_size,
    move_to,
    position_scheme,
)
from tests.lms import LENGTHS, VOCAB, bert, gpt2, gpt_neo, llama, padded

Pair = collections.namedtuple("Pair", ["a", "b"])  # noqa: PYI024 (a test batch)


@dataclasses.dataclass
class Output:
    logits: object
    extra: object


def leaves(draw_rows):
    return st.one_of(
        draw_rows.map(lambda n: torch.arange(n * 2.0).reshape(n, 2)),
        st.integers(-3, 3),
        st.none(),
        st.text(max_size=3),
    )


ROWS = st.integers(1, 4)


def nests(rows=ROWS):
    return st.recursive(
        leaves(rows),
        lambda inner: st.one_of(
            st.tuples(inner, inner),
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from("xyz"), inner, max_size=3),
            st.builds(Pair, inner, inner),
            st.builds(Output, inner, inner),
        ),
        max_leaves=8,
    )


def same_structure(a, b, device):
    """`b` is `a` with every tensor moved to `device` and nothing else changed."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and b.device == device
            and b.shape == a.shape
            and b.dtype == a.dtype
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(
            same_structure(a[k], b[k], device) for k in a
        )
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(
            same_structure(x, y, device) for x, y in zip(a, b, strict=True)
        )
    if dataclasses.is_dataclass(a):
        return all(
            same_structure(getattr(a, f.name), getattr(b, f.name), device)
            for f in dataclasses.fields(a)
        )
    return a == b


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(nests())
def test_move_to_moves_every_tensor_and_keeps_every_type(value):
    meta = torch.device("meta")
    assert same_structure(value, move_to(value, meta), meta)


@settings(max_examples=80, deadline=None)
@given(nests(), st.booleans())
def test_as_arguments_spreads_only_what_a_callable_returned(value, spread):
    """Spread: tuple -> args, mapping -> kwargs; otherwise one argument."""
    args, kwargs = as_arguments(value, spread=spread)
    if spread and isinstance(value, tuple):
        assert args is value
        assert kwargs == {}
    elif spread and isinstance(value, dict):
        assert args == ()
        assert kwargs == value
    else:
        assert args == (value,) or args[0] is value
        assert kwargs == {}


@settings(max_examples=50, deadline=None)
@given(nests(), st.dictionaries(st.sampled_from("xyz"), nests(), max_size=2))
def test_call_inputs_are_args_and_kwargs_with_or_without_spread(args, kwargs):
    call = CallInputs((args,), kwargs)
    for spread in (True, False):
        got = as_arguments(call, spread=spread)
        assert got[0] == (args,) or got[0][0] is args
        assert got[1].keys() == kwargs.keys()


@settings(max_examples=80, deadline=None)
@given(st.lists(nests(), max_size=3), st.integers(1, 4))
def test_first_batch_size_is_dim_0_of_the_first_batched_tensor(values, rows):
    values = [*values, torch.zeros(rows, 1)]
    expected = next(
        v.shape[0] for v in values if isinstance(v, torch.Tensor) and v.dim() >= 1
    )
    assert first_batch_size(tuple(values), {}) == expected
    assert first_batch_size((), dict(enumerate(map(str, values)))) is None
    assert first_batch_size((), {"k": torch.zeros(rows, 2)}) == rows


def test_getters_name_the_option_and_what_to_do():
    take = batch_getter(2, "target")
    with pytest.raises(ValueError, match=r"^`target=2`: cannot take item 2 .* Pass"):
        take((1, 2))
    with pytest.raises(TypeError, match=r"^`input=0` takes item 0 .* `input=None`"):
        batch_getter(0, "input")(torch.zeros(2))
    with pytest.raises(KeyError, match=r"`input='x'`: the batch has no such key"):
        batch_getter("x", "input")({"y": 1})
    with pytest.raises(TypeError, match=r"^`input` must be an int, a str, a callable"):
        batch_getter(True, "input")
    assert batch_getter(None, "input")(5) == 5


def test_explain_and_collect_share_the_convention():
    """explain's inputs follow as_arguments with spread (one definition)."""
    from scio_recorder.explain._base import arguments  # noqa: PLC0415 (the user checked)

    mapping = {"ids": torch.zeros(2, 3)}
    assert arguments(mapping) == as_arguments(mapping, spread=True)
    call = CallInputs((torch.zeros(1),), {"m": 1})
    assert arguments(call) == as_arguments(call, spread=False)


# -- position ids from the padding mask ------------------------------------------

EPS32 = torch.finfo(torch.float32).eps


GPT2 = gpt2()  # for the property test: built once

MODELS = {  # builder, two blocks, two layers that output tensors, a causal LM?
    "gpt2": (
        gpt2,
        ["transformer.h.0", "transformer.h.1"],
        ["transformer.h.0.mlp", "transformer.h.1.mlp"],
        True,
    ),
    "gpt_neo": (
        gpt_neo,
        ["transformer.h.0", "transformer.h.1"],
        ["transformer.h.0.mlp", "transformer.h.1.mlp"],
        True,
    ),
    "llama": (
        llama,
        ["model.layers.0", "model.layers.1"],
        ["model.layers.0.mlp", "model.layers.1.mlp"],
        True,
    ),
    "bert": (
        bert,
        ["bert.encoder.layer.0", "bert.encoder.layer.1"],
        ["bert.encoder.layer.0.output", "bert.encoder.layer.1.output"],
        False,
    ),
}


def alone(model, batch, names) -> list[dict[str, torch.Tensor]]:
    """Each row run alone, unpadded, by the plain model: hooked outputs, logits."""
    out = []
    for row in range(batch["input_ids"].shape[0]):
        kept = batch["attention_mask"][row].bool()
        seen: dict[str, torch.Tensor] = {}
        handles = [
            model.get_submodule(name).register_forward_hook(
                lambda _m, _a, o, name=name, seen=seen: seen.__setitem__(
                    name, o[0] if isinstance(o, tuple) else o
                )
            )
            for name in names
        ]
        try:
            with torch.no_grad():
                result = model(input_ids=batch["input_ids"][row, kept][None])
        finally:
            for handle in handles:
                handle.remove()
        seen["logits"] = getattr(result, "logits", result[0])
        out.append(seen)
    return out


def assert_rows_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float32 rounding of batched against single-row kernels.

    The two sides run the same operations on the same values with kernels
    blocked differently (a batch of 3 rows against 1), so each value differs
    by roundings: a dot product of width <= 64 carries about 64 of them,
    through 2 blocks of a few products each (K = 1024 roundings in all),
    each at most ``eps32`` relative to the largest magnitude involved.
    """
    tol = 1024 * EPS32 * float(want.abs().max())
    torch.testing.assert_close(got, want, atol=tol, rtol=0)


def _matrix(fast: set[tuple[str, str]], causal: bool = False) -> list:
    return [
        pytest.param(
            name,
            side,
            marks=() if (name, side) in fast else pytest.mark.slow,
            id=f"{name}-{side}",
        )
        for name, (_, _, _, lm) in MODELS.items()
        if lm or not causal
        for side in ("left", "right")
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=9), min_size=1, max_size=4)
)
def test_position_ids_number_each_rows_kept_tokens_from_0(rows):
    """Each row's kept tokens get 0, 1, ... in order, padding 0 (holes too)."""
    width = max(map(len, rows))
    mask = torch.tensor(
        [[int(k) for k in row] + [0] * (width - len(row)) for row in rows]
    )
    _, kwargs = Positions.of(GPT2).add((), {"input_ids": mask, "attention_mask": mask})
    for row in range(mask.shape[0]):
        count = 0
        for column in range(width):
            want = count if mask[row, column] else 0
            assert int(kwargs["position_ids"][row, column]) == want
            count += int(mask[row, column])


def test_position_ids_given_or_switched_off_are_left_alone():
    """Position ids given (by name or position), or mode None: the batch as it is."""
    model = gpt2()
    batch = padded("left")
    given_ids = torch.zeros_like(batch["input_ids"])
    _, kwargs = Positions(model).add((), {**batch, "position_ids": given_ids})
    assert kwargs["position_ids"] is given_ids
    _, kwargs = Positions(model, None).add((), batch)
    assert "position_ids" not in kwargs
    assert Positions.of(model) is Positions.of(model)
    with pytest.raises(ValueError, match=r'^`position_ids` must be "from_mask" '):
        Positions(model, "yes")


def test_models_that_number_padded_rows_themselves_are_left_alone():
    """RoBERTa's family (padding_idx), OPT (its own embedding), T5: untouched."""
    transformers = pytest.importorskip("transformers")
    roberta = transformers.RobertaModel(
        transformers.RobertaConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=40,
        )
    )
    opt = transformers.OPTModel(
        transformers.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            ffn_dim=32,
            num_attention_heads=2,
            max_position_embeddings=32,
            word_embed_proj_dim=16,
        )
    )
    for model in (roberta, opt):
        assert position_scheme(model) == "own"
        _, kwargs = Positions(model).add((), padded("left"))
        assert "position_ids" not in kwargs
    assert position_scheme(gpt2()) == "absolute"
    assert position_scheme(bert()) == "absolute"
    assert position_scheme(llama()) == "relative"
    assert position_scheme(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize(("name", "side"), _matrix({("gpt2", "left")}))
def test_written_tokens_equal_each_row_alone(tmp_path, name, side):
    """activations.write stores each row's tokens as the row alone gives them."""
    from scio_recorder.activations import write  # noqa: PLC0415 (a heavier part)

    build, names, _, _ = MODELS[name]
    model = build()
    batch = padded(side)
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})
    ds = write(rnet, [batch], tmp_path / "set", layers=names)
    got = ds[torch.arange(len(ds))]
    rows = alone(model, batch, names)
    for layer in names:
        want = torch.cat([rows[r][layer][0] for r in range(len(LENGTHS))])
        assert_rows_close(got[layer], want)


def test_written_tokens_follow_the_padding_with_position_ids_none(tmp_path):
    """``position_ids=None``: the batch as it is, GPT-2's left-padded rows differ."""
    from scio_recorder.activations import write  # noqa: PLC0415 (a heavier part)

    model = gpt2()
    batch = padded("left")
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})
    layer = "transformer.h.1"
    ds = write(rnet, [batch], tmp_path / "set", layers=[layer], position_ids=None)
    got = ds[torch.arange(len(ds))][layer]
    want = torch.cat([row[layer][0] for row in alone(model, batch, [layer])])
    # the padded rows moved, far beyond rounding (100x assert_rows_close's)
    assert float((got - want).abs().max()) > 100 * 1024 * EPS32 * float(
        want.abs().max()
    )
    seen = []
    handle = model.get_submodule(layer).register_forward_hook(
        lambda _m, _a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        model(**batch)
    handle.remove()
    assert torch.equal(got, seen[0][batch["attention_mask"].bool()])


@pytest.mark.parametrize(("name", "side"), _matrix({("gpt_neo", "left")}))
def test_collected_rows_equal_each_row_alone(name, side):
    """collect's records of a padded batch: each row's kept tokens as alone."""
    from scio_recorder import collect  # noqa: PLC0415 (a heavier part)

    build, _, names, _ = MODELS[name]
    model = build()
    batch = padded(side)
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})
    result = collect(rnet, [batch], dict.fromkeys(names, "concat"), input=lambda b: b)
    rows = alone(model, batch, names)
    for layer in names:
        label = result.labels_of[layer][0]
        for row, kept in enumerate(batch["attention_mask"].bool()):
            assert_rows_close(result[label][row, kept], rows[row][layer][0])


@pytest.mark.parametrize(("name", "side"), _matrix({("bert", "left")}))
def test_fitted_detector_scores_each_row_as_alone(name, side):
    """A detector fitted on padded batches scores each padded row as the row alone."""
    from scio_recorder.ood import MahalanobisEnsemble  # noqa: PLC0415

    build, _, names, _ = MODELS[name]
    model = build()
    rnet = Recorder(model, input_data={"input_ids": padded(side)["input_ids"][:1]})
    detector = MahalanobisEnsemble(
        rnet,
        names,
        token="mean",  # noqa: S106 (not a password)
        mask="attention_mask",
        shrinkage=0.5,
    )
    fit = [(padded(side, seed), torch.tensor([0, 1, 0])) for seed in range(1, 4)]
    detector.fit(fit, input=lambda b: b[0], target=1)
    batch = padded(side)
    scores = detector(**batch)
    for row, kept in enumerate(batch["attention_mask"].bool()):
        ids = batch["input_ids"][row, kept][None]
        single = detector(input_ids=ids, attention_mask=torch.ones_like(ids))
        # The pooled features agree to float32 rounding (see assert_rows_close);
        # the score, a quadratic form in them with the covariance shrunk by
        # 0.5 toward its trace (condition number under 10^2 here), to 10^2
        # times that, relative to the score.
        tol = 100 * 1024 * EPS32 * float(single.abs().max())
        torch.testing.assert_close(scores[row : row + 1], single, atol=tol, rtol=0)


@pytest.mark.parametrize(("name", "side"), _matrix({("gpt_neo", "left")}, causal=True))
def test_logit_lens_of_a_padded_batch_equals_each_row_alone(name, side):
    """logit_lens: row r's lens at its kept positions equals the row alone's."""
    from scio_recorder.explain import logit_lens  # noqa: PLC0415

    build, names, _, _ = MODELS[name]
    model = build()
    batch = padded(side)
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})
    lens = logit_lens(rnet, batch, names)
    for row, kept in enumerate(batch["attention_mask"].bool()):
        ids = batch["input_ids"][row, kept][None]
        assert_rows_close(lens[:, row, kept], logit_lens(rnet, ids, names)[:, 0])


@pytest.mark.parametrize(("name", "side"), _matrix({("gpt2", "left")}, causal=True))
def test_patch_sweep_of_a_padded_batch_equals_each_row_alone(name, side):
    """patch_sweep with a metric of row r: its real columns are row r's sweep alone."""
    from scio_recorder.explain import patch_sweep  # noqa: PLC0415

    build, names, _, _ = MODELS[name]
    model = build()
    clean, corrupted = padded(side, seed=1), padded(side, seed=2)
    rnet = Recorder(model, input_data={"input_ids": clean["input_ids"][:1]})
    for row, kept in enumerate(clean["attention_mask"].bool()):
        last = int(kept.nonzero().max())  # the row's last real token

        def metric(out, row=row, last=last):
            return out.logits[row, last, :4].sum()

        grid = patch_sweep(rnet, clean, corrupted, names, metric)
        ids = [b["input_ids"][row, kept][None] for b in (clean, corrupted)]
        single = patch_sweep(
            rnet, ids[0], ids[1], names, lambda out: out.logits[0, -1, :4].sum()
        )
        # a sum of 4 logits, each within float32 rounding (assert_rows_close)
        tol = 4 * 1024 * EPS32 * float(single.abs().max())
        torch.testing.assert_close(grid[:, kept], single, atol=tol, rtol=0)


def test_a_direct_call_with_left_padding_warns_once_naming_the_fix():
    """rnet(**batch) stays the user's call; left padding on GPT-2 warns, once."""
    import warnings  # noqa: PLC0415

    model = gpt2()
    batch = padded("left")
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})
    msg = (
        "A left-padded batch (its `attention_mask` starts with padding) and no "
        "`position_ids` reached GPT2LMHeadModel, whose positions are learned absolute "
        "ones: each padded row's tokens are numbered from its padding, so its "
        "activations differ from the row run alone. Pass "
        "`position_ids=(mask.cumsum(-1) - 1).clamp(min=0)` with the batch, pad on "
        "the right (`tokenizer.padding_side = 'right'`), or use "
        "`scio_recorder.collect` / `activations.write`, which derive them "
        "(`position_ids='from_mask'`). Shown once per recorder."
    )
    with pytest.warns(UserWarning, match=f"^{re.escape(msg)}$") as caught:
        rnet(**batch)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rnet(**batch)  # once per recorder
        for quiet in (
            Recorder(model, input_data={"input_ids": batch["input_ids"][:1]}),
            Recorder(llama(), input_data={"input_ids": batch["input_ids"][:1]}),
        ):
            quiet(**padded("right"))
            quiet(**Positions(quiet.net).add((), batch)[1])
        Recorder(llama(), input_data={"input_ids": batch["input_ids"][:1]})(**batch)


# -- the padding mask reaches the model, or the write is refused -------------


def test_an_ids_mask_tuple_reaches_the_model_with_its_mask(tmp_path):
    """(ids, mask) batches: `input=0, mask=1` would store rows computed with
    the padding attended to, so it is refused; the form the message names
    gives the model the mask, and each row is stored as alone."""
    # It stored left-padded rows 0.076 away from the row alone, silently.
    from scio_recorder.activations import write  # noqa: PLC0415 (a heavier part)

    model = gpt2()
    batch = padded("left")
    tuples = [(batch["input_ids"], batch["attention_mask"])]
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})
    layer = "transformer.h.1"
    msg = (
        "`mask=1` of batch 0 pads some rows, but the net's inputs give "
        "GPT2LMHeadModel no `attention_mask`, which its forward takes: the model "
        "would attend to the padding (and number a left-padded row's tokens from "
        "it), so a padded row's activations would depend on it. Give the model "
        "the mask too, e.g. for (ids, mask) tuples `input=lambda b: {'input_ids': "
        "b[0], 'attention_mask': b[1]}, mask=1` (`write` adds no input to the "
        "model's but position ids). If the mask's zeros are not padding (a choice "
        "of the tokens stored), give the model its own `attention_mask`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        write(rnet, tuples, tmp_path / "refused", layers=[layer], input=0, mask=1)
    assert not (tmp_path / "refused").exists()
    ds = write(
        rnet,
        tuples,
        tmp_path / "set",
        layers=[layer],
        input=lambda b: {"input_ids": b[0], "attention_mask": b[1]},
        mask=1,
    )
    want = torch.cat([row[layer][0] for row in alone(model, batch, [layer])])
    assert_rows_close(ds[torch.arange(len(ds))][layer], want)


# -- the first and last real tokens of padded rows ---------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=4)
)
def test_cls_and_last_pool_each_rows_first_and_last_kept_token(rows):
    """token="cls": the first token the mask keeps; "last": the last one."""
    from scio_recorder.ood._layers import pool_features  # noqa: PLC0415

    mask = torch.tensor(rows, dtype=torch.long)
    value = torch.arange(mask.numel() * 2.0).reshape(*mask.shape, 2)
    first = pool_features(value, token="cls", mask=mask)  # noqa: S106 (a token)
    last = pool_features(value, token="last", mask=mask)  # noqa: S106
    for row, keep in enumerate(rows):
        kept = [i for i, k in enumerate(keep) if k] or [0, len(keep) - 1]
        assert first[row].tolist() == value[row, kept[0]].tolist()
        assert last[row].tolist() == value[row, kept[-1]].tolist()


def _rows_alone(batches):
    """Each row of (batch, labels) pairs as a batch of its own, unpadded."""
    out = []
    for batch, labels in batches:
        for row, kept in enumerate(batch["attention_mask"].bool()):
            ids = batch["input_ids"][row, kept][None]
            one = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            out.append((one, labels[row : row + 1]))
    return out


@pytest.mark.parametrize(
    ("token", "side"),
    [("cls", "left"), ("cls", "right"), ("last", "left"), ("last", "right")],
)
def test_first_and_last_token_detectors_see_each_padded_row_as_alone(token, side):
    """MahalanobisEnsemble(token="cls" or "last", mask=): fitted on padded
    batches as on the rows alone, and each padded row scored as alone."""
    # token="cls" took column 0: a left-padded row's pad (scored 0.0, and
    # fitted on).
    from scio_recorder.ood import MahalanobisEnsemble  # noqa: PLC0415

    model = gpt2()
    rnet = Recorder(model, input_data={"input_ids": padded(side)["input_ids"][:1]})
    layers = ["transformer.h.0", "transformer.h.1"]
    fit = [(padded(side, seed), torch.tensor([0, 1, 0])) for seed in range(1, 4)]
    detectors = [
        MahalanobisEnsemble(
            rnet, layers, token=token, mask="attention_mask", shrinkage=0.5
        ).fit(data, input=lambda b: b[0], target=1)
        for data in (fit, _rows_alone(fit))
    ]
    for batched, single in zip(detectors[0].means, detectors[1].means, strict=True):
        # means of features equal to float32 rounding (assert_rows_close)
        assert_rows_close(batched, single)
    batch = padded(side)
    scores = detectors[0](**batch)
    for (one, _), row in zip(_rows_alone([(batch, scores)]), range(3), strict=True):
        single = detectors[0](**one)
        # as in test_fitted_detector_scores_each_row_as_alone: the score is a
        # quadratic form in features equal to float32 rounding
        tol = 100 * 1024 * EPS32 * float(single.abs().max())
        torch.testing.assert_close(scores[row : row + 1], single, atol=tol, rtol=0)


# -- the gradient fits derive position ids as the other fits do ------------------


def _classifier():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=32,
        num_labels=3, pad_token_id=0,
    )  # fmt: skip
    return transformers.GPT2ForSequenceClassification(config).eval()


def test_a_gradient_fit_counts_each_padded_row_as_alone():
    """NAC.fit (its own gradient loop) on a left-padded batch: the histograms
    of the rows alone; position_ids=None passes the batch as it is."""
    # Its loop passed the batch as it was: a left-padded row's states were
    # those of its tokens numbered from the padding.
    from scio_recorder.ood import NAC  # noqa: PLC0415

    model = _classifier()
    batch = padded("left")
    rnet = Recorder(model, input_data={"input_ids": batch["input_ids"][:1]})

    def counts(data, **options):
        nac = NAC(rnet, ["transformer.h.1"], token="mean", mask="attention_mask")  # noqa: S106 (a token)
        return nac.fit(data, input=lambda b: b[0], **options).counts[0]

    alone_counts = counts(_rows_alone([(batch, torch.zeros(3))]))
    # Integer histograms: states equal to float32 rounding fall in the same bins
    # (none of these lies within 1e-4 of a bin's edge).
    assert torch.equal(counts([(batch, None)]), alone_counts)
    with warnings.catch_warnings():  # the batch as it is, as asked: no warning
        warnings.simplefilter("error")
        as_is = counts([(batch, None)], position_ids=None)
    assert not torch.equal(as_is, alone_counts)


# -- position embeddings the net's forward does not reach ---------------------


class Wrap(torch.nn.Module):
    """A task head around a Hugging Face model, without `position_ids`."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.m = lm

    def forward(self, input_ids, attention_mask=None):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


class NoIds(torch.nn.Module):
    """DistilBERT-like: learned absolute positions, no `position_ids` taken."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.word_embeddings = torch.nn.Embedding(VOCAB, 8)
        self.position_embeddings = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask=None):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.proj(x)


WRAPPED = (
    "A left-padded batch (its `attention_mask` starts with padding) reached `m` "
    "(GPT2LMHeadModel) inside Wrap, whose positions are learned absolute ones "
    "and to which Wrap's forward gives no `position_ids`: each padded row's "
    "tokens are numbered from its padding, so its activations differ from the "
    "row run alone, and `write`, `collect` and the detectors cannot derive "
    "position ids for it. Pad on the right (`tokenizer.padding_side = 'right'`), "
    "or pass `position_ids` through Wrap's forward to `m` (`write`, `collect` "
    "and the detectors then derive them from the mask). Shown once per recorder."
)
NO_IDS = (
    "A left-padded batch (its `attention_mask` starts with padding) reached "
    "NoIds, whose positions are learned absolute ones and whose forward takes no "
    "`position_ids`: each padded row's tokens are numbered from its padding, so "
    "its activations differ from the row run alone, and `write`, `collect` and "
    "the detectors cannot derive position ids for it. Pad on the right "
    "(`tokenizer.padding_side = 'right'`). Shown once per recorder."
)


def _run(path, rnet, batch, tmp_path):
    """Feed ``batch`` to ``rnet`` through one path of the library."""
    layer = "proj" if isinstance(rnet.net, NoIds) else "m.transformer.h.0.mlp"
    if path == "direct":
        rnet(**batch)
    elif path == "write":
        from scio_recorder.activations import write  # noqa: PLC0415

        write(rnet, [batch], tmp_path / "set", layers=[layer])
    elif path == "collect":
        from scio_recorder import collect  # noqa: PLC0415

        collect(rnet, [batch], {layer: "concat"}, input=lambda b: b)
    else:  # a detector's fit and its scores
        from scio_recorder.ood import MahalanobisEnsemble  # noqa: PLC0415

        det = MahalanobisEnsemble(
            rnet,
            [layer],
            token="mean",  # noqa: S106 (not a password)
            mask="attention_mask",
            shrinkage=0.5,
        )
        det.fit([(batch, torch.tensor([0, 1, 0]))], input=lambda b: b[0], target=1)
        det.score(**batch)


@pytest.mark.parametrize(
    ("net", "path"),
    [
        (net, path)
        for net in ("wrap", "no_ids")
        for path in ("direct", "write", "collect", "detector")
    ],
)
def test_absolute_positions_the_net_cannot_give_ids_warn_once(net, path, tmp_path):
    """A left-padded batch warns once, naming the module and the fix, when the
    positions are a module's the net gives no `position_ids` (a wrapper around
    GPT-2, a DistilBERT-like model); right padding does not."""
    # Neither warned: the wrapped GPT-2's left-padded rows were stored 0.078
    # away from the row alone, silently.
    import warnings  # noqa: PLC0415

    model = Wrap(gpt2()).eval() if net == "wrap" else NoIds()
    message = WRAPPED if net == "wrap" else NO_IDS
    ids = padded("left")["input_ids"][:1]
    rnet = Recorder(model, input_data={"input_ids": ids})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(path, rnet, padded("right"), tmp_path / "right")
    with pytest.warns(UserWarning, match=f"^{re.escape(message)}$") as caught:
        _run(path, rnet, padded("left"), tmp_path / "left")
    assert [str(w.message) for w in caught] == [message]  # once
    assert caught[0].filename == __file__
