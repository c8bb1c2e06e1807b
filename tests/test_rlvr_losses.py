"""GRPO's --loss-type presets and its RLOO / REINFORCE++ advantages against their formulas, by hand in float64.

The policy is a small randomly initialised Llama (the architecture of SmolLM2) over a character vocabulary. A batch is
sampled, the policy is moved away from the sampling policy (so ratios spread over the clip range), and each formula is
written out completion by completion, token by token, from its paper, on a float64 copy of the model: the loss and its
gradient must equal what the agent's batched float32 update computes and hands to its optimiser.
"""

import copy
import math

import pytest
import torch

from keelrl.agents.grpo import (
    LOSS_TYPES,
    GRPO,
    GRPOConfig,
    apply_loss_type,
    reinforce_pp_advantages,
    rloo_advantages,
    sample_advantages,
    validate,
)
from keelrl.networks.lm_policy import LMPolicy

from helpers import PROMPTS, TOKENIZER

GROUP = 3
MAX_NEW_TOKENS = 5
TEMPERATURE = 0.9


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=len(TOKENIZER), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=32, pad_token_id=TOKENIZER.pad_token_id,
                                      eos_token_id=TOKENIZER.eos_token_id, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config)


def perturb(module: torch.nn.Module, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def sampled(config: GRPOConfig, moved_by: float, reference_moved_by: float = 0.05):
    """A batch of len(PROMPTS) groups of GROUP completions sampled by π_old, then the agent whose policy moved away
    from π_old by `moved_by` (and whose reference, with beta > 0, moved elsewhere)."""
    policy = LMPolicy(tiny_llama(), TOKENIZER, TEMPERATURE)
    torch.manual_seed(1)
    batch = policy.generate([TOKENIZER.encode(p) for p in PROMPTS for _ in range(GROUP)], MAX_NEW_TOKENS)
    agent = GRPO(policy, config)
    agent.freeze_reference()
    if agent.reference is not None:
        perturb(agent.reference, reference_moved_by, seed=2)
    perturb(agent.policy, moved_by, seed=3)
    return batch, agent


def row_log_probs(model: torch.nn.Module, batch, row: int) -> torch.Tensor:
    """(T_i,) log π of completion `row`'s tokens, the prompt and completion fed alone (no padding anywhere)."""
    prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
    length = int(batch.mask[row].sum())
    completion = batch.tokens[row, :length]
    logits = model(input_ids=torch.cat([prompt, completion]).unsqueeze(0)).logits[0]
    logits = logits[len(prompt) - 1: len(prompt) - 1 + length, : len(TOKENIZER)]
    return torch.log_softmax(logits / TEMPERATURE, -1).gather(1, completion.unsqueeze(1)).squeeze(1)


def rewards_of_mixed_groups() -> torch.Tensor:
    return torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])  # 4 groups of 3, all mixed


def group_advantages_by_hand(rewards: list[float], scale_std: bool, eps: float) -> list[float]:
    out = []
    for start in range(0, len(rewards), GROUP):
        group = rewards[start: start + GROUP]
        mean = sum(group) / GROUP
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (GROUP - 1))  # unbiased
        out += [(r - mean) / (std + eps) if scale_std else r - mean for r in group]
    return out


def preset_loss_by_hand(loss_type: str, model, batch, advantages: list[float]) -> torch.Tensor:
    """The policy-gradient loss of each preset as its paper writes it (β = 0, no entropy bonus)."""
    eps_low, eps_high = LOSS_TYPES[loss_type]["clip_low"], LOSS_TYPES[loss_type]["clip_high"]
    per_completion, token_sums, token_count = [], [], 0
    for row, a in enumerate(advantages):
        log_ratio = row_log_probs(model, batch, row) - batch.log_probs[row, : int(batch.mask[row].sum())].double()
        if loss_type == "gspo":  # s_i = (π(o_i) / π_old(o_i))^(1/|o_i|), one ratio for the completion
            s = torch.exp(log_ratio.mean())
            per_completion.append(-torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a))
            continue
        ratio = torch.exp(log_ratio)
        terms = -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
        per_completion.append(terms.mean())  # GRPO: 1/|o_i| Σ_t
        token_sums.append(terms.sum())
        token_count += len(terms)
    if loss_type in ("grpo", "gspo"):  # 1/G Σ_i (of each completion's mean)
        return torch.stack(per_completion).mean()
    if loss_type == "dr_grpo":  # Σ_i Σ_t / (completions × max_new_tokens)
        return torch.stack(token_sums).sum() / (len(advantages) * MAX_NEW_TOKENS)
    return torch.stack(token_sums).sum() / token_count  # dapo, bnpo: 1/Σ|o_i| Σ_i Σ_t


def recorded_update(agent: GRPO, batch, advantages: torch.Tensor):
    """The agent's update; returns its losses and the gradient it handed its optimiser (name -> float64)."""
    recorded = {}
    step = agent.optimizer.step

    def recording_step(*args, **kwargs):
        recorded.update({name: p.grad.detach().clone().double() for name, p in agent.policy.model.named_parameters()})
        return step(*args, **kwargs)

    agent.optimizer.step = recording_step
    return agent.update(batch, advantages), recorded


def test_presets_set_the_options_their_papers_and_trl_name():
    expected = {
        "grpo": ("sequence-mean", True, 0.2, 0.2, "token", False),
        "dr_grpo": ("constant", False, 0.2, 0.2, "token", False),
        "dapo": ("token-mean", True, 0.2, 0.28, "token", True),
        "bnpo": ("token-mean", True, 0.2, 0.2, "token", False),
        "gspo": ("sequence-mean", True, 3e-4, 4e-4, "sequence", False),
    }
    for loss_type, values in expected.items():
        config = apply_loss_type(GRPOConfig(loss_type=loss_type))
        assert (config.loss_aggregation, config.scale_std, config.clip_low, config.clip_high, config.importance_level,
                config.filter_zero_std) == values, loss_type
    assert apply_loss_type(GRPOConfig(loss_type="dapo")).beta == 0.0  # DAPO drops the KL term
    assert apply_loss_type(GRPOConfig(loss_type="grpo", beta=0.04)).beta == 0.04  # the others leave β alone
    assert GRPO(LMPolicy(tiny_llama(), TOKENIZER), GRPOConfig(loss_type="gspo")).config.importance_level == "sequence"
    with pytest.raises(ValueError, match="--loss-type dapo sets --clip-high 0.28, but --clip-high 0.3 was also given"):
        apply_loss_type(GRPOConfig(loss_type="dapo", clip_high=0.3))
    with pytest.raises(ValueError, match="--loss-type must be one of"):
        apply_loss_type(GRPOConfig(loss_type="ppo"))


@pytest.mark.parametrize("loss_type,moved_by", [("grpo", 0.05), ("dr_grpo", 0.05), ("dapo", 0.05), ("bnpo", 0.05),
                                                ("gspo", 2e-3)])
def test_each_loss_type_equals_its_formula(loss_type, moved_by):
    config = GRPOConfig(loss_type=loss_type, beta=0.0, ent_coef=0.0, max_new_tokens=MAX_NEW_TOKENS,
                        group_size=GROUP, update_epochs=1, num_minibatches=1, max_grad_norm=1e6, std_eps=1e-4)
    batch, agent = sampled(config, moved_by)
    rewards = rewards_of_mixed_groups()
    advantages = group_advantages_by_hand(rewards.tolist(), agent.config.scale_std, 1e-4)
    model = copy.deepcopy(agent.policy.model).double()
    loss = preset_loss_by_hand(loss_type, model, batch, advantages)
    loss.backward()
    losses, gradient = recorded_update(agent, batch, agent.advantages(batch, rewards))
    assert 0.05 < losses["losses/clip_fraction"] < 0.95  # the clip range binds on some tokens, not on all
    assert losses["losses/policy_loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
    largest = max(p.grad.abs().max().item() for p in model.parameters())
    assert largest > 0
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(gradient[name], parameter.grad, rtol=1e-3, atol=1e-4 * largest, msg=name)


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean", "constant"])
def test_micro_batches_accumulate_the_gradient_and_losses_of_the_whole_minibatch(aggregation):
    # 12 completions in micro-batches of 5, 5 and 2 (uneven, with a KL term) against one pass over all 12
    runs = {}
    for micro_batch_size in (0, 5):
        config = GRPOConfig(loss_aggregation=aggregation, beta=0.1, ent_coef=0.01, max_new_tokens=MAX_NEW_TOKENS,
                            group_size=GROUP, update_epochs=1, num_minibatches=1, max_grad_norm=1e6,
                            micro_batch_size=micro_batch_size)
        batch, agent = sampled(config, moved_by=0.05)
        runs[micro_batch_size] = recorded_update(agent, batch, agent.advantages(batch, rewards_of_mixed_groups()))
    (whole_losses, whole_gradient), (micro_losses, micro_gradient) = runs[0], runs[5]
    assert whole_losses.keys() == micro_losses.keys() >= {"losses/kl", "losses/clip_fraction", "losses/grad_norm"}
    for name, value in whole_losses.items():
        assert micro_losses[name] == pytest.approx(value, rel=1e-4, abs=1e-7), name
    largest = max(g.abs().max().item() for g in whole_gradient.values())
    for name, gradient in whole_gradient.items():
        torch.testing.assert_close(micro_gradient[name], gradient, rtol=1e-3, atol=1e-5 * largest, msg=name)


def test_micro_batches_refuse_a_minibatch_wide_entropy_threshold():
    with pytest.raises(ValueError, match="--top-entropy-fraction takes its entropy threshold over a whole minibatch"):
        validate(GRPOConfig(micro_batch_size=4, top_entropy_fraction=0.2))
    with pytest.raises(ValueError, match="--micro-batch-size must be 0"):
        validate(GRPOConfig(micro_batch_size=-1))


def test_rloo_advantage_is_the_reward_minus_the_mean_of_the_other_rewards_of_its_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    group = 4
    by_hand = []
    for i, r in enumerate(rewards.tolist()):
        start = i // group * group
        others = [rewards[j].item() for j in range(start, start + group) if j != i]
        by_hand.append(r - sum(others) / (group - 1))
    torch.testing.assert_close(rloo_advantages(rewards, group), torch.tensor(by_hand, dtype=torch.float64))
    torch.testing.assert_close(sample_advantages(rewards, group, "rloo"), torch.tensor(by_hand, dtype=torch.float64))
    assert by_hand[0] == pytest.approx(1 - 0.5 / 3) and by_hand[8:] == [0.0] * 4
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(rewards, 1)


def reinforce_pp_by_hand(rewards: list[float], lengths: list[int], kl: list[list[float]], beta: float):
    """Per-token reward −β·kl_t plus r at the last token; returns summed from t to the end; then (A − mean) / sqrt(var
    + 1e-8) over every token of the batch (population variance)."""
    returns = []
    for r, length, row_kl in zip(rewards, lengths, kl):
        token_rewards = [-beta * row_kl[t] for t in range(length)]
        token_rewards[-1] += r
        returns.append([sum(token_rewards[t:]) for t in range(length)])
    flat = [a for row in returns for a in row]
    mean = sum(flat) / len(flat)
    var = sum((a - mean) ** 2 for a in flat) / len(flat)
    return [[(a - mean) / math.sqrt(var + 1e-8) for a in row] for row in returns]


def test_reinforce_pp_advantages_fold_the_kl_into_per_token_returns_normalised_over_the_batch():
    config = GRPOConfig(sample_weighting="reinforce++", beta=0.1, ent_coef=0.0, max_new_tokens=MAX_NEW_TOKENS,
                        group_size=GROUP, update_epochs=1, num_minibatches=1, max_grad_norm=1e6)
    batch, agent = sampled(config, moved_by=0.05, reference_moved_by=0.2)
    rewards = rewards_of_mixed_groups()
    lengths = batch.mask.sum(1).tolist()
    reference = copy.deepcopy(agent.reference.model).double()
    with torch.no_grad():  # k1: log π_old − log π_ref of each sampled token
        kl = [(batch.log_probs[row, :n].double() - row_log_probs(reference, batch, row)).tolist()
              for row, n in enumerate(lengths)]
    expected = reinforce_pp_by_hand(rewards.tolist(), lengths, kl, beta=0.1)
    advantages = agent.advantages(batch, rewards)
    assert advantages.shape == batch.tokens.shape
    for row, n in enumerate(lengths):
        torch.testing.assert_close(advantages[row, :n].double(), torch.tensor(expected[row], dtype=torch.float64),
                                   rtol=1e-4, atol=1e-5)
        assert (advantages[row, n:] == 0).all()
    assert max(max(abs(k) for k in row) for row in kl) > 1e-2  # the KL term is not negligible here
    # without a reference (β = 0) the return of every token of a completion is its reward
    plain = reinforce_pp_advantages(rewards, batch.mask, torch.zeros_like(batch.log_probs), beta=0.0)
    flat = [r for r, n in zip(rewards.tolist(), lengths) for _ in range(n)]
    mean, std = sum(flat) / len(flat), math.sqrt(sum((r - sum(flat) / len(flat)) ** 2 for r in flat) / len(flat))
    torch.testing.assert_close(plain[0, : lengths[0]], torch.full((lengths[0],), (1.0 - mean) / std), rtol=1e-5,
                               atol=1e-6)

    # the update: token-mean of −min(ρ_t A_t, clip(ρ_t) A_t), and no k3 term (the KL is in the reward)
    model = copy.deepcopy(agent.policy.model).double()
    terms = []
    for row, n in enumerate(lengths):
        ratio = torch.exp(row_log_probs(model, batch, row) - batch.log_probs[row, :n].double())
        a = torch.tensor(expected[row], dtype=torch.float64)
        terms.append(-torch.minimum(ratio * a, ratio.clamp(1 - 0.2, 1 + 0.28) * a))
    loss = torch.cat(terms).mean()
    loss.backward()
    losses, gradient = recorded_update(agent, batch, advantages)
    assert "losses/kl" not in losses
    assert losses["losses/policy_loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
    largest = max(p.grad.abs().max().item() for p in model.parameters())
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(gradient[name], parameter.grad, rtol=1e-3, atol=1e-4 * largest, msg=name)
