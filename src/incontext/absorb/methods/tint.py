"""TinT as an absorb method (`tint`): the simulator transformer runs a forward, a backward and an SGD step of the
auxiliary model on the prompt inside its own forward pass; the updated weights are read back from its prefixes."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

from ...config import option
from ...models.lm import CausalLM, is_causal_lm
from ..prompt_update import (
    check_separator,
    full_mask,
    training_sequences,
    updated_adapted,
)
from ..protocol import AbsorbMethod, AdaptedModel


class LabelLossGradient:
    """TinT's LM-head gradient restricted to the target tokens: rows t whose next token is not a target are
    zeroed (a token-wise mask; a simulator reads the indicator from an input slot, as it does the training
    segment), so the backward and descent see the gradient of the target tokens only."""

    def __init__(self, inner, targets: torch.Tensor):
        self.inner, self.keep = inner, torch.cat([targets[1:], targets.new_zeros(1)])

    def __call__(self, tokens, x_slot, emb_slot, dst, n_train):
        layout = self.inner.layout
        tokens = self.inner(tokens, x_slot, emb_slot, dst, n_train)
        return layout.write(tokens, dst, layout.slot(tokens, dst) * self.keep[:, None].to(tokens.dtype))


def tint_simulate(model: CausalLM, ids: torch.Tensor, targets: torch.Tensor | None, config):
    """The simulator on one sequence, trained on its target tokens (the training segment ends at the last
    target; None: every token); returns (simulator, logits of its second forward, updated prefixes)."""
    from ...tint import TinT

    sim = TinT(model, config)
    targets = full_mask(ids) if targets is None else targets
    if not bool(targets[1:].any()):
        raise ValueError("no target token to learn from: the loss mask selects nothing after the first token")
    n_train = int(targets.nonzero().max()) + 1
    if not bool(targets[1:n_train].all()):  # label loss: only some tokens of the segment are targets
        sim.lm_gradient = LabelLossGradient(sim.lm_gradient, targets)
    with torch.no_grad():
        logits, banks, _ = sim.simulate(ids, n_train)
    return sim, logits, banks


def tint_update(model: CausalLM, sequences: list[torch.Tensor], targets: list[torch.Tensor | None], config) -> CausalLM:
    """TinT's step on the sequences (one simulator pass each): the updates read back from the prefixes are
    summed (one step of a summed loss) into a copy of the auxiliary model. Several sequences and n_steps > 1:
    n steps of the summed loss, each step summing the sequences' one-step updates from the weights the previous
    step left (a batch whose prefixes all sequences share, as dynamic evaluation's prompt_sgd steps), not n steps
    on each sequence alone added up."""
    if len(sequences) == 1:
        sim, _, banks = tint_simulate(model, sequences[0], targets[0], config)
        return sim.updated_model(model, banks).eval().requires_grad_(False)
    if config.n_steps > 1:
        one_step = dataclasses.replace(config, n_steps=1)
        for _ in range(config.n_steps):
            model = tint_update(model, sequences, targets, one_step)
        return model
    base = model.state_dict()
    total = {name: value.clone() for name, value in base.items()}
    for ids, keep in zip(sequences, targets):
        sim, _, banks = tint_simulate(model, ids, keep, config)
        for name, value in sim.read_weights(banks).items():
            total[name] += value - base[name]
    updated = copy.deepcopy(model)
    updated.load_state_dict(total)
    return updated.eval().requires_grad_(False)


def _tint_options() -> type:
    """TinT's options: the simulator's (TintConfig, with its ranges) and the two that say what the update trains on."""
    from ...tint import TintConfig

    @dataclass
    class TintOptions(TintConfig):
        keep_prompt: bool = option(False, "the prompt also stays in the context of the updated model")
        separator: list[int] | None = option(None, "token ids that split the prompt into training sequences")

    return TintOptions


class TinTStep(AbsorbMethod):
    """TinT's simulated SGD step(s) on the prompt; the auxiliary weights are read back from the prefixes."""

    name = "tint"
    Options = _tint_options()
    needs = "a token-input causal LM that TinT can simulate (our Transformer, or a family that converts to it)"
    summary = "a simulated SGD step on the prompt"

    def setup(self) -> None:
        from ...tint import TintConfig

        check_separator(self.options.separator)
        self.config = TintConfig(**{f.name: getattr(self.options, f.name) for f in dataclasses.fields(TintConfig)})

    needs_internals = True

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model) or not model.config.tokens:
            return "needs a token-input causal LM"
        from ...tint.simulator import check_auxiliary

        try:
            check_auxiliary(model)
        except (ValueError, NotImplementedError) as error:
            return str(error).replace("TinT needs", "needs")
        return None

    def _absorb(self, model, given) -> AdaptedModel:
        prompt, loss_mask, o = given.prompt, given.loss_mask, self.options
        sequences, masks = training_sequences(prompt, loss_mask, o.separator, "TinT")
        return updated_adapted(tint_update(model, sequences, masks, self.config), prompt, o.keep_prompt, o.separator)
