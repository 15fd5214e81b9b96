"""The linearize-smollm2 pieces at toy size: LoRA recovery lowers the KL to the softmax model, and the saved
recovery loads back (LoRA merged) into the same model that exact ICLCA converts."""

import dataclasses
import json
import random

import pytest
import torch
from safetensors.torch import save_file

from conftest import ByteCodec, rel_error
from incontext.absorb import ICLCA
from incontext.experiments.linearize_smollm2 import (
    LinearizeConfig, conversion_pairs, facts_windows, perplexity, play_windows, recover, tuned_conversion_maps,
)
from incontext.interop.linearized import RECOVERY_FILE, is_linearized_folder, load_linearized
from incontext.models import Transformer, TransformerConfig
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.corpora import shakespeare_plays
from incontext.tasks.facts import facts_prompt, make_people
from incontext.tasks.text import ShakespeareConfig, split_plays
from incontext.train.attention_transfer import (
    TransferConfig, capture_queries_keys, fit_feature_maps, linearize, load_feature_maps, model_scale,
)


def test_recovery_lowers_the_kl_and_loads_back_merged(tmp_path):
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=53, n_layer=2, d_model=32, n_head=4, n_kv_head=2, positions="rope",
                               norm="rmsnorm", mlp="swiglu", bias=False)
    teacher = Transformer(config).eval().requires_grad_(False)
    with torch.no_grad():
        for block in teacher.blocks:
            block.attn.qkv.weight.mul_(4.0)
    windows = torch.randint(0, 53, (16, 24), generator=torch.Generator().manual_seed(1))
    maps = fit_feature_maps(capture_queries_keys(teacher, windows), TransferConfig(n_features=8, steps=20, lr=0.02),
                            scale=model_scale(teacher), folder=tmp_path / "feature_maps", progress=False)
    student = linearize(teacher, maps)
    settings = LinearizeConfig(recovery_steps=40, recovery_batch=8, lora_rank=4, lora_lr=1e-2)
    losses = recover(teacher, student, windows, settings, progress=False)
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
    save_file({n: p.detach().contiguous() for n, p in student.named_parameters() if p.requires_grad},
              str(tmp_path / RECOVERY_FILE))
    (tmp_path / "results.json").write_text(json.dumps({"config": {"lora_rank": 4}}))
    assert is_linearized_folder(tmp_path)
    loaded = load_linearized(tmp_path, teacher)
    x = windows[:3]
    with torch.no_grad():
        assert rel_error(loaded(x), student(x)) < 1e-5  # merged W + (alpha/r) B A vs peft's unmerged layers
    prompt, query = windows[3:5, :15], windows[3:5, 15:]
    loaded = loaded.double()
    prompted = loaded(torch.cat([prompt, query], 1))[:, 15:]
    assert rel_error(ICLCA().absorb(loaded, prompt)(query), prompted) < 1e-10
    assert perplexity(teacher, windows[:4]) > 1.0


def test_facts_map_windows_hold_the_passage_then_its_questions_with_answers():
    codec = ByteCodec()
    windows, prompts = facts_windows(codec, 3, 600, "maps-facts-0")
    assert windows.shape == (3, 600) and torch.equal(windows, facts_windows(codec, 3, 600, "maps-facts-0")[0])
    rng = random.Random("maps-facts-0-1")
    people = make_people(2, rng)
    text, pairs, _ = facts_prompt(people, rng)
    person, attribute = pairs[0]
    question, answer = person.question(attribute)
    assert codec.decode(windows[1].tolist()).startswith(text + question + answer + "\n\n") and prompts[1] == len(text)
    # own seeds: no window is an evaluation or validation episode's passage
    source = get_episode_source("facts", people=2)
    evaluation = {codec.decode(e.prompt.tolist()) for seed in (0, 10_000) for e in source.episodes(20, seed, tokenizer=codec)}
    assert not any(codec.decode(w.tolist()).startswith(tuple(evaluation)) for w in windows)
    with pytest.raises(ValueError, match="fewer than window_tokens"):
        facts_windows(codec, 1, 10_000, "maps-facts-0")


def test_map_data_is_checked():
    with pytest.raises(ValueError, match="map_data"):
        LinearizeConfig(map_data="facts")
    with pytest.raises(ValueError, match="facts_split=prompt needs map_data=plays\\+facts"):
        LinearizeConfig(facts_split="prompt")
    with pytest.raises(ValueError, match="facts_split"):
        LinearizeConfig(map_data="plays+facts", facts_split="end")


def tiny_byte_llama():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=256, n_layer=2, d_model=32, n_head=4, n_kv_head=2, positions="rope",
                               norm="rmsnorm", mlp="swiglu", bias=False)
    return Transformer(config).eval().requires_grad_(False)


def test_conversion_pairs_are_passages_then_questions_and_play_windows_from_own_seeds():
    codec = ByteCodec()
    config = LinearizeConfig(map_data="plays+facts", window_tokens=600, conversion_windows=8, conversion_prompt=300)
    names = split_plays(ShakespeareConfig(), shakespeare_plays())[0]
    pairs = conversion_pairs(codec, names, config)
    assert len(pairs) == 8 and all(len(p) + len(q) == 600 for p, q in pairs)
    rng = random.Random("conversion-facts-0-2")
    people = make_people(2, rng)
    text, pairs_asked, _ = facts_prompt(people, rng)
    question, _ = pairs_asked[0][0].question(pairs_asked[0][1])
    assert codec.decode(pairs[2][0].tolist()) == text and codec.decode(pairs[2][1].tolist()).startswith(question)
    assert all(len(p) == 300 for p, _ in pairs[6:])  # 3/4 facts, then play windows split after conversion_prompt
    source = get_episode_source("facts", people=2)
    evaluation = {codec.decode(e.prompt.tolist()) for seed in (0, 10_000) for e in source.episodes(20, seed, tokenizer=codec)}
    assert not evaluation & {codec.decode(p.tolist()) for p, _ in pairs[:6]}
    assert len(conversion_pairs(codec, names, LinearizeConfig(window_tokens=600, conversion_windows=4,
                                                              conversion_prompt=300))[0][0]) == 300  # plays only
    with pytest.raises(ValueError, match="conversion_steps must be an integer >= 0"):
        LinearizeConfig(conversion_steps=-1)
    with pytest.raises(ValueError, match="conversion_prompt"):
        LinearizeConfig(window_tokens=64, conversion_prompt=64)


def test_tuned_conversion_maps_are_saved_and_reused_only_when_tuned_alike(tmp_path, monkeypatch):
    import incontext.experiments.linearize_smollm2 as experiment

    codec, model = ByteCodec(), tiny_byte_llama()
    names = split_plays(ShakespeareConfig(), shakespeare_plays())[0]
    windows = play_windows(codec, names, 4, 64, "fit")
    maps = fit_feature_maps(capture_queries_keys(model, windows), TransferConfig(n_features=8, steps=5),
                            scale=model_scale(model), folder=tmp_path / "feature_maps", progress=False)
    config = LinearizeConfig(window_tokens=64, conversion_windows=4, conversion_prompt=40, conversion_steps=3,
                             conversion_batch=2)
    tuned, losses = tuned_conversion_maps(model, maps, codec, names, config, tmp_path / "conversion_maps")
    assert len(losses) == 3 and not torch.equal(tuned[0].weight_q, maps[0].weight_q)  # a copy is tuned
    assert torch.equal(maps[0].weight_q, load_feature_maps(tmp_path / "feature_maps")[0].weight_q)
    monkeypatch.setattr(experiment, "tune_maps_for_conversion", lambda *a, **k: pytest.fail("tuned again"))
    again, losses_again = tuned_conversion_maps(model, maps, codec, names, config, tmp_path / "conversion_maps")
    assert losses_again == losses and torch.equal(again[1].weight_k, tuned[1].weight_k)
    with pytest.raises(ValueError, match="other settings \\(conversion\\)"):
        tuned_conversion_maps(model, maps, codec, names, dataclasses.replace(config, conversion_lr=0.01),
                              tmp_path / "conversion_maps")
