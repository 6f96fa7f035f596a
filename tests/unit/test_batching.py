"""Token-budget batching (`TokenBatchSampler`), the collator's index triples and `restore_order`."""

from __future__ import annotations

import hashlib
import logging
import pickle
import random
import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from attnlab.data import batching
from attnlab.data.batching import Collator, TokenBatchSampler, restore_order

PAD, BOS, EOS = 0, 1, 2

lengths_strategy = st.lists(st.integers(1, 60), min_size=1, max_size=200)
property_settings = settings(max_examples=50, deadline=None)


def cost(lengths: list[int], batch: list[int]) -> int:
    """Tokens of the padded batch: B * longest."""
    return len(batch) * max(lengths[i] for i in batch)


def rank_batches(
    lengths: list[int], num_replicas: int, epoch: int = 0, **kwargs: Any
) -> list[list[list[int]]]:
    """The batches of every rank for one epoch (checking `len` against the iteration)."""
    out = []
    for rank in range(num_replicas):
        sampler = TokenBatchSampler(lengths, num_replicas=num_replicas, rank=rank, **kwargs)
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(sampler) == len(batches)
        out.append(batches)
    return out


def interleave(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Inverse of `batches[r::num_replicas]`: the global list from the ranks' lists."""
    merged = []
    for step in range(max(len(b) for b in per_rank)):
        merged += [batches[step] for batches in per_rank if step < len(batches)]
    return merged


def realistic_lengths(n: int = 5000, seed: int = 0) -> list[int]:
    """Sentence lengths around 14 tokens, like a sentence-piece tokenised news corpus."""
    rng = random.Random(seed)
    return [max(1, min(120, round(rng.normalvariate(14, 6)))) for _ in range(n)]


def padding_ratio(lengths: list[int], batches: list[list[int]]) -> float:
    padded = sum(cost(lengths, b) for b in batches)
    return 1 - sum(lengths[i] for b in batches for i in b) / padded


# ---------------------------------------------------------------------------------------------------------
# Arguments


BAD_SAMPLERS: list[tuple[dict[str, Any], str]] = [
    ({}, "max_tokens, batch_size"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"batch_size": -1}, "batch_size=-1"),
    ({"max_tokens": 64, "num_replicas": 0}, "num_replicas=0"),
    ({"max_tokens": 64, "num_replicas": 2, "rank": 2}, "rank=2"),
    ({"max_tokens": 64, "rank": -1}, "rank=-1"),
]


@pytest.mark.parametrize(("kwargs", "named"), BAD_SAMPLERS, ids=[n for _, n in BAD_SAMPLERS])
def test_sampler_rejects_bad_arguments(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        TokenBatchSampler([3, 4, 5], **kwargs)


def test_sampler_rejects_empty_examples() -> None:
    with pytest.raises(ValueError, match=re.escape("lengths[1]=0")):
        TokenBatchSampler([3, 0, 5], max_tokens=64)


# ---------------------------------------------------------------------------------------------------------
# Budget, coverage, distribution


@property_settings
@given(
    lengths=lengths_strategy,
    max_tokens=st.integers(60, 600),
    batch_size=st.one_of(st.none(), st.integers(1, 40)),
    num_replicas=st.integers(1, 4),
    epoch=st.integers(0, 5),
)
def test_eval_batches_are_within_budget_and_cover_every_example_once(
    lengths: list[int], max_tokens: int, batch_size: int | None, num_replicas: int, epoch: int
) -> None:
    kwargs = {"max_tokens": max_tokens, "batch_size": batch_size, "shuffle": False}
    (single,) = rank_batches(lengths, 1, **kwargs)
    per_rank = rank_batches(lengths, num_replicas, epoch=epoch, **kwargs)
    assert interleave(per_rank) == single  # the ranks' batches are exactly the global list
    assert max(len(b) for b in per_rank) - min(len(b) for b in per_rank) <= 1
    assert sorted(i for b in single for i in b) == list(range(len(lengths)))
    for batch in single:
        assert cost(lengths, batch) <= max_tokens or len(batch) == 1
        assert batch_size is None or len(batch) <= batch_size
    flat = [lengths[i] for b in single for i in b]
    assert flat == sorted(flat)  # sorted by length for little padding


@property_settings
@given(
    lengths=lengths_strategy,
    max_tokens=st.integers(60, 600),
    num_replicas=st.integers(1, 4),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 5),
)
def test_train_batches_are_within_budget_disjoint_and_equal_per_rank(
    lengths: list[int], max_tokens: int, num_replicas: int, seed: int, epoch: int
) -> None:
    kwargs = {"max_tokens": max_tokens, "seed": seed}
    (single,) = rank_batches(lengths, 1, epoch=epoch, **kwargs)
    assert sorted(i for b in single for i in b) == list(range(len(lengths)))  # each example once
    assert all(cost(lengths, b) <= max_tokens or len(b) == 1 for b in single)
    per_rank = rank_batches(lengths, num_replicas, epoch=epoch, **kwargs)
    assert len({len(b) for b in per_rank}) == 1  # every rank takes as many steps
    kept = len(single) - len(single) % num_replicas
    assert interleave(per_rank) == single[:kept]  # the last batches of the shuffled order are dropped
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen))  # disjoint
    assert per_rank == rank_batches(lengths, num_replicas, epoch=epoch, **kwargs)  # reproducible


def test_an_oversize_example_gets_a_batch_of_its_own_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lengths = [5, 100, 6, 120, 5, 7]
    with caplog.at_level(logging.WARNING, logger="attnlab.data.batching"):
        sampler = TokenBatchSampler(lengths, max_tokens=50, shuffle=False)
        batches = list(sampler) + list(sampler)
    assert batches[: len(sampler)] == [[0, 4, 2, 5], [1], [3]]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "2 of 6 examples are longer than max_tokens=50" in warnings[0].getMessage()


def test_an_example_of_exactly_max_tokens_fits_and_is_not_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="attnlab.data.batching"):
        sampler = TokenBatchSampler([50, 25, 25], max_tokens=50, shuffle=False)
    assert list(sampler) == [[1, 2], [0]]  # 2 x 25 and 1 x 50: both exactly the budget
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_batch_size_alone_gives_fixed_size_batches() -> None:
    sampler = TokenBatchSampler([9, 1, 8, 2, 7, 3, 6], batch_size=3, shuffle=False)
    assert list(sampler) == [[1, 3, 5], [6, 4, 2], [0]]
    assert len(sampler) == 3


# ---------------------------------------------------------------------------------------------------------
# Order across epochs and seeds


def test_train_order_depends_on_seed_and_epoch_only() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(1, 60) for _ in range(1000)]

    def epoch_batches(seed: int, epoch: int) -> list[list[int]]:
        sampler = TokenBatchSampler(lengths, max_tokens=256, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    first = epoch_batches(seed=7, epoch=1)
    assert first == epoch_batches(seed=7, epoch=1)
    assert first != epoch_batches(seed=7, epoch=2)
    assert first != epoch_batches(seed=8, epoch=1)
    # not only the order of the batches: ties are broken anew, so their contents change too
    assert {tuple(sorted(b)) for b in first} != {tuple(sorted(b)) for b in epoch_batches(seed=7, epoch=2)}
    eval_sampler = TokenBatchSampler(lengths, max_tokens=256, shuffle=False)
    eval_first = list(eval_sampler)
    eval_sampler.set_epoch(3)
    assert list(eval_sampler) == eval_first


def reference_training_batches(lengths: list[int], max_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The training order written out with int64 arrays and a Python packing loop: the order the sampler
    gave before it held its lengths as uint16 and its order as int32 (saved positions must still fit)."""
    generator = batching._generator(seed, epoch)
    order = torch.randperm(len(lengths), generator=generator).numpy()  # int64
    order = order[np.argsort(np.asarray(lengths, dtype=np.int64)[order], kind="stable")]
    batches: list[list[int]] = []
    for i in order.tolist():
        if batches and (len(batches[-1]) + 1) * max(lengths[j] for j in [*batches[-1], i]) <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]


@pytest.mark.parametrize("longest", [60, 70_000])
def test_training_batches_are_the_int64_ones_from_narrow_arrays(longest: int) -> None:
    rng = random.Random(5)
    lengths = [rng.randint(1, 60) for _ in range(3000)] + [longest]
    sampler = TokenBatchSampler(lengths, max_tokens=512, seed=9)
    assert sampler.lengths.dtype == (np.uint16 if longest < 2**16 else np.uint32)
    for epoch in (0, 1, 4):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sampler._rank_batches().order.dtype == np.int32  # slices of the epoch's int32 order
        assert batches == reference_training_batches(lengths, 512, seed=9, epoch=epoch)
    assert (
        sampler.fingerprint()["lengths"]
        == TokenBatchSampler(np.asarray(lengths, dtype=np.int64), max_tokens=512).fingerprint()["lengths"]
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_rank_keeps_only_its_own_share_of_the_epoch(shuffle: bool) -> None:
    """Each rank holds its batches' examples (about N / ranks int32) and their boundaries, not the
    epoch's whole order nor an object per batch; the padding ratio still covers every rank's batches."""
    rng = random.Random(6)
    lengths = [rng.randint(1, 60) for _ in range(3000)]
    samplers = [
        TokenBatchSampler(lengths, max_tokens=300, shuffle=shuffle, num_replicas=3, rank=r) for r in range(3)
    ]
    for epoch in (0, 1):
        ranks = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            ranks.append(list(sampler))
            kept = sampler._rank_batches()
            assert len(kept.order) == sum(map(len, ranks[-1])) < len(lengths) / 2
            assert kept.order.base is None and kept.bounds.base is None  # not views of an epoch-wide array
        every = [batch for rank in ranks for batch in rank]
        assert len({i for batch in every for i in batch}) == sum(map(len, every))  # disjoint
        for sampler in samplers:
            assert sampler.padding_ratio() == pytest.approx(padding_ratio(lengths, every))


def test_dropped_training_batches_change_each_epoch() -> None:
    rng = random.Random(4)
    lengths = [rng.randint(1, 60) for _ in range(500)]
    assert len(TokenBatchSampler(lengths, max_tokens=100)) % 3 == 2  # two batches are dropped
    dropped = []
    for epoch in range(4):
        seen = {i for rank in rank_batches(lengths, 3, epoch=epoch, max_tokens=100) for b in rank for i in b}
        dropped.append(frozenset(range(len(lengths))) - seen)
    assert any(dropped) and len(set(dropped)) > 1


def test_padding_ratio_is_low_and_beats_shuffled_fixed_size_batches() -> None:
    lengths = realistic_lengths()
    sampler = TokenBatchSampler(lengths, max_tokens=1024, seed=0)
    batches = list(sampler)
    assert sampler.padding_ratio() == pytest.approx(padding_ratio(lengths, batches))
    # baseline: shuffled batches of a fixed number of sentences, as many per batch on average
    per_batch = round(len(lengths) / len(batches))
    order = random.Random(0).sample(range(len(lengths)), len(lengths))
    baseline = padding_ratio(lengths, [order[k : k + per_batch] for k in range(0, len(order), per_batch)])
    assert sampler.padding_ratio() < 0.10
    assert sampler.padding_ratio() < baseline


# ---------------------------------------------------------------------------------------------------------
# Resumption


@pytest.mark.parametrize("num_replicas", [1, 2])
@pytest.mark.parametrize("k", [0, 1, 5])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(num_replicas: int, k: int) -> None:
    lengths = realistic_lengths(n=600, seed=1)
    for rank in range(num_replicas):

        def make(rank: int = rank) -> TokenBatchSampler:
            return TokenBatchSampler(lengths, max_tokens=256, seed=3, num_replicas=num_replicas, rank=rank)

        original = make()
        original.set_epoch(1)
        expected = list(original)
        batches = iter(original)
        head = [next(batches) for _ in range(k)]
        state = original.state_dict()
        assert state == {"epoch": 1, "seed": 3, "yielded": k}

        resumed = make()
        resumed.load_state_dict(state)
        resumed.set_epoch(1)  # as the training loop does: keeps the pending state of the same epoch
        assert head + list(resumed) == expected
        assert resumed.state_dict()["yielded"] == len(expected)
        assert list(resumed) == expected  # a later pass starts from the beginning again
        resumed.set_epoch(2)
        assert resumed.state_dict()["yielded"] == 0


def test_set_epoch_to_another_epoch_drops_a_loaded_state() -> None:
    sampler = TokenBatchSampler(realistic_lengths(n=300), max_tokens=256)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.load_state_dict({"epoch": 1, "seed": 0, "yielded": 3})
    sampler.set_epoch(2)
    assert sampler.state_dict() == {"epoch": 2, "seed": 0, "yielded": 0}
    assert list(sampler) == full


@pytest.mark.parametrize("chunk", [1, 7, 65536])
def test_the_fingerprint_hashes_the_lengths_as_one_text_whatever_the_chunk(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lengths are hashed chunk by chunk (bounded memory at WMT scale), giving the digest of the whole
    comma-joined text that checkpoints of earlier versions hold: their positions still resume."""
    monkeypatch.setattr(batching, "FINGERPRINT_CHUNK", chunk)
    lengths = realistic_lengths(n=100)
    whole = hashlib.blake2b(",".join(map(str, lengths)).encode(), digest_size=8).hexdigest()
    assert TokenBatchSampler(lengths, max_tokens=256).fingerprint()["lengths"] == whole
    assert TokenBatchSampler([*lengths[:-1], 61], max_tokens=256).fingerprint()["lengths"] != whole


def test_load_state_dict_restores_the_seed() -> None:
    lengths = realistic_lengths(n=300)
    other = TokenBatchSampler(lengths, max_tokens=256, seed=9)
    other.set_epoch(4)
    sampler = TokenBatchSampler(lengths, max_tokens=256, seed=0)
    assert list(sampler) != list(other)
    sampler.load_state_dict({"epoch": 4, "seed": 9, "yielded": 2})
    assert list(sampler) == list(other)[2:]


def test_load_state_dict_rejects_bad_states() -> None:
    sampler = TokenBatchSampler([4] * 10, max_tokens=8)
    with pytest.raises(ValueError, match="yielded"):
        sampler.load_state_dict({"epoch": 0, "seed": 0})
    with pytest.raises(ValueError, match=re.escape("yielded=6 but epoch 0 has 5 batches")):
        sampler.load_state_dict({"epoch": 0, "seed": 0, "yielded": 6})


# ---------------------------------------------------------------------------------------------------------
# Collator triples and restore_order


def test_collator_adds_index_for_triples_only() -> None:
    collate = Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    pairs = [([5, 6, EOS], [6, 5]), ([7, EOS], [7])]
    triples = [(s, t, i) for (s, t), i in zip(pairs, [4, 1], strict=True)]
    plain, indexed = collate(pairs), collate(triples)
    assert set(plain) == {"src", "tgt_in", "tgt_out"}
    assert set(indexed) == {"src", "tgt_in", "tgt_out", "index"}
    assert all(torch.equal(plain[key], indexed[key]) for key in plain)
    assert indexed["index"].dtype == torch.long and indexed["index"].tolist() == [4, 1]
    with pytest.raises(ValueError, match=re.escape("[2, 3]")):
        collate([pairs[0], triples[1]])


def test_a_pickled_batch_travels_as_its_one_buffer_and_comes_back_whole() -> None:
    """How a DataLoader worker hands a batch over: the buffer's bytes in the pickle, no tensor of its own
    (which would go through shared memory). A batch changed after collation pickles as plain tensors."""
    from multiprocessing.reduction import ForkingPickler

    def collated() -> batching.Batch:
        return Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)([([5, 6, EOS], [6, 5], 3), ([7, EOS], [7], 0)])

    batch = collated()
    payload = ForkingPickler.dumps(batch)
    assert b"torch" not in payload and len(payload) < batch["src"].untyped_storage().nbytes() + 300
    back = pickle.loads(payload)
    assert type(back) is batching.Batch and list(back) == list(batch)
    assert all(torch.equal(back[k], batch[k]) and back[k].dtype == torch.long for k in batch)
    assert len({value.untyped_storage().data_ptr() for value in back.values()}) == 1
    back["src"][0, 0] = 9  # writable, and its own copy
    assert batch["src"][0, 0] == 5
    changes = [
        lambda b: b["src"].t_(),  # the same tensor, transposed in place
        lambda b: b["src"].resize_(1, 3),  # the same memory, fewer rows
        lambda b: b["tgt_in"].set_(torch.full((2, 3), 8)),  # the same tensor over other memory
        lambda b: b["tgt_in"].set_(b["tgt_in"].untyped_storage(), 1, (2, 3)),  # the same memory, shifted
        lambda b: b.update(index=b.pop("index")),  # the same tensor, moved to the end
        lambda b: b.update(tgt_out=b["tgt_out"] + 1),  # replaced
        lambda b: b.update(weight=torch.ones(2)),  # added
    ]
    for change in changes:  # each alone: any one of them must make the batch travel as its tensors
        batch = collated()
        change(batch)
        changed = pickle.loads(ForkingPickler.dumps(batch))
        assert type(changed) is batching.Batch and list(changed) == list(batch)
        assert all(torch.equal(changed[k], batch[k]) for k in batch)
    alone = Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)([([5, EOS], [6, 5]), ([7, EOS], [7])])
    alone["src"].t_()  # square (2, 2): only the strides show it
    assert torch.equal(pickle.loads(ForkingPickler.dumps(alone))["src"], alone["src"])
    with pytest.raises(ValueError, match="covers 4 of the buffer's 5 elements"):
        batching.Batch.of(torch.zeros(5, dtype=torch.long), [("src", (2, 2))])


def test_a_worker_hands_batches_over_outside_shared_memory() -> None:
    """Batches from a worker process equal the in-process ones and hold no shared-memory tensor: shared
    memory costs a file descriptor passed per batch, 2-3x slower handoff with 2 workers on 2 cores."""
    collate = Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    rng = random.Random(1)
    examples = [([rng.randint(3, 20) for _ in range(rng.randint(1, 12))] + [EOS], [4] * rng.randint(1, 9), i)
                for i in range(40)]  # fmt: skip
    sampler = TokenBatchSampler([len(s) for s, _, _ in examples], max_tokens=64)
    here = list(DataLoader(examples, batch_sampler=sampler, collate_fn=collate))
    there = list(DataLoader(examples, batch_sampler=sampler, collate_fn=collate, num_workers=1))
    assert len(here) == len(there) > 2
    for mine, theirs in zip(here, there, strict=True):
        assert type(theirs) is batching.Batch and all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert not any(value.is_shared() for value in theirs.values())


def test_restore_order_round_trip() -> None:
    items = [f"out{i}" for i in range(50)]
    order = random.Random(0).sample(range(50), 50)
    assert restore_order(order, [items[i] for i in order]) == items
    assert restore_order(torch.tensor(order), [items[i] for i in order]) == items
    assert restore_order([], []) == []


@pytest.mark.parametrize(
    ("indices", "named"),
    [
        ([0, 2, 2], "duplicate indices 2; missing indices 1"),
        ([0, 1, 5], "out-of-range indices 5; missing indices 2"),
        ([0, 1, 3], "out-of-range indices 3; missing indices 2"),  # one past the last
        ([0, 1], "2 indices for 3 items"),
    ],
)
def test_restore_order_names_bad_indices(indices: list[int], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        restore_order(indices, ["a", "b", "c"])


def test_restore_order_of_part_of_a_set_sorts_by_index_and_refuses_repeats() -> None:
    """`complete=False` (a limited validation pass): any distinct non-negative indices, sorted."""
    assert restore_order([7, 0, 3], ["h", "a", "d"], complete=False) == ["a", "d", "h"]
    assert restore_order([], [], complete=False) == []
    with pytest.raises(ValueError, match=re.escape("duplicate indices 3 (expected distinct non-negative")):
        restore_order([3, 0, 3], ["d", "a", "d"], complete=False)
    with pytest.raises(ValueError, match=re.escape("out-of-range indices -1")):
        restore_order([0, -1], ["a", "b"], complete=False)
    with pytest.raises(ValueError, match=re.escape("missing indices 1, 2")):
        restore_order([7, 0, 3], ["h", "a", "d"])


# ---------------------------------------------------------------------------------------------------------
# DataLoader


@pytest.mark.parametrize("shuffle", [True, False])
def test_dataloader_with_token_batches_restores_the_original_order(shuffle: bool) -> None:
    rng = random.Random(5)
    examples = []
    for i in range(300):
        src = [rng.randint(3, 20) for _ in range(rng.randint(1, 30))] + [EOS]
        examples.append((src, src[:-1][::-1], i))
    lengths = [max(len(s), len(t) + 1) for s, t, _ in examples]
    sampler = TokenBatchSampler(lengths, max_tokens=200, shuffle=shuffle, seed=1)
    loader = DataLoader(
        examples, batch_sampler=sampler, collate_fn=Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    )
    assert len(loader) == len(sampler)
    sampler.set_epoch(1)
    indices: list[int] = []
    sources: list[list[int]] = []
    for batch in loader:
        assert batch["src"].numel() <= 200 and batch["tgt_in"].numel() <= 200
        assert batch["src"].size(0) == batch["index"].size(0)
        indices += batch["index"].tolist()
        sources += [[t for t in row if t != PAD] for row in batch["src"].tolist()]
    assert restore_order(indices, sources) == [s for s, _, _ in examples]


def test_unbucketed_training_batches_mix_lengths_and_still_cover_every_example_once() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(2, 40) for _ in range(400)]
    bucketed = TokenBatchSampler(lengths, batch_size=16, seed=1)
    mixed = TokenBatchSampler(lengths, batch_size=16, seed=1, bucket=False)
    assert sorted(i for b in mixed for i in b) == list(range(400))

    def spread(sampler: TokenBatchSampler) -> float:
        return sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in sampler) / len(sampler)

    assert spread(mixed) > 5 * spread(bucketed)
    assert mixed.padding_ratio() > bucketed.padding_ratio()


def test_a_loaded_position_survives_an_iterator_that_draws_nothing() -> None:
    """A DataLoader with workers makes an iterator of its batch sampler, drops it and makes another."""
    import torch

    lengths = realistic_lengths(n=300)
    original = TokenBatchSampler(lengths, max_tokens=256, seed=2)
    expected = list(original)
    resumed = TokenBatchSampler(lengths, max_tokens=256, seed=2)
    resumed.load_state_dict({"epoch": 0, "seed": 2, "yielded": 3})
    iter(resumed)  # made and dropped
    assert list(resumed) == expected[3:]
    resumed.load_state_dict({"epoch": 0, "seed": 2, "yielded": 3})
    loader = torch.utils.data.DataLoader(list(range(300)), batch_sampler=resumed, num_workers=1)
    assert [b.tolist() for b in loader] == expected[3:]
