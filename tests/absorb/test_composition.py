"""Composition: documents absorbed one by one and answered together. The facts variant whose people are split over
documents, distill-lora's adapters added (against a float64 reference by hand, and on both backends' modules),
and the harness's composed rows (each document's score composed vs absorbed alone)."""

import re

import pytest
import torch
from conftest import ByteCodec, rel_error

pytest.importorskip("peft")

from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.methods.distill_lora import compose_loras  # noqa: E402
from incontext.harness.compare import compare  # noqa: E402
from incontext.harness.report import table  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402
from incontext.tasks.episodes import Episode, get_episode_source  # noqa: E402


def byte_model(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=48, vocab_size=256, max_seq_len=512,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, init_std=0.2)
    return Transformer(config).to(dtype).eval()


@pytest.mark.parametrize("people,documents", [(2, 2), (5, 2), (4, 3)])
def test_facts_split_over_documents(people, documents):
    codec = ByteCodec()
    whole = get_episode_source("facts", people=people).episodes(2, seed=3, tokenizer=codec)
    split = get_episode_source("facts", people=people, documents=documents).episodes(2, seed=3, tokenizer=codec)
    for episode, single in zip(split, whole):
        assert len(episode.parts) == documents and not single.parts
        assert torch.equal(episode.prompt, torch.cat([p.prompt for p in episode.parts]))
        assert [q.inputs.tolist() for q in episode.queries] == [q.inputs.tolist() for p in episode.parts for q in p.queries]
        sizes = [len(p.queries) for p in episode.parts]  # 4 facts a person, one of them the part's worked example
        assert sum(sizes) == 4 * people - documents
        texts = [codec.decode(p.prompt.tolist()) for p in episode.parts]
        for part, text in zip(episode.parts, texts):  # each part's questions are about its own people
            for q in part.queries:
                words = re.findall(r"[A-Z][a-z]+", codec.decode(q.inputs.tolist()).split("\n")[0])
                name = " ".join(w for w in words if w not in ("What", "Where", "Which", "When", "Who", "In"))
                assert name in text and all(name not in other for other in texts if other is not text)


def test_facts_documents_are_checked():
    with pytest.raises(ValueError, match="exceeds people"):
        get_episode_source("facts", people=2, documents=3)
    with pytest.raises(ValueError, match="format=plain"):
        get_episode_source("facts", people=2, documents=2, format="chat")
    split = get_episode_source("facts", people=3, documents=2, questions="paraphrases:2").episodes(1, tokenizer=ByteCodec())[0]
    # the parts' questions keep distinct ids in the whole episode (wording_ensemble groups within a question)
    first, second = (part.train_groups for part in split.parts)
    assert first and second and not set(first) & set(second) and split.train_groups == first + second
    assert split.train_groups == [i // 3 for i in range(len(split.train_queries))]
    with pytest.raises(ValueError, match="must name one question per training query"):
        Episode(prompt=split.prompt, queries=split.queries, train_queries=split.train_queries, train_groups=[0])
    with pytest.raises(ValueError, match="concatenation"):
        part = get_episode_source("facts", people=2, documents=2).episodes(1, tokenizer=ByteCodec())[0]
        Episode(prompt=part.prompt[:-1], queries=part.queries, parts=part.parts)


def test_composed_adapters_are_the_sum_of_their_updates():
    model = byte_model()
    method = get_absorb_method("distill-lora", steps=2, study=dict(n_continuations=1, continuation_tokens=6, window_tokens=8),
                               progress=False, target_modules=("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out"))
    first, second = (method.absorb(model, torch.randint(0, 256, (m,), generator=torch.Generator().manual_seed(m)))
                     for m in (20, 13))
    g = torch.Generator().manual_seed(5)
    for adapted in (first, second):  # large float64 factors: the check cannot pass by float32 accident
        with torch.no_grad():
            for name, (a, b) in adapted.lora_factors().items():
                delta_before = adapted.spec.scaling * b @ a
                a.copy_(torch.randn(a.shape, generator=g, dtype=torch.float64) * 0.3)
                b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float64) * 0.3)
                adapted.base.get_submodule(name).weight += adapted.spec.scaling * b @ a - delta_before
    both = compose_loras(first, second)
    reference = byte_model()
    with torch.no_grad():
        for name in first.spec.modules:
            for adapted in (first, second):
                a, b = adapted.lora_factors()[name]
                reference.get_submodule(name).weight += adapted.spec.scaling * b @ a
        a, b = both.lora_factors()[name]
        assert a.shape[0] == first.spec.rank + second.spec.rank and both.spec.scaling == first.spec.scaling
        query = torch.randint(0, 256, (2, 9), generator=g)
        assert both.offset == 33
        assert rel_error(both(query), reference(query, position_offset=33)) < 1e-12
        for name in first.spec.modules:  # the stacked factors export the same update
            a, b = both.lora_factors()[name]
            expected = sum(x.spec.scaling * x.lora_factors()[name][1] @ x.lora_factors()[name][0] for x in (first, second))
            assert rel_error(both.spec.scaling * b @ a, expected) < 1e-12
    with pytest.raises(ValueError, match="at least two"):
        compose_loras(first)
    unmerged = get_absorb_method("distill-lora", steps=0, merge=False, progress=False).absorb(model, torch.arange(9))
    with pytest.raises(ValueError, match="merged"):
        compose_loras(first, unmerged)


def test_the_harness_adds_a_composed_row_per_composing_method():
    model = byte_model(torch.float32)
    source = get_episode_source("facts", people=2, documents=2)
    episodes = source.episodes(2, seed=0, tokenizer=ByteCodec())
    fast = {"steps": 2, "progress": False, "study.n_continuations": 1, "study.continuation_tokens": 6, "study.window_tokens": 8,
            "study.n_questions": 0}
    rows = compare(model, source, episodes, {"kv-prefix": fast, "distill-lora": fast, "iclca-approx": {}},
                   progress=False, codec=ByteCodec())
    labels = [r["method"] for r in rows]
    assert labels == ["keep-prompt", "drop-prompt", "kv-prefix", "kv-prefix (composed)", "distill-lora",
                      "distill-lora (composed)", "iclca-approx"]
    for row in rows:
        assert ("composition" in row) == row["method"].endswith("(composed)")
    composed = rows[3]
    assert composed["status"] == "ok" and len(composed["composition"]["composed"]) == 2
    assert composed["agreement"]["kl"] is not None  # compared with the model reading both documents
    # the composed prefix keeps a quarter of each document: the sum of the parts' quarters
    assert composed["kept_bytes"] <= rows[2]["kept_bytes"] + 2 * model.config.n_layer * 2 * 2 * 8 * 4
    text = table({"metric": "exact", "rows": rows, "model_description": "tiny", "task": "facts", "episodes": 2,
                  "queries": 12, "mean_prompt_tokens": 1.0, "torch_threads": 1, "tuning": {}, "split": "dev",
                  "episode_seed": 0, "training_questions": None})
    for name in ("kv-prefix", "distill-lora"):
        assert re.search(rf"{name} \(composed\): document 1 [0-9.]+% composed vs [0-9.]+% alone.*; document 2", text)


def test_distill_lora_compose_steps_train_the_summed_adapter(tmp_path):
    """compose_steps: the summed adapter (rank r1 + r2) trained on both data stages; the merged weights stay the base
    plus scaling B A of the trained factors (float64, 1e-10); it fits both stages better than the plain sum; 0 is
    the plain sum; an adapter loaded from a folder has no data stage: a one-line error."""
    from incontext.absorb.distill import distillation_kl

    model = byte_model()
    options = dict(steps=3, study=dict(n_continuations=1, continuation_tokens=6, window_tokens=8), progress=False, passes=0)
    first, second = (get_absorb_method("distill-lora", **options).absorb(
        model, torch.randint(0, 256, (m,), generator=torch.Generator().manual_seed(m))) for m in (20, 13))
    plain = get_absorb_method("distill-lora", **options).compose([first, second])
    reference = compose_loras(first, second)
    assert all(torch.equal(x, y) for x, y in zip(plain.state_dict().values(), reference.state_dict().values()))
    trained = get_absorb_method("distill-lora", **options, compose_steps=8, learning_rate=1e-2).compose([first, second])
    assert trained.history["compose"]["steps"] == 8 and trained.spec == plain.spec and trained.offset == 33
    rebuilt = byte_model()
    with torch.no_grad():
        for name, (a, b) in trained.lora_factors().items():
            assert not torch.equal(b, plain.lora_factors()[name][1])
            rebuilt.get_submodule(name).weight += trained.spec.scaling * b @ a
        query = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(3))
        assert rel_error(trained(query), rebuilt(query, position_offset=33)) < 1e-10
        sequences = first.sequences + second.sequences
        fit = [sum(float(distillation_kl(c, [item])) for item in sequences) for c in (plain, trained)]
    assert fit[1] < fit[0]
    first.save(tmp_path / "first")
    loaded = type(first).load(tmp_path / "first", model)
    with pytest.raises(ValueError, match="compose_steps trains on each absorb's data stage") as error:
        get_absorb_method("distill-lora", **options, compose_steps=2).compose([loaded, second])
    assert "\n" not in str(error.value)
