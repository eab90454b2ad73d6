"""The draft vocabulary as speculators 0.9 builds it (pipeline/exports/vocab.py; proven equal to speculators' own
functions in tests/exports/test_draft_vocab.py): only loss-masked tokens counted, ties to the lower id, offsets."""
from __future__ import annotations

import torch

from pipeline.exports.vocab import frequencies, mappings


def test_only_trained_tokens_are_counted_in_speculators_order():
    tokens = [(torch.tensor([5, 7, 7, 9]), torch.tensor([0, 1, 1, 1], dtype=torch.uint8)),
              (torch.tensor([3, 5, 9]), torch.tensor([1, 1, 0], dtype=torch.uint8))]
    freq = frequencies(tokens)
    assert freq == {7: 2, 9: 1, 3: 1, 5: 1} and list(freq) == [7, 9, 3, 5]


def test_the_most_frequent_tokens_ties_to_the_lower_id_as_offsets():
    d2t, t2d = mappings({7: 2, 9: 1, 3: 1, 5: 1}, draft_vocab=2, target_vocab=12)
    assert (d2t + torch.arange(2)).tolist() == [3, 7] and d2t.dtype == torch.int64
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == [3, 7] and t2d.shape == (12,)


def test_fewer_trained_tokens_than_n_are_filled_with_the_lowest_unused_ids():
    d2t, _ = mappings({7: 2, 1: 1}, draft_vocab=4, target_vocab=12)
    assert (d2t + torch.arange(4)).tolist() == [0, 1, 2, 7]
