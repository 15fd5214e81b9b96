import pytest
import torch

from incontext.tasks import BurstyConfig, BurstyTask, get_task

SMALL = dict(dim=16, max_pairs=10, n_classes=128, n_labels=16)


def exact_task(**overrides) -> BurstyTask:
    """eps = 0: every object token equals its class mean exactly, so classes can be read back from the inputs."""
    return BurstyTask(BurstyConfig(**{**SMALL, "eps": 0.0, **overrides}))


def parse(task: BurstyTask, batch):
    """Split inputs into positions, context objects (n, N, D), context labels (n, N, D) and query (n, D)."""
    c = task.config
    positions, content = batch.inputs[..., : c.n_positions], batch.inputs[..., c.n_positions:]
    return positions, content[:, 0:-1:2], content[:, 1::2], content[:, -1]


def label_ids(task, vectors):  # label vectors back to ids (exact match)
    match = (vectors[..., None, :] == task.label_vectors).all(-1)
    assert match.sum(-1).eq(1).all(), "every label token is exactly one label vector"
    return match.float().argmax(-1)


def known_class(task, vectors):  # object vectors back to known class ids, -1 for novel ones
    match = (vectors[..., None, :] == task.class_means).all(-1)
    return torch.where(match.any(-1), match.float().argmax(-1), torch.full(match.shape[:-1], -1))


def test_registered_and_sizes():
    task = get_task("bursty", dim=32, max_pairs=16)
    assert task.model_io() == {"d_input": 33 + 32, "d_output": 32}
    batch = task.sample(7, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (7, 17, 65) and batch.targets.shape == (7, 17)
    assert batch.mask[:, -1].all() and batch.mask.sum() == 7


@pytest.mark.parametrize("kind", ["train", "ic", "ic2", "iw"])
def test_deterministic_and_positions_shifted_one_hot(kind):
    task = exact_task()
    a = task.sample_kind(kind, 64, torch.Generator().manual_seed(3))
    b = task.sample_kind(kind, 64, torch.Generator().manual_seed(3))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    positions = parse(task, a)[0]
    assert positions.sum(-1).eq(1).all()
    slots = positions.argmax(-1)
    assert (slots[:, 1:] - slots[:, :-1]).eq(1).all()  # consecutive positions after a random shift
    assert slots[:, 0].min() >= 0 and slots[:, -1].max() < task.config.n_positions
    assert len(slots[:, 0].unique()) > 1


@pytest.mark.parametrize("kind", ["ic", "ic2"])
def test_bursty_contexts_hold_the_answer(kind):
    task = exact_task()
    c = task.config
    batch = task.sample_kind(kind, 200, torch.Generator().manual_seed(1))
    _, objects, labels, query = parse(task, batch)
    ids = label_ids(task, labels)
    for n in range(200):
        distinct, counts = objects[n].unique(dim=0, return_counts=True)
        assert len(distinct) == c.n_pairs // c.burst and counts.eq(c.burst).all()
        same = (objects[n] == query[n]).all(-1)
        assert same.sum() == c.burst, "the query's class is in the context B times"
        assert ids[n][same].eq(batch.targets[n, -1]).all(), "the answer is the label the context gives it"
        # distinct classes carry distinct labels
        per_class = {tuple(o.tolist()): int(i) for o, i in zip(objects[n], ids[n])}
        assert len(set(per_class.values())) == len(per_class)
    classes = known_class(task, query)
    if kind == "ic":
        assert classes.eq(-1).all(), "IC uses novel classes only"
    else:  # IC2: known classes with every label moved to the next one
        assert classes.ge(0).all()
        assert torch.equal(batch.targets[:, -1], (classes % c.n_labels + 1) % c.n_labels)
        context_classes = known_class(task, objects)
        assert torch.equal(ids, (context_classes % c.n_labels + 1) % c.n_labels)


def test_in_weights_set_never_shows_the_query():
    task = exact_task()
    batch = task.sample_kind("iw", 300, torch.Generator().manual_seed(2))
    _, objects, labels, query = parse(task, batch)
    assert not (objects == query[:, None]).all(-1).any()
    classes = known_class(task, query)
    assert classes.ge(0).all() and torch.equal(batch.targets[:, -1], classes % task.config.n_labels)
    assert torch.equal(label_ids(task, labels), known_class(task, objects) % task.config.n_labels)


def test_training_mixture_proportions():
    task = exact_task()
    batch = task.sample_kind("train", 4000, torch.Generator().manual_seed(4))
    _, objects, _, query = parse(task, batch)
    novel = known_class(task, query).eq(-1).float().mean()
    in_context = (objects == query[:, None]).all(-1).any(-1).float().mean()
    # 50% novel-bursty, 25% known-bursty, 25% known-iid (whose query is rarely in its context by chance)
    assert abs(float(novel) - 0.5) < 0.04
    assert abs(float(in_context) - 0.75) < 0.04


def test_noise_makes_instances_differ():
    task = BurstyTask(BurstyConfig(**SMALL))
    batch = task.sample_kind("ic", 10, torch.Generator().manual_seed(0))
    _, objects, _, query = parse(task, batch)
    assert not (objects == query[:, None]).all(-1).any()


@pytest.mark.parametrize("overrides, message", [
    (dict(n_pairs=7), "multiple of burst"),
    (dict(n_pairs=40, max_pairs=32), "exceeds max_pairs"),
    (dict(n_classes=100), "multiple of n_labels"),
    (dict(p_novel=1.5), "probability"),
    (dict(dim=0), "positive integer"),
])
def test_bad_config_is_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        BurstyConfig(**overrides)


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown bursty sequence kind"):
        exact_task().sample_kind("ood", 2, torch.Generator())
