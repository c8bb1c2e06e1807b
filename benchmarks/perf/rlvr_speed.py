"""Rollout speed: keelrl's KV-cache group generation against transformers' `generate`, tokens per second.

    taskset -c 1 python -m keelrl.benchmarks.perf.rlvr_speed

Every implementation decodes the same model (a randomly initialised GPT-2, or the packaged SmolLM2-135M-Instruct
that GRPO fine-tunes), the same batch of prompts and exactly `new_tokens` new tokens per row, sampling at
temperature 1 from the full distribution (no top-k):
- keelrl Decoder: LMPolicy's KV-cache decoder, `new_tokens` sampling steps (log-probs and entropies kept);
- keelrl rollout: the same through GroupTokenEnv on a task (what GRPO runs; rows stop at EOS, so tokens
  are counted as generated), only for the setting whose prompts come from a task;
- transformers generate (KV cache), with min_new_tokens = max_new_tokens so no row stops early;
- transformers generate without the cache (the prefix is recomputed for every token), for the tiny models only.
SmolLM2's prompts are the add task's chat prompts, of different lengths: transformers gets them left-padded with
an attention mask, keelrl's decoder as they are.
Implementations alternate within each repeat; the median tokens/s over repeats is reported and written
to benchmarks/results/rlvr.md.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time

import torch

from keelrl.agents.grpo import rollout
from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.checks.rlvr_learning import machine_description, write_section
from keelrl.envs.rlvr_tasks import ChatTask, chat_prompt, make_task
from keelrl.envs.token_env import GroupTokenEnv
from keelrl.networks.char_lm import CharTokenizer, tiny_gpt2
from keelrl.networks.lm_policy import LMPolicy, load_model, packaged_model_file


@dataclasses.dataclass
class Setting:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    num_prompts: int
    group_size: int
    prompt_tokens: int
    new_tokens: int
    task_prompts: bool
    """prompts from the a+b task (also timed through GroupTokenEnv), else random tokens"""
    model: str | None = None
    """a packaged pretrained model (its chat template poses the task; the layer sizes above are then unused)"""


SETTINGS = {
    # the learning check's model and batch: 2 × 64 GPT-2, 32 a+b prompts × 4 completions
    "a+b": Setting("2-layer 64-wide GPT-2, a+b prompts", 2, 64, 4, 32, 4, 4, 6, True),
    # longer sequences, where recomputing the prefix costs more
    "long": Setting("4-layer 256-wide GPT-2, random prompts", 4, 256, 4, 8, 8, 32, 64, False),
    # the model and batch of the comparison with TRL (rlvr_trl): 8 add chat prompts × 8 completions, 64 new tokens
    "smollm2": Setting("SmolLM2-135M-Instruct, add (≤ 20) chat prompts", 0, 0, 0, 8, 8, 0, 64, True, "smollm2-135m"),
}


@dataclasses.dataclass
class Args:
    settings: tuple[str, ...] = ("a+b", "long", "smollm2")
    """settings to measure (keys of SETTINGS)"""
    repeats: int = 7
    """timings per implementation (median reported)"""
    threads: int = 1
    """torch CPU threads"""
    seed: int = 0
    """seed of weights, prompts and sampling"""
    output: str = "benchmarks/results/rlvr.md"
    """Markdown file whose speed section is replaced"""


def time_tokens(run) -> float:
    """Tokens per second of one call of `run` (which returns how many tokens it generated)."""
    start = time.perf_counter()
    tokens = run()
    return tokens / (time.perf_counter() - start)


def prompt_batch(setting: Setting, seed: int):
    """The setting's model, tokenizer, task, problems and (rows,) prompt token lists."""
    torch.manual_seed(seed)
    if setting.model is not None:
        model, tokenizer = load_model(str(packaged_model_file(setting.model)))
        task = ChatTask(make_task("add", 2, 20), chat_prompt(tokenizer))
    else:
        tokenizer = CharTokenizer()
        model = tiny_gpt2(tokenizer, setting.prompt_tokens + setting.new_tokens, setting.n_layer, setting.n_embd,
                          setting.n_head)
        task = make_task("add")
    problems = task.problems("train", setting.num_prompts, seed=seed)
    if setting.task_prompts:
        prompts = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems
                   for _ in range(setting.group_size)]
    else:
        first_char = 2  # ids 0 and 1 are <pad> and <eos>
        rows = setting.num_prompts * setting.group_size
        prompts = torch.randint(first_char, len(tokenizer), (rows, setting.prompt_tokens)).tolist()
    return model, tokenizer, task, problems, prompts


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, longest) prompt ids padded on the left and their attention mask."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def measure(setting: Setting, args: Args) -> dict[str, float]:
    model, tokenizer, task, problems, prompts = prompt_batch(setting, args.seed)
    policy = LMPolicy(model, tokenizer)
    rows = setting.num_prompts * setting.group_size
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompt_ids, attention_mask = left_padded(prompts, pad_id)
    context = max(map(len, prompts)) + setting.new_tokens

    def keelrl_decoder() -> int:
        decoder = policy.decoder(prompts)
        for _ in range(setting.new_tokens):
            decoder.sample()
        return rows * setting.new_tokens

    def keelrl_rollout() -> int:
        env = GroupTokenEnv(task, tokenizer, setting.num_prompts, setting.group_size, setting.new_tokens, context)
        completions, _, _ = rollout(policy, env, problems)
        return int(completions.mask.sum())

    def transformers_generate(use_cache: bool) -> int:
        with torch.no_grad():
            out = model.generate(prompt_ids, attention_mask=attention_mask, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=setting.new_tokens,
                                 min_new_tokens=setting.new_tokens, use_cache=use_cache,
                                 pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id)
        assert out.shape == (rows, context)
        return rows * setting.new_tokens

    runs = {"keelrl Decoder (KV cache)": keelrl_decoder}
    if setting.task_prompts:
        runs["keelrl rollout through GroupTokenEnv"] = keelrl_rollout
    runs["transformers generate (KV cache)"] = lambda: transformers_generate(True)
    if setting.model is None:
        runs["transformers generate, no cache"] = lambda: transformers_generate(False)
    for run in runs.values():  # warm-up
        run()
    timings = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            timings[name].append(time_tokens(run))
    return {name: statistics.median(values) for name, values in timings.items()}


def options_text(args: Args) -> str:
    """The command line's options that differ from Args' defaults (output aside)."""
    default = Args()
    return "".join(f" --{field.name} {' '.join(map(str, value)) if isinstance(value, tuple) else value}"
                   for field in dataclasses.fields(Args) if field.name != "output"
                   and (value := getattr(args, field.name)) != getattr(default, field.name))


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    lines = [
        "Tokens per second (median of "
        f"{args.repeats}; implementations alternate) generating from the same model, prompts and batch, "
        "temperature 1, full distribution. The rollout through GroupTokenEnv counts the tokens rows generate up to "
        "their EOS while the batch decodes until its longest row ends, so it shows what a GRPO batch gets, not the "
        "decoder's speed. GRPO keeps keelrl's decoder: it is as fast as `generate` (SmolLM2 included) and returns "
        "the sampled tokens' log-probs and entropies in the same pass.",
        "",
        f"Machine: {machine_description()}; {args.threads} torch thread(s), "
        f"CPU affinity {sorted(os.sched_getaffinity(0))}, load average at start {os.getloadavg()[0]:.2f}.",
        f"Command: `taskset -c 1 python -m keelrl.benchmarks.perf.rlvr_speed{options_text(args)}` "
        f"(python {platform.python_version()}).",
        "",
    ]
    for key in args.settings:
        setting = SETTINGS[key]
        results = measure(setting, args)
        rows = setting.num_prompts * setting.group_size
        prompt_tokens = f"{setting.prompt_tokens}" if setting.model is None else "a chat template's"
        lines += [f"**{setting.name}**: {setting.num_prompts} prompts × {setting.group_size} completions = "
                  f"{rows} rows, {prompt_tokens} prompt tokens, {setting.new_tokens} new tokens.", "",
                  "| implementation | tokens/s | vs transformers generate |", "|---|---:|---:|"]
        reference = results["transformers generate (KV cache)"]
        lines += [f"| {name} | {value:,.0f} | {value / reference:.2f}× |" for name, value in results.items()]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    write_section(args.output, "Rollout speed", text)


if __name__ == "__main__":
    main(parse_command_line(Args))
