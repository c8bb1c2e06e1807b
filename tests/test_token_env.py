"""Token environments and RLVR tasks: gymnasium's checker, episode semantics, groups, verifiers, splits, pass@k."""

import itertools
import math
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from keelrl.envs.rlvr_tasks import (
    Arithmetic,
    Countdown,
    Problem,
    Sort,
    evaluate_expression,
    make_task,
    pass_at_k,
    split_of,
)
from keelrl.envs.token_env import UNFILLED, GroupTokenEnv, TokenEnv
from keelrl.networks.char_lm import CharTokenizer

TOKENIZER = CharTokenizer()
EOS = TOKENIZER.eos_token_id
PROBLEM = Problem(prompt="3+5=", solution="8", numbers=(3, 5), target=8)


def encode(text):
    return TOKENIZER.encode(text)


def test_gymnasium_check_env_passes_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning of check_env fails the test
        check_env(TokenEnv(make_task("add"), TOKENIZER, max_new_tokens=4, context_length=12), skip_render_check=True)


def test_episode_observations_reward_and_termination():
    env = TokenEnv(make_task("add"), TOKENIZER, max_new_tokens=4, context_length=12)
    obs, info = env.reset(seed=0, options={"problem": PROBLEM})
    assert info["prompt_length"] == 4
    assert obs.tolist() == encode("3+5=") + [UNFILLED] * 8
    obs, reward, terminated, truncated, info = env.step(encode("8")[0])
    assert obs.tolist()[:6] == encode("3+5=8") + [UNFILLED]
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step(EOS)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["completion"] == "8" and obs[5] == EOS


def test_wrong_answers_score_zero_and_the_length_limit_truncates():
    env = TokenEnv(make_task("add"), TOKENIZER, max_new_tokens=3, context_length=12)
    env.reset(options={"problem": PROBLEM})
    results = [env.step(token) for token in encode("888")]
    _, reward, terminated, truncated, info = results[-1]
    assert [r[3] for r in results] == [False, False, True]
    assert (reward, terminated, info["completion"]) == (0.0, False, "888")
    # the context limit truncates too: a 4-token prompt in a 6-token context leaves room for 2
    env = TokenEnv(make_task("add"), TOKENIZER, max_new_tokens=5, context_length=6)
    env.reset(options={"problem": PROBLEM})
    assert env.step(encode("8")[0])[3] is False
    assert env.step(encode("8")[0])[3] is True


def test_group_env_repeats_each_prompt_and_ends_rows_independently():
    env = GroupTokenEnv(make_task("add"), TOKENIZER, num_prompts=2, group_size=3, max_new_tokens=3, context_length=10,
                        seed=0)
    problems = [PROBLEM, Problem(prompt="9+9=", solution="18", numbers=(9, 9), target=18)]
    obs, info = env.reset(options={"problems": problems})
    assert obs.shape == (6, 10)
    assert [p.prompt for p in info["problems"]] == ["3+5="] * 3 + ["9+9="] * 3
    one, eight, eos = encode("1")[0], encode("8")[0], EOS
    # row 0 answers 8 and stops; row 3 answers 18; the others run to the length limit
    first = [eight, one, one, one, one, one]
    _, rewards, terminated, truncated, _ = env.step(first)
    assert not terminated.any() and not truncated.any()
    _, rewards, terminated, truncated, _ = env.step([eos, one, one, eight, one, one])
    assert terminated.tolist() == [True, False, False, False, False, False]
    assert rewards.tolist() == [1.0, 0, 0, 0, 0, 0]
    obs, rewards, terminated, truncated, _ = env.step([one, eos, one, eos, one, one])  # row 0's action is ignored
    assert terminated.tolist() == [False, True, False, True, False, False]
    assert truncated.tolist() == [False, False, True, False, True, True]
    assert rewards.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert env.done.all() and env.completion_lengths.tolist() == [2, 3, 3, 3, 3, 3]
    assert obs[0, 6] == UNFILLED  # nothing was written after row 0's EOS
    with pytest.raises(RuntimeError, match="reset"):
        env.step(first)


def test_group_env_samples_from_its_split_with_a_seed():
    task = make_task("add")
    env = GroupTokenEnv(task, TOKENIZER, num_prompts=8, group_size=2, context_length=10, split="heldout")
    _, first = env.reset(seed=3)
    _, again = env.reset(seed=3)
    assert [p.prompt for p in first["problems"]] == [p.prompt for p in again["problems"]]
    assert all(split_of(p.prompt, task.heldout_fraction) == "heldout" for p in first["problems"])


class FlakyVerifier(Arithmetic):
    """Raises on odd targets, returns a string on targets above 10 and NaN on 0."""

    def verify(self, problem, completion):
        if problem.target % 2:
            raise RuntimeError("verifier crashed")
        if problem.target > 10:
            return "yes"
        return float("nan") if problem.target == 0 else 1.0


def test_a_failing_verifier_gives_zero_reward_is_counted_and_the_episode_goes_on():
    problems = [Problem(f"{a}+{b}=", str(a + b), (a, b), a + b) for a, b in [(1, 2), (6, 6), (0, 0), (2, 2)]]
    env = GroupTokenEnv(FlakyVerifier(), TOKENIZER, num_prompts=4, group_size=1, max_new_tokens=2, context_length=8)
    env.reset(options={"problems": problems})
    with pytest.warns(RuntimeWarning, match="verifier raised RuntimeError"):
        _, rewards, terminated, _, info = env.step([EOS] * 4)
    assert rewards.tolist() == [0.0, 0.0, 0.0, 1.0]
    assert terminated.all() and info["verifier_errors"] == 3 and env.verifier_errors == 3
    env.reset(options={"problems": problems})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.step([EOS] * 4)
    assert not caught and env.verifier_errors == 6  # warned once per env


def test_bad_input_is_refused_with_a_clear_message():
    task = make_task("add")
    with pytest.raises(ValueError, match="context holds 4"):
        GroupTokenEnv(task, TOKENIZER, context_length=4).reset(options={"problems": [PROBLEM]})
    tokenizer = CharTokenizer()
    tokenizer.eos_token_id = None
    with pytest.raises(ValueError, match="no EOS token"):
        TokenEnv(task, tokenizer)
    with pytest.raises(ValueError, match="token ids in"):
        env = GroupTokenEnv(task, TOKENIZER, context_length=10)
        env.reset()
        env.step([len(TOKENIZER)])
    with pytest.raises(ValueError, match="unknown RLVR task 'mult'"):
        make_task("mult")
    with pytest.raises(ValueError, match="not in the tokenizer vocabulary"):
        TOKENIZER.encode("3+5=?")


def test_verifiers_normalise_spaces_inserted_by_character_tokenisers():
    add = make_task("add")
    problem = Problem("9+8=", "17", (9, 8), 17)
    assert add.verify(problem, "1 7") == 1.0 and add.verify(problem, " 17\n") == 1.0
    assert add.verify(problem, "71") == 0.0 and add.verify(problem, "17+") == 0.0 and add.verify(problem, "") == 0.0
    sort = Sort(3, 9)
    problem = Problem("sort 3,1,2=", "1,2,3", (3, 1, 2))
    assert sort.verify(problem, "1 , 2 ,3") == 1.0
    assert sort.verify(problem, "1,3,2") == sort.verify(problem, "1,2") == sort.verify(problem, "1,2,x") == 0.0


def test_countdown_verifier_rules():
    task = Countdown(3, 9)
    problem = Problem("3,5,7 to 26=", "3*7+5", (3, 5, 7), 26)
    assert task.verify(problem, "3 * 7 + 5") == 1.0
    assert task.verify(problem, "(5+7)*3-10") == 0.0  # 10 is not given
    assert task.verify(problem, "7*3+5*1") == 0.0  # 1 is not given
    assert task.verify(problem, "5*5+1") == 0.0  # 5 used twice
    assert task.verify(Problem("6,4,2 to 3=", "6/2", (6, 4, 2), 3), "6/2") == 1.0  # exact division
    assert task.verify(Problem("7,2 to 3=", "", (7, 2), 3), "7/2") == 0.0
    assert evaluate_expression("7/0") is None and evaluate_expression("2**3") is None
    assert evaluate_expression("__import__('os')") is None and evaluate_expression("(1+") is None


@pytest.mark.parametrize("name,size", [("add", 2), ("chain", 3), ("sort", 4), ("countdown", 3), ("word", 3)])
def test_tasks_solutions_verify_and_random_answers_are_well_formed(name, size):
    task = make_task(name, size=size, max_value=9)
    rng = np.random.default_rng(0)
    for _ in range(50):
        problem = task.sample(rng)
        assert task.verify(problem, problem.solution) == 1.0
        TOKENIZER.encode(problem.prompt + task.random_answer(problem, rng))  # every character is in the vocabulary
    problem = task.sample(rng)
    answers = [task.random_answer(problem, rng) for _ in range(200)]
    if name in ("add", "chain", "word"):
        assert all(a.lstrip("-").isdigit() for a in answers)
        assert len(set(answers)) > 10  # random: accuracy starts near chance after a format warm-up
    if name == "sort":
        assert all(sorted(map(int, a.split(","))) == sorted(problem.numbers) for a in answers)
    if name == "countdown":
        assert all(evaluate_expression(a) is not None for a in answers)


def test_train_validation_and_heldout_splits_are_disjoint_fixed_and_of_the_stated_size():
    task = make_task("add", heldout_fraction=0.2, validation_fraction=0.1)
    every = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    sizes = {name: [split_of(prompt, 0.2, 0.1) for prompt in every].count(name) for name in ("heldout", "validation")}
    assert 10 <= sizes["heldout"] <= 30 and 3 <= sizes["validation"] <= 20
    heldout = task.problems("heldout", sizes["heldout"], seed=0)
    validation = task.problems("validation", sizes["validation"], seed=3)
    train = task.problems("train", 100 - sum(sizes.values()), seed=5)
    splits = [{p.prompt for p in split} for split in (heldout, validation, train)]
    assert set().union(*splits) == set(every)  # every single-digit a+b, each in exactly one split
    assert not splits[0] & splits[1] and not splits[0] & splits[2] and not splits[1] & splits[2]
    assert all(task.split(p) == "validation" for p in validation)
    assert [p.prompt for p in task.problems("heldout", len(heldout), seed=0)] == [p.prompt for p in heldout]
    big = make_task("add", max_value=99, heldout_fraction=0.2)
    prompts = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    named = [split_of(prompt, 0.2, 0.1) for prompt in prompts]
    assert abs(named.count("heldout") / 1e4 - 0.2) < 0.02 and abs(named.count("validation") / 1e4 - 0.1) < 0.02
    # the held-out split does not depend on the validation share
    assert [split_of(prompt, 0.2) == "heldout" for prompt in prompts] == [name == "heldout" for name in named]
    assert len(big.problems("heldout", 50, seed=1)) == 50


def brute_force_pass_at_k(n, c, k):
    """Share of all k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 4, 7, 10])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert math.isclose(pass_at_k(n, c, k), brute_force_pass_at_k(n, c, k), abs_tol=1e-12)
    assert pass_at_k(n, 1, 1) == pytest.approx(1 / n)
    with pytest.raises(ValueError):
        pass_at_k(n, n + 1, 1)
