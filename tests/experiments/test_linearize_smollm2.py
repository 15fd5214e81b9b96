"""The linearize-smollm2 pieces at toy size: LoRA recovery lowers the KL to the softmax model, and the saved
recovery loads back (LoRA merged) into the same model that exact ICLCA converts."""

import json
import random

import pytest
import torch
from safetensors.torch import save_file

from conftest import ByteCodec, rel_error
from incontext.absorb import ICLCA
from incontext.experiments.linearize_smollm2 import LinearizeConfig, facts_windows, perplexity, recover
from incontext.interop.linearized import RECOVERY_FILE, is_linearized_folder, load_linearized
from incontext.models import Transformer, TransformerConfig
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.facts import facts_prompt, make_people
from incontext.train.attention_transfer import TransferConfig, capture_queries_keys, fit_feature_maps, linearize, model_scale


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
