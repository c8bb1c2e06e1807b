"""GRPO's update against an independent oracle.

The oracle recomputes each completion's token log-probs from scratch, one completion at a time, with a float64
copy of the Hugging Face model (prompt + completion as one unpadded sequence, the model's own position ids),
writes the loss from the definitions in the paper (DeepSeekMath's clipped objective with asymmetric clipping,
the k3 KL estimator, an entropy bonus, each aggregated over every completion token), takes its gradient by
autograd, clips its norm and makes AdamW's first step by hand. The agent's update (KV-cache-free batched
recomputation over left-padded rows, its aggregation and its optimiser) must give the same losses, the same
clipped gradient and the same new weights.
"""

import copy
import math

import pytest
import torch

from keelrl.agents.grpo import GRPO, GRPOConfig
from keelrl.networks.char_lm import CharTokenizer, tiny_gpt2
from keelrl.networks.lm_policy import LMPolicy

TOKENIZER = CharTokenizer()
PROMPTS = ["3+5=", "12+7-4=", "9=", "sort 3,1=", "4+4=", "1-1="]  # different lengths: left padding is exercised
MAX_NEW_TOKENS = 5
TEMPERATURE = 0.8


def perturb(module: torch.nn.Module, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def sampled_batch_and_agent(config: GRPOConfig):
    """A batch sampled by π_old, then an agent whose policy π has moved away from π_old (so ratios spread over
    the clip range) and whose KL reference π_ref differs from both."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    policy = LMPolicy(tiny_gpt2(TOKENIZER, context_length=24, n_embd=32, n_head=2), TOKENIZER, TEMPERATURE)
    prompts = [TOKENIZER.encode(p) for p in PROMPTS] * 2
    torch.manual_seed(1)
    batch = policy.generate(prompts, max_new_tokens=MAX_NEW_TOKENS)
    agent = GRPO(policy, config)
    agent.freeze_reference()
    perturb(agent.reference, 0.05, seed=2)
    perturb(agent.policy, 0.05, seed=3)
    return batch, agent


def token_terms_by_hand(model: torch.nn.Module, batch, row: int):
    """One completion, alone: (T_i,) log π(token) and entropies under softmax(logits[:V] / temperature)."""
    prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
    length = int(batch.mask[row].sum())
    completion = batch.tokens[row, :length]
    sequence = torch.cat([prompt, completion]).unsqueeze(0)  # (1, Lp_i + T_i), no padding anywhere
    logits = model(input_ids=sequence).logits[0, len(prompt) - 1: len(prompt) - 1 + length, : len(TOKENIZER)]
    log_p = torch.log_softmax(logits / TEMPERATURE, dim=-1)  # (T_i, V): row t predicts completion token t
    return log_p.gather(1, completion.unsqueeze(1)).squeeze(1), -(log_p.exp() * log_p).sum(-1)


def aggregate_by_hand(per_row: list[torch.Tensor], mode: str) -> torch.Tensor:
    if mode == "token-mean":
        return torch.cat(per_row).sum() / sum(len(values) for values in per_row)
    if mode == "sequence-mean":
        return torch.stack([values.mean() for values in per_row]).mean()
    return torch.cat(per_row).sum() / (len(per_row) * MAX_NEW_TOKENS)  # Dr. GRPO's constant


def oracle(agent: GRPO, batch, advantages: torch.Tensor, config: GRPOConfig):
    """Losses, the clipped float64 gradient (name -> tensor) and the pre-clip gradient norm of one update."""
    model = copy.deepcopy(agent.policy.model).double()
    reference = copy.deepcopy(agent.reference.model).double()
    pg, kl, entropy, clipped = [], [], [], []
    for row in range(len(advantages)):
        log_p, row_entropy = token_terms_by_hand(model, batch, row)
        with torch.no_grad():
            ref_log_p, _ = token_terms_by_hand(reference, batch, row)
        old_log_p = batch.log_probs[row, : len(log_p)].double()
        ratio = torch.exp(log_p - old_log_p)
        a = advantages[row].double()
        bounded = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
        pg.append(-torch.minimum(ratio * a, bounded * a))
        clipped.append((bounded * a < ratio * a).double())
        d = ref_log_p - log_p  # k3 = π_ref/π − log(π_ref/π) − 1
        kl.append(torch.exp(d) - d - 1)
        entropy.append(row_entropy)
    mode = config.loss_aggregation
    policy_loss, kl_mean, entropy_mean = (aggregate_by_hand(v, mode) for v in (pg, kl, entropy))
    loss = policy_loss + config.beta * kl_mean - config.ent_coef * entropy_mean
    loss.backward()
    gradient = {name: p.grad for name, p in model.named_parameters()}
    norm = torch.sqrt(sum((g**2).sum() for g in gradient.values()))
    scale = min(1.0, config.max_grad_norm / (norm.item() + 1e-6))
    losses = {"losses/policy_loss": policy_loss.item(), "losses/kl": kl_mean.item(),
              "losses/entropy": entropy_mean.item(), "losses/grad_norm": norm.item(),
              "losses/clip_fraction": torch.cat(clipped).mean().item()}
    return losses, {name: g * scale for name, g in gradient.items()}, norm.item()


@pytest.mark.parametrize("mode,max_grad_norm", [("token-mean", 1e6), ("sequence-mean", 1e-2), ("constant", 1e6)])
def test_grpo_update_equals_the_oracle(mode, max_grad_norm):
    config = GRPOConfig(loss_aggregation=mode, max_new_tokens=MAX_NEW_TOKENS, update_epochs=1, num_minibatches=1,
                        learning_rate=1e-3, weight_decay=0.1, beta=0.04, ent_coef=0.02, clip_low=0.2, clip_high=0.28,
                        max_grad_norm=max_grad_norm)
    batch, agent = sampled_batch_and_agent(config)
    advantages = torch.linspace(-1.5, 1.5, len(batch.tokens))
    expected_losses, expected_gradient, norm = oracle(agent, batch, advantages, config)
    assert 0.05 < expected_losses["losses/clip_fraction"] < 0.95  # the clip is active on some tokens, not all
    assert (norm > max_grad_norm) == (max_grad_norm < 1.0)  # one case clips the gradient, the others do not

    before = {name: p.detach().clone().double() for name, p in agent.policy.model.named_parameters()}
    recorded = {}
    step = agent.optimizer.step

    def recording_step(*args, **kwargs):  # the gradient the optimiser is given, after clipping
        recorded.update({name: p.grad.detach().clone().double() for name, p in agent.policy.model.named_parameters()})
        return step(*args, **kwargs)

    agent.optimizer.step = recording_step
    losses = agent.update(batch, advantages)

    for name, value in expected_losses.items():  # float32 batched passes against float64 single rows
        assert losses[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    largest = max(g.abs().max().item() for g in expected_gradient.values())
    for name, gradient in expected_gradient.items():
        torch.testing.assert_close(recorded[name], gradient, rtol=1e-3, atol=1e-4 * largest, msg=name)
    # AdamW's first step (β 0.9/0.999, ε 1e-8, bias-corrected): θ ← θ(1 − lr·wd) − lr · g / (|g| + ε)
    for name, parameter in agent.policy.model.named_parameters():
        g = recorded[name]
        m_hat, v_hat = (0.1 * g) / (1 - 0.9), (0.001 * g**2) / (1 - 0.999)
        by_hand = before[name] * (1 - 1e-3 * 0.1) - 1e-3 * m_hat / (v_hat.sqrt() + 1e-8)
        torch.testing.assert_close(parameter.detach().double(), by_hand, rtol=1e-6, atol=1e-7, msg=name)
    assert not math.isclose(losses["losses/kl"], 0.0, abs_tol=1e-6)  # the reference differs from the policy
