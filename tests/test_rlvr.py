"""RLVR: KV-cache decoding against full recomputation, the GRPO objective on hand-made groups, training, bad input."""

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from keelrl.agents import grpo as grpo_module
from keelrl.agents.harness.checkpoints import read_checkpoint
from keelrl.agents.harness.options import run_cli
from keelrl.agents.grpo import (
    GRPO,
    GRPOConfig,
    aggregate,
    clipped_policy_loss,
    collect,
    forking_mask,
    group_advantages,
    heldout_metrics,
    informative_groups,
    k3_kl,
    rollout,
    sample_advantages,
    train,
)
from keelrl.envs.rlvr_tasks import Arithmetic, Problem, make_task
from keelrl.envs.token_env import GroupTokenEnv, TokenEnv
from keelrl.networks.char_lm import DEFAULT_VOCAB, CharTokenizer, tiny_gpt2
from keelrl.networks.lm_policy import LMPolicy, cat_completions, left_pad, load_pretrained, positions_of

from helpers import PROMPTS, TOKENIZER


def make_policy(temperature: float = 1.0, seed: int = 0, context_length: int = 24) -> LMPolicy:
    pytest.importorskip("transformers")
    torch.manual_seed(seed)
    return LMPolicy(tiny_gpt2(TOKENIZER, context_length=context_length, n_embd=32, n_head=2), TOKENIZER, temperature)


def tiny_config(tmp_path, **overrides) -> GRPOConfig:
    settings = dict(n_embd=32, n_head=2, context_length=16, max_new_tokens=4, num_prompts=4, group_size=4,
                    iterations=4, warmup_steps=5, warmup_batch_size=16, eval_freq=2, eval_episodes=8, eval_samples=4,
                    pass_k=2, checkpoint_freq=2, runs_dir=str(tmp_path), quiet=True)
    return GRPOConfig(**{**settings, **overrides})


# ---- the policy adapter ----

def sample_by_full_recomputation(policy: LMPolicy, prompts: list[list[int]], steps: int):
    """Reference decoding: the whole sequence goes through the model again for every token."""
    ids, mask = left_pad(prompts, policy.pad_token_id, policy.device)
    tokens, log_probs = [], []
    for _ in range(steps):
        logits = policy.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions_of(mask)).logits[:, -1]
        step_log_probs = policy.log_softmax(logits)
        token = torch.multinomial(step_log_probs.exp(), 1).squeeze(1)
        tokens.append(token)
        log_probs.append(step_log_probs.gather(1, token.unsqueeze(1)).squeeze(1))
        ids = torch.cat([ids, token.unsqueeze(1)], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(tokens, 1), torch.stack(log_probs, 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kv_cache_decoding_gives_the_tokens_and_log_probs_of_full_recomputation(temperature):
    policy = make_policy(temperature)
    prompts = [TOKENIZER.encode(p) for p in PROMPTS]
    steps = 10
    torch.manual_seed(1)
    decoder = policy.decoder(prompts)
    for _ in range(steps):
        decoder.sample()
    cached = decoder.completions(torch.full((len(prompts),), steps))
    torch.manual_seed(1)
    tokens, log_probs = sample_by_full_recomputation(policy, prompts, steps)
    assert torch.equal(cached.tokens, tokens)
    torch.testing.assert_close(cached.log_probs, log_probs, atol=1e-5, rtol=0)
    # the training forward pass (one pass over prompt + completion, with gradients) agrees too
    recomputed, entropy = policy.token_log_probs(cached)
    torch.testing.assert_close(recomputed, cached.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, cached.entropy, atol=1e-5, rtol=0)
    assert recomputed.requires_grad
    # a padded row sees exactly what it sees alone
    alone = policy.decoder(prompts[2:3])
    alone.sample()
    torch.testing.assert_close(alone.completions(torch.ones(1)).entropy[0, 0], cached.entropy[2, 0], atol=1e-5, rtol=0)


def test_generate_ends_each_row_at_its_first_eos():
    policy = make_policy()
    torch.manual_seed(3)
    completions = policy.generate([TOKENIZER.encode("1+1=")] * 32, max_new_tokens=20)
    eos = completions.tokens == TOKENIZER.eos_token_id
    assert eos.any()  # a random 52-token policy ends some rows within 20 tokens
    for row in range(32):
        length = int(completions.mask[row].sum())
        assert completions.mask[row, :length].all()
        hits = eos[row].nonzero()
        assert length == (int(hits[0]) + 1 if len(hits) else 20)
        assert (completions.tokens[row, length:] == TOKENIZER.pad_token_id).all()
        assert (completions.log_probs[row, length:] == 0).all()


def test_frozen_copy_is_independent_and_untrainable():
    policy = make_policy()
    reference = policy.frozen_copy()
    assert not any(p.requires_grad for p in reference.parameters())
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    assert not torch.equal(next(policy.parameters()), next(reference.parameters()))


def test_cat_completions_repads_prompts_left_and_completions_right():
    policy = make_policy()
    short = policy.generate([TOKENIZER.encode("9=")], 3)
    long = policy.generate([TOKENIZER.encode("12+7-4=")], 5)
    both = cat_completions([short, long], policy.pad_token_id)
    assert both.prompt_ids.shape == (2, 7) and both.tokens.shape[0] == 2
    torch.testing.assert_close(policy.token_log_probs(both)[0][both.mask],
                               torch.cat([short.log_probs[short.mask], long.log_probs[long.mask]]), atol=1e-5, rtol=0)


LONG_AND_SHORT = [Problem("sort 1,2,3=", "1,2,3", (1, 2, 3)), Problem("9=", "9", (9,), 9)]  # 11 and 2 tokens


def test_rollout_holds_the_positions_of_rows_the_env_has_cut_at_its_context():
    # issue 14 item 3: a 12-position model, prompts of 11 and 2 tokens, 6 new tokens; the env ends the long rows
    # after 1 token (the context is full) while the short rows go on: the ended rows must stay in the table
    policy = make_policy(context_length=12)
    env = GroupTokenEnv(make_task("sort", 3), TOKENIZER, num_prompts=2, group_size=2, max_new_tokens=6,
                        context_length=12)
    torch.manual_seed(0)
    completions, _, _ = rollout(policy, env, LONG_AND_SHORT)
    lengths = completions.mask.sum(1).tolist()
    assert lengths[:2] == [1, 1]  # 11 prompt tokens + 1 fill the context
    for row in (2, 3):  # the short rows end at their first EOS or after 6 tokens
        hits = (completions.tokens[row] == TOKENIZER.eos_token_id).nonzero()
        assert lengths[row] == (int(hits[0]) + 1 if len(hits) else 6)
    assert max(lengths[2:]) > 1  # the short rows were decoded past the step where the long ones ended
    # what the KV-cache decoder sampled is what one full forward pass over prompt + completion gives
    recomputed, entropy = policy.token_log_probs(completions)
    torch.testing.assert_close(recomputed[completions.mask], completions.log_probs[completions.mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[completions.mask], completions.entropy[completions.mask], atol=1e-5, rtol=0)


def test_generate_refuses_prompts_without_room_for_max_new_tokens_and_decodes_when_they_fit():
    prompts = [TOKENIZER.encode(p.prompt) for p in LONG_AND_SHORT]
    for context_length in (12, 16):  # 11 + 6 = 17 positions needed
        policy = make_policy(context_length=context_length)
        message = f"needs 17 positions, but the model's position table holds {context_length}"
        with pytest.raises(ValueError, match=message):
            policy.generate(prompts, max_new_tokens=6)
    # a decoder not told max_new_tokens refuses (instead of an IndexError) when a running row reaches the limit
    decoder = make_policy(context_length=12).decoder(prompts)
    decoder.sample()
    decoder.sample()  # feeds the long row's first new token at position 11, the last one there is
    with pytest.raises(ValueError, match="needs position id 12, but the model has 12 positions"):
        decoder.sample()
    policy = make_policy(context_length=17)  # exactly enough
    torch.manual_seed(0)
    completions = policy.generate(prompts, max_new_tokens=6)
    assert completions.tokens.shape == (2, 6)
    recomputed, _ = policy.token_log_probs(completions)
    torch.testing.assert_close(recomputed[completions.mask], completions.log_probs[completions.mask], atol=1e-5, rtol=0)


def test_policy_refuses_a_tokenizer_without_eos():
    pytest.importorskip("transformers")
    tokenizer = CharTokenizer()
    tokenizer.eos_token_id = None
    with pytest.raises(ValueError, match="no EOS token"):
        LMPolicy(tiny_gpt2(TOKENIZER, n_embd=32, n_head=2), tokenizer)


def test_transformers_is_imported_only_when_a_model_is_built(monkeypatch):
    code = ("import sys, keelrl.envs, keelrl.networks, keelrl.envs.token_env, keelrl.networks.lm_policy, "
            "keelrl.agents.grpo; assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the llm extra were not installed
    with pytest.raises(ValueError, match=r"pip install 'keelrl\[llm\]'"):
        tiny_gpt2(TOKENIZER)


# ---- the GRPO objective on hand-made groups ----

def test_group_advantages_with_and_without_std_scaling():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    grpo = group_advantages(rewards, 4, scale_std=True, eps=0.0)
    s = 1 / math.sqrt(3)  # unbiased std of (1, 1, 0, 0) is sqrt(1/3); of (1, 0, 0, 0) it is 0.5
    expected = [1.5, -0.5, -0.5, -0.5, 0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s]
    torch.testing.assert_close(grpo[:8], torch.tensor(expected))
    assert torch.isnan(grpo[8:]).all()  # eps 0 on a zero-std group: why eps exists
    assert torch.equal(group_advantages(rewards, 4, eps=1e-4)[8:], torch.zeros(4))
    dr_grpo = group_advantages(rewards, 4, scale_std=False)
    torch.testing.assert_close(dr_grpo, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]))
    assert informative_groups(rewards, 4).tolist() == [True, True, False]
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(torch.ones(3), 1, scale_std=True)
    torch.testing.assert_close(group_advantages(torch.tensor([1.0, 0.0]), 1, scale_std=False), torch.zeros(2))


def test_sample_weightings_on_hand_made_groups():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    assert GRPOConfig().sample_weighting == "grpo" and GRPOConfig().positive_weight == 0.1
    # the default is GRPO: group-relative, every advantage weighted 1 (negatives too)
    s = 1 / math.sqrt(3)
    torch.testing.assert_close(sample_advantages(rewards, 4, eps=0.0)[:8],
                               torch.tensor([1.5, -0.5, -0.5, -0.5, 0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s]))
    torch.testing.assert_close(sample_advantages(rewards, 4, scale_std=False),
                               torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]))
    # Zhu et al. 2025: PSR +1 on correct only, NSR -1 on incorrect only, W-REINFORCE +lambda / -1; no baseline
    torch.testing.assert_close(sample_advantages(rewards, 4, "psr"), rewards)
    torch.testing.assert_close(sample_advantages(rewards, 4, "nsr"),
                               torch.tensor([0.0, -1, -1, -1, 0, 0, -1, -1, 0, 0, 0, 0]))
    torch.testing.assert_close(sample_advantages(rewards, 4, "w-reinforce"),
                               torch.tensor([0.1, -1, -1, -1, 0.1, 0.1, -1, -1, 0.1, 0.1, 0.1, 0.1]))
    torch.testing.assert_close(sample_advantages(rewards, 4, "w-reinforce", positive_weight=0.5)[:4],
                               torch.tensor([0.5, -1, -1, -1]))
    # a reward between 0 and 1 counts as that share correct
    half = torch.tensor([0.5, 0.5])
    torch.testing.assert_close(sample_advantages(half, 1, "psr"), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(sample_advantages(half, 1, "nsr"), torch.tensor([-0.5, -0.5]))
    torch.testing.assert_close(sample_advantages(half, 1, "w-reinforce"), torch.tensor([-0.45, -0.45]))
    with pytest.raises(ValueError, match="sample weighting must be one of"):
        sample_advantages(rewards, 4, "nsr-ish")


@pytest.mark.parametrize("options,weights", [
    ({}, None),  # the defaults: GRPO, (r - mean) / (std + eps), every sample weighted 1
    ({"sample_weighting": "w-reinforce"}, (0.1, -1.0)),
    ({"sample_weighting": "nsr"}, (0.0, -1.0)),
])
def test_training_uses_the_advantages_of_its_sample_weighting(options, weights, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setattr(grpo_module, "make_task", lambda *args, **kwargs: StartsLow())  # mixed groups
    seen_rewards, seen_advantages = [], []
    real_collect, real_update = grpo_module.collect, GRPO.update

    def collect(agent, env):
        batch, rewards, stats = real_collect(agent, env)
        seen_rewards.append(rewards.clone())
        return batch, rewards, stats

    def update(self, batch, advantages):
        seen_advantages.append(advantages.clone())
        return real_update(self, batch, advantages)

    monkeypatch.setattr(grpo_module, "collect", collect)
    monkeypatch.setattr(GRPO, "update", update)
    train(tiny_config(tmp_path, iterations=3, **options))
    assert len(seen_rewards) == len(seen_advantages) == 3
    for rewards, advantages in zip(seen_rewards, seen_advantages):
        if weights is None:
            grouped = rewards.view(-1, 4)
            expected = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
        else:
            expected = torch.where(rewards == 1.0, weights[0], weights[1])
        torch.testing.assert_close(advantages, expected)
    # not vacuous: right and wrong samples, and negative advantages (which the old default halved)
    assert (torch.cat(seen_rewards) == 1).any() and (torch.cat(seen_rewards) == 0).any()
    assert (torch.cat(seen_advantages) < 0).any()


def test_loss_aggregation_modes():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate(values, mask, "token-mean", 3).item() == pytest.approx(7 / 3)
    assert aggregate(values, mask, "sequence-mean", 3).item() == pytest.approx((1.5 + 4.0) / 2)
    assert aggregate(values, mask, "constant", 3).item() == pytest.approx(7 / 6)
    with pytest.raises(ValueError, match="loss aggregation"):
        aggregate(values, mask, "sum", 3)


def test_clipped_objective_and_k3_kl():
    ratio = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]])
    loss, clipped = clipped_policy_loss(ratio, torch.tensor([1.0, -1.0]), clip_low=0.2, clip_high=0.28)
    # A > 0: min(ρ, clip ρ) = (0.5, 1, 1.28); A < 0: −max(ρ, clip ρ) = −(0.8, 1, 1.5)
    torch.testing.assert_close(loss, torch.tensor([[-0.5, -1.0, -1.28], [0.8, 1.0, 1.5]]))
    assert clipped.tolist() == [[False, False, True], [True, False, False]]
    log_probs = torch.log(torch.tensor([0.5, 0.3]))
    kl = k3_kl(log_probs, torch.log(torch.tensor([0.25, 0.3])))
    torch.testing.assert_close(kl, torch.tensor([0.5 - math.log(0.5) - 1, 0.0]))


def test_forking_mask_keeps_the_stated_fraction_of_highest_entropy_tokens():
    entropy = torch.rand(4, 10, generator=torch.Generator().manual_seed(0))
    mask = torch.arange(10) < torch.tensor([10, 7, 3, 5]).unsqueeze(1)  # 25 valid tokens
    for fraction, kept_count in [(0.2, 5), (0.5, 13), (1.0, 25), (0.01, 1)]:
        kept = forking_mask(entropy, mask, fraction)
        assert int(kept.sum()) == kept_count
        assert not (kept & ~mask).any()
        dropped = entropy[mask & ~kept]
        assert dropped.numel() == 0 or entropy[kept].min() >= dropped.max()


def forking_batch(policy: LMPolicy):
    torch.manual_seed(0)
    prompts = [TOKENIZER.encode(p) for p in PROMPTS] * 2
    return policy.generate(prompts, max_new_tokens=5)


@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean", "constant"])
def test_forking_tokens_mask_the_loss_but_the_normaliser_counts_every_completion_token(mode):
    # issue 14 item 4 (TRL: per_token_loss * entropy_mask, then the usual aggregation over completion_mask)
    policy = make_policy()
    batch = forking_batch(policy)
    advantages = torch.linspace(-1.0, 1.5, len(batch.tokens))
    with torch.no_grad():
        _, entropy = policy.token_log_probs(batch)  # the current policy's entropies (the loss pass's)
    valid = entropy[batch.mask]
    kept = (entropy >= torch.quantile(valid, 0.8)) & batch.mask
    assert 0.15 <= kept.sum() / batch.mask.sum() <= 0.25  # about 20% kept
    per_token = -advantages.unsqueeze(1) * kept  # ratio is 1 before the first step: the loss is -A on kept tokens
    lengths = batch.mask.sum(1)
    expected = {"token-mean": per_token.sum() / batch.mask.sum(),  # all completion tokens, not the kept ones
                "sequence-mean": (per_token.sum(1) / lengths).mean(),
                "constant": per_token.sum() / (len(batch.tokens) * 5)}[mode]
    config = GRPOConfig(top_entropy_fraction=0.2, loss_aggregation=mode, max_new_tokens=5, ent_coef=0.0, beta=0.0,
                        update_epochs=1, num_minibatches=1)
    stats = GRPO(policy, config).update(batch, advantages)
    assert stats["losses/policy_loss"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)


def test_forking_threshold_comes_from_the_current_policy_not_the_sampling_entropies():
    policy = make_policy()
    batch = forking_batch(policy)
    advantages = torch.linspace(-1.0, 1.5, len(batch.tokens))
    with torch.no_grad():
        _, entropy = policy.token_log_probs(batch)
    kept = (entropy >= torch.quantile(entropy[batch.mask], 0.8)) & batch.mask
    expected = (-advantages.unsqueeze(1) * kept).sum() / (len(batch.tokens) * 5)
    # stored sampling entropies ranked the other way round must not choose the tokens
    stale = batch._replace(entropy=((10.0 - entropy) * batch.mask))
    config = GRPOConfig(top_entropy_fraction=0.2, loss_aggregation="constant", max_new_tokens=5, ent_coef=0.0,
                        beta=0.0, update_epochs=1, num_minibatches=1)
    stats = GRPO(policy, config).update(stale, advantages)
    assert stats["losses/policy_loss"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)


def test_update_raises_log_probs_of_positive_advantages_and_lowers_negative_ones():
    policy = make_policy()
    agent = GRPO(policy, GRPOConfig(learning_rate=3e-3, ent_coef=0.0, beta=0.04, update_epochs=2, num_minibatches=2))
    agent.freeze_reference()
    torch.manual_seed(0)
    batch = policy.generate([TOKENIZER.encode("3+5=")] * 4 + [TOKENIZER.encode("9+9=")] * 4, max_new_tokens=4)
    advantages = group_advantages(torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 1]), 4)
    before = (batch.log_probs * batch.mask).sum(1)
    stats = agent.update(batch, advantages)
    with torch.no_grad():
        after = (policy.token_log_probs(batch)[0] * batch.mask).sum(1)
    assert ((after - before) * advantages > 0).all()
    assert set(stats) == {"losses/policy_loss", "losses/entropy", "losses/clip_fraction", "losses/grad_norm",
                          "losses/kl"}
    assert 0.0 <= stats["losses/clip_fraction"] <= 1.0 and stats["losses/kl"] >= 0.0
    assert stats["losses/kl"] < 0.05  # the reference started equal to the policy


class AlwaysRight(Arithmetic):
    def verify(self, problem, completion):
        return 1.0


class StartsLow(Arithmetic):
    """Reward 1 when the completion starts with a character below '5' in the vocabulary order."""

    def verify(self, problem, completion):
        return float(bool(completion) and DEFAULT_VOCAB.index(completion[0]) < 5)


def test_dynamic_filtering_keeps_only_groups_whose_rewards_differ(tmp_path):
    config = tiny_config(tmp_path, filter_zero_std=True, max_sample_rounds=3, num_prompts=4, group_size=4)
    agent = GRPO(make_policy(), config)
    env = GroupTokenEnv(AlwaysRight(), TOKENIZER, 4, 4, config.max_new_tokens, config.context_length, seed=0)
    batch, rewards, stats = collect(agent, env)
    assert batch is None and len(rewards) == 0
    assert stats["charts/zero_std_fraction"] == 1.0 and stats["charts/sample_rounds"] == 3
    env = GroupTokenEnv(StartsLow(), TOKENIZER, 4, 4, config.max_new_tokens, config.context_length, seed=0)
    torch.manual_seed(0)
    batch, rewards, stats = collect(agent, env)
    assert batch is not None and len(rewards) == batch.tokens.shape[0] <= 16 and len(rewards) % 4 == 0
    assert informative_groups(rewards, 4).all()


def test_collect_reports_the_mean_and_the_longest_completion_length(tmp_path):
    config = tiny_config(tmp_path, num_prompts=4, group_size=4)
    agent = GRPO(make_policy(), config)
    env = GroupTokenEnv(StartsLow(), TOKENIZER, 4, 4, config.max_new_tokens, config.context_length, seed=0)
    torch.manual_seed(0)
    batch, _, stats = collect(agent, env)
    lengths = batch.mask.sum(1).float()  # (16,) generated tokens per row
    assert lengths.min() < lengths.max()  # rows of different lengths, so max and mean differ
    assert stats["charts/max_length"] == lengths.max().item()
    assert stats["charts/episodic_length"] == pytest.approx(lengths.mean().item())
    assert stats["charts/generated_tokens"] == lengths.sum().item()


# ---- training, evaluation, checkpoints ----

def test_tiny_run_logs_checkpoints_loads_and_is_deterministic(tmp_path):
    pytest.importorskip("transformers")
    result = train(tiny_config(tmp_path / "a"))
    assert result.global_step == 4
    assert [h["iteration"] for h in result.history] == [0, 2, 4]
    assert set(result.metrics) == {"greedy_accuracy", "pass@1", "pass@2"}
    assert all(0.0 <= v <= 1.0 for v in result.metrics.values())
    assert result.metrics["pass@2"] >= result.metrics["pass@1"]
    with open(result.run_dir / "eval.csv") as f:
        assert [int(row["global_step"]) for row in csv.DictReader(f)] == [0, 2, 4]
    assert list(result.run_dir.glob("events.out.tfevents.*"))
    checkpoint = read_checkpoint(result.run_dir / "checkpoint.pt", "grpo")  # weights_only=True
    assert checkpoint["global_step"] == 4 and checkpoint["vocab"] == DEFAULT_VOCAB
    agent = GRPO.load(result.run_dir / "model.pt")
    for name, tensor in agent.policy.state_dict().items():
        assert torch.equal(tensor, checkpoint["agent"]["policy"][name])
    model = torch.load(result.run_dir / "model.pt", weights_only=True)
    model["config"]["device"] = "cuda"  # as trained on a GPU: it loads on the CPU (it failed on CUDA calls)
    torch.save(model, tmp_path / "gpu_model.pt")
    assert GRPO.load(tmp_path / "gpu_model.pt", device="cpu").config.device == "cpu"
    again = train(tiny_config(tmp_path / "b"))
    assert again.history[-1] == {**result.history[-1], "minutes": again.history[-1]["minutes"]}
    assert np.array_equal(again.final_eval_returns, result.final_eval_returns)

    # the classic interface: the agent plays TokenEnv one token at a time
    env = TokenEnv(make_task("add"), agent.policy.tokenizer, max_new_tokens=4, context_length=16)
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(agent.act(obs[None], deterministic=True)[0])
        done = terminated or truncated
    assert reward in (0.0, 1.0) and isinstance(info["completion"], str)


def test_resume_continues_from_the_checkpoint(tmp_path):
    pytest.importorskip("transformers")
    first = train(tiny_config(tmp_path, anneal_lr=False))  # the schedule would change with the iteration budget
    config_file = first.run_dir / "config.json"
    saved = json.loads(config_file.read_text())
    saved["config"]["iterations"] = 6
    config_file.write_text(json.dumps(saved))
    resumed = train(GRPOConfig(resume=str(first.run_dir), quiet=True))
    assert resumed.global_step == 6 and resumed.run_dir == first.run_dir
    assert [h["iteration"] for h in resumed.history] == [0, 2, 4, 6]
    with open(first.run_dir / "eval.csv") as f:
        assert [int(row["global_step"]) for row in csv.DictReader(f)] == [0, 2, 4, 6]
    # random states are restored, so the resumed run ends where an uninterrupted one does
    straight = train(tiny_config(tmp_path / "straight", iterations=6, anneal_lr=False))
    resumed_weights = GRPO.load(resumed.run_dir / "model.pt").policy.state_dict()
    for name, tensor in GRPO.load(straight.run_dir / "model.pt").policy.state_dict().items():
        assert torch.equal(tensor, resumed_weights[name])


def test_warmup_answers_are_cut_to_the_room_rollouts_have(tmp_path):
    # sort of 3: 11 prompt tokens + 4 new tokens fit the 16-token context, a whole answer ('1,2,3' + EOS) does not
    pytest.importorskip("transformers")
    result = train(tiny_config(tmp_path, task="sort", task_size=3, iterations=2))
    # a right answer holds 3 numbers, 5 characters at the least ('1,2,3'); 4 new tokens (one character each) hold
    # at most 2 numbers, so every policy, greedy or sampled, is always wrong: accuracy and pass@k are 0 exactly
    assert result.global_step == 2 and result.metrics == {"greedy_accuracy": 0.0, "pass@1": 0.0, "pass@2": 0.0}


def test_a_run_of_an_earlier_version_is_refused_and_its_model_still_loads(tmp_path):
    # before the run harness, GRPO checkpoints counted "iteration" (and runs could carry negative_weight, an option
    # GRPO no longer has): such a run cannot continue under today's objective, its model.pt still loads
    pytest.importorskip("transformers")
    first = train(tiny_config(tmp_path, iterations=2))
    checkpoint = torch.load(first.run_dir / "checkpoint.pt", weights_only=True)
    checkpoint["iteration"] = checkpoint.pop("global_step")
    torch.save(checkpoint, first.run_dir / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"checkpoint.pt is not a checkpoint of a grpo run \(no global_step\).*"
                                         r"earlier keelrl version"):
        train(GRPOConfig(resume=str(first.run_dir), quiet=True))
    state = torch.load(first.run_dir / "model.pt", weights_only=True)
    state["config"]["negative_weight"] = 0.5
    state["config"]["eval_every"] = 20
    torch.save(state, tmp_path / "old_model.pt")
    assert isinstance(GRPO.load(tmp_path / "old_model.pt"), GRPO)


def test_wall_clock_limit_stops_the_run(tmp_path):
    pytest.importorskip("transformers")
    result = train(tiny_config(tmp_path, iterations=1000, max_minutes=1e-4))
    assert result.global_step == 0 and (result.run_dir / "model.pt").is_file()


def test_heldout_metrics_report_greedy_accuracy_and_pass_at_k():
    pytest.importorskip("transformers")
    task = make_task("add")
    agent = GRPO(make_policy(), GRPOConfig(max_new_tokens=4, context_length=16))
    problems = task.problems("heldout", 6, seed=0)
    metrics = heldout_metrics(agent, AlwaysRight(), problems, samples=4, k=3)
    assert metrics["greedy_accuracy"] == metrics["pass@1"] == metrics["pass@3"] == 1.0
    assert metrics["greedy_rewards"].shape == (6,)
    metrics = heldout_metrics(agent, task, problems, samples=4, k=3)  # an untrained model: (almost) never right
    assert metrics["pass@1"] <= metrics["pass@3"] <= 0.5


def test_eval_split_chooses_the_problems_every_evaluation_reads(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    evaluated = []

    def recording(agent, task, problems, samples, k):
        evaluated.append([problem.prompt for problem in problems])
        return heldout_metrics(agent, task, problems, samples, k)

    monkeypatch.setattr(grpo_module, "heldout_metrics", recording)
    train(tiny_config(tmp_path, iterations=2, eval_split="validation"))
    task = make_task("add")  # tiny_config's task and split fractions
    validation = [problem.prompt for problem in task.problems("validation", 8, seed=0)]
    assert len(evaluated) == 2 and all(prompts == validation for prompts in evaluated)
    assert not set(validation) & {problem.prompt for problem in task.problems("heldout", 1000, seed=0)}


def char_level_hf_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{ch: i + 2 for i, ch in enumerate(DEFAULT_VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def test_a_hugging_face_model_and_tokenizer_from_disk(tmp_path):
    pytest.importorskip("transformers")
    tokenizer = char_level_hf_tokenizer()
    assert tokenizer.decode(tokenizer.encode("17", add_special_tokens=False)) == "1 7"  # spaces inserted
    torch.manual_seed(0)
    model = tiny_gpt2(tokenizer, context_length=16, n_embd=32, n_head=2)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "model")  # as most checkpoints are saved
    tokenizer.save_pretrained(tmp_path / "model")
    loaded, _ = load_pretrained(str(tmp_path / "model"))  # float32 weights: Adam's small steps are not rounded away
    assert {parameter.dtype for parameter in loaded.parameters()} == {torch.float32}
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight.float(), rtol=0, atol=0)
    result = train(tiny_config(tmp_path / "runs", model_path=str(tmp_path / "model"), iterations=2))
    assert result.global_step == 2
    agent = GRPO.load(result.run_dir / "model.pt")
    assert len(agent.policy.tokenizer) == len(tokenizer)
    # a completion decoded with spaces still scores: the verifier normalises
    env = GroupTokenEnv(make_task("add"), agent.policy.tokenizer, 1, 1, 4, 16)
    env.reset(options={"problems": [make_task("add").problems("train", 1, 0)[0]]})
    answer = env.problems[0].solution
    for token in tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]:
        _, reward, *_ = env.step([token])
    assert env.completions[0].replace(" ", "") == answer and reward[0] == 1.0


@pytest.mark.parametrize("args,message", [
    (["--group-size", "1"], "a group of one completion is always 0"),
    (["--group-size", "1", "--no-scale-std"], "a group of one completion is always 0"),  # Dr. GRPO alike
    (["--group-size", "1", "--sample-weighting", "psr", "--filter-zero-std"], "has one reward"),
    (["--loss-aggregation", "sum"], "--loss-aggregation must be one of"),
    (["--pass-k", "9"], "--pass-k 9 needs at least"),
    (["--task", "sort", "--task-size", "8", "--context-length", "12"], "context holds 12"),
    (["--task", "mult"], "unknown RLVR task"),
    (["--model-path", "/nonexistent/model"], "no such directory"),
    (["--top-entropy-fraction", "0"], "--top-entropy-fraction must lie in"),
    (["--task", "sort", "--task-size", "3", "--context-length", "12", "--max-new-tokens", "6"],
     "needs 17 positions, but --context-length holds 12"),
    (["--sample-weighting", "negative"], "--sample-weighting must be one of"),
    (["--positive-weight", "-0.1"], "--positive-weight must be non-negative"),
    (["--eval-split", "train"], "--eval-split must be one of"),
])
def test_bad_input_is_one_clear_line_and_exit_code_2(args, message, tmp_path, capsys):
    pytest.importorskip("transformers")
    assert run_cli(train, GRPOConfig, [*args, "--runs-dir", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # no run directory for a run that never started
