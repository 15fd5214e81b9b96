"""IOI prompts as a task-level probe set (tasks/stories.py): the prompts the residual-LM experiment asks."""

import dataclasses

import pytest

from incontext.experiments import residual_lm
from incontext.tasks.stories import HELDOUT_NAMES, TRAIN_NAMES, IOIPrompt, ioi_prompts, paper_ioi_prompts


def test_ioi_prompts_at_seed_0():
    prompts = ioi_prompts(2, 0)
    assert len(prompts) == 16 and [p.group for p in prompts[:8:2]] == ["paper 1", "paper 2", "paper 3", "paper 4"]
    assert prompts[0] == IOIPrompt("When John and Mary went to the shops, John gave the bag to", "Mary", "John", "paper 1")
    assert prompts[8] == IOIPrompt("When Emily and Nick went to the school, Emily showed a hat to", "Nick", "Emily", "train names")
    assert prompts[12] == IOIPrompt("After Tara and Dina went to the zoo, Tara threw a cup to", "Dina", "Tara", "held-out names")


@pytest.mark.skipif(not hasattr(residual_lm, "sampled_prompts"), reason="residual_lm takes its prompts from tasks.stories")
def test_ioi_prompts_match_the_experiments_own_at_the_same_seed():
    plain = lambda prompts: [dataclasses.astuple(p) for p in prompts]  # noqa: E731
    for seed in (0, 3):
        expected = (residual_lm.paper_prompts() + residual_lm.sampled_prompts(TRAIN_NAMES, 7, seed, "train names")
                    + residual_lm.sampled_prompts(HELDOUT_NAMES, 7, seed, "held-out names"))
        assert plain(ioi_prompts(7, seed)) == plain(expected)
        assert plain(ioi_prompts(7, seed, paper=False)) == plain(expected[8:])


def test_each_pair_is_asked_both_ways_and_names_stay_in_their_group():
    prompts = ioi_prompts(5, 1, paper=False)
    assert len(prompts) == 20 and len(paper_ioi_prompts()) == 8
    for first, second in zip(prompts[::2], prompts[1::2]):
        assert (first.correct, first.incorrect) == (second.incorrect, second.correct)
        assert first.text.endswith(" to") and first.incorrect in first.text.split(",")[1]
    assert all(p.correct in HELDOUT_NAMES for p in prompts if p.group == "held-out names")
    assert all(p.correct in TRAIN_NAMES for p in prompts if p.group == "train names")
