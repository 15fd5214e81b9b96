"""IOI prompts as a task-level probe set (tasks/stories.py): the prompts the residual-LM experiment asks."""

from incontext.tasks.stories import HELDOUT_NAMES, TRAIN_NAMES, IOIPrompt, ioi_prompts, paper_ioi_prompts


def test_ioi_prompts_at_seed_0():
    prompts = ioi_prompts(2, 0)
    assert len(prompts) == 16 and [p.group for p in prompts[:8:2]] == ["paper 1", "paper 2", "paper 3", "paper 4"]
    assert prompts[0] == IOIPrompt("When John and Mary went to the shops, John gave the bag to", "Mary", "John", "paper 1")
    assert prompts[8] == IOIPrompt("When Emily and Nick went to the school, Emily showed a hat to", "Nick", "Emily", "train names")
    assert prompts[12] == IOIPrompt("After Tara and Dina went to the zoo, Tara threw a cup to", "Dina", "Tara", "held-out names")


def test_each_pair_is_asked_both_ways_and_names_stay_in_their_group():
    prompts = ioi_prompts(5, 1, paper=False)
    assert len(prompts) == 20 and len(paper_ioi_prompts()) == 8
    for first, second in zip(prompts[::2], prompts[1::2]):
        assert (first.correct, first.incorrect) == (second.incorrect, second.correct)
        assert first.text.endswith(" to") and first.incorrect in first.text.split(",")[1]
    assert all(p.correct in HELDOUT_NAMES for p in prompts if p.group == "held-out names")
    assert all(p.correct in TRAIN_NAMES for p in prompts if p.group == "train names")
