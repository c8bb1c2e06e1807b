"""Tasks with verifiable rewards for RLVR: arithmetic (a+b, chains), sorting, countdown, word problems.

A task draws `Problem`s from a seeded numpy Generator and scores a completion with `verify`
(1.0 correct, 0.0 otherwise). Verifiers first normalise the text by removing all whitespace, since
character tokenisers may decode "17" as "1 7". The problem space is split into three fixed parts by a
hash of the prompt, whatever the seed: train, validation (for choosing settings) and held-out (only for
the final table), so held-out prompts are never trained on nor tuned on.
`random_answer` writes a well-formed but random answer: the data of a format-only warm-up.

    add        '3+5='          -> '8'        size operands in [0, max_value]
    chain      '3+5-2='        -> '6'        size operands joined by + or -
    sort       'sort 3,1,2='   -> '1,2,3'    size integers in [0, max_value]
    countdown  '3,5,7 to 26='  -> '3*7+5'    reach the target with + - * / and each number at most once
    word       'mia has 5 apples, buys 3 more, ...: how many='  -> '16'   GSM8K-style stories of size quantities

Those are the plain prompts a model trained from scratch continues. `ChatTask` poses the same problems to an
instruct model: each task's `question` (in words, saying how to answer) as a user turn of the tokenizer's chat
template; its verifier reads the final answer out of free text (`final_answer`: the last number, the last list,
the last expression) and scores that as the plain task would.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

SPLITS = ("train", "validation", "heldout")
_INTEGER = re.compile(r"-?\d+")
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/()]+")
_NUMBER_IN_TEXT = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")  # 17, -3, 1,250, 2.50
_LIST_IN_TEXT = re.compile(r"-?\d+(?:\s*,\s*-?\d+)*")  # 1, 2, 3
_EXPRESSION_IN_TEXT = re.compile(r"[0-9+\-*/() ]*[0-9][0-9+\-*/() ]*")


@dataclass(frozen=True)
class Problem:
    prompt: str
    """the text the model continues, e.g. '3+5='"""
    solution: str
    """one correct completion (verifiers accept any correct one)"""
    numbers: tuple[int, ...]
    """the operands, the list to sort, or countdown's numbers"""
    target: int = 0
    """the value to reach (arithmetic result, countdown target or word problem answer; unused by sorting)"""
    story: str = ""
    """a word problem told in full sentences (the question an instruct model is asked); empty for the others"""
    source: str = ""
    """the plain prompt that a ChatTask posed as a chat prompt (its split is that prompt's); empty for plain ones"""


def normalize(text: str) -> str:
    """Drop all whitespace: '1 7' and ' 17\\n' both read as '17'."""
    return "".join(text.split())


def parse_int(text: str) -> int | None:
    text = normalize(text)
    return int(text) if _INTEGER.fullmatch(text) else None


def last_number(text: str) -> str | None:
    """The last number written in `text`, thousands separators dropped ('1,250' -> '1250', '16.0' -> '16')."""
    numbers = _NUMBER_IN_TEXT.findall(text)
    if not numbers:
        return None
    value = Fraction(numbers[-1].replace(",", ""))
    return str(value.numerator) if value.denominator == 1 else numbers[-1].replace(",", "")


def split_of(prompt: str, heldout_fraction: float, validation_fraction: float = 0.0) -> str:
    """'heldout' for a fixed share of all prompts, 'validation' for the next share, else 'train' (by a hash of the
    text, independent of any seed; the held-out share is the same whatever the validation share)."""
    bucket = zlib.crc32(prompt.encode()) % 10_000
    if bucket < heldout_fraction * 10_000:
        return "heldout"
    return "validation" if bucket < (heldout_fraction + validation_fraction) * 10_000 else "train"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) as a product, which stays accurate for large n
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


class Task(ABC):
    """Prompt generator, verifier and train/validation/held-out split of one problem family."""

    name: str

    def __init__(self, size: int, max_value: int, heldout_fraction: float = 0.2, validation_fraction: float = 0.1):
        if size < 1 or max_value < 1:
            raise ValueError(f"task size and max_value must be positive, got {size} and {max_value}.")
        if not 0.0 < heldout_fraction < 1.0 or not 0.0 < validation_fraction < 1.0 - heldout_fraction:
            raise ValueError(f"heldout_fraction and validation_fraction must be positive with a sum below 1, got "
                             f"{heldout_fraction} and {validation_fraction}.")
        self.size = size
        self.max_value = max_value
        self.heldout_fraction = heldout_fraction
        self.validation_fraction = validation_fraction

    @abstractmethod
    def draw(self, rng: np.random.Generator) -> Problem:
        """A problem from the whole space, either split."""

    @abstractmethod
    def verify(self, problem: Problem, completion: str) -> float:
        """1.0 if `completion` (decoded text, EOS excluded) answers `problem`, else 0.0."""

    @abstractmethod
    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        """A well-formed answer chosen at random (right only by chance)."""

    @abstractmethod
    def question(self, problem: Problem) -> str:
        """The problem in words for an instruct model, saying how to answer."""

    @abstractmethod
    def final_answer(self, text: str) -> str | None:
        """The answer a free-text reply ends with (what `verify` then scores), or None if it gives none."""

    def split(self, problem: Problem) -> str:
        """The split of `problem`: of its plain prompt (the one a chat prompt was posed from, if it was)."""
        return split_of(problem.source or problem.prompt, self.heldout_fraction, self.validation_fraction)

    def sample(self, rng: np.random.Generator, split: str = "train") -> Problem:
        """A problem of `split`, drawn by rejection from the whole space."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        for _ in range(10_000):
            problem = self.draw(rng)
            if self.split(problem) == split:
                return problem
        raise ValueError(f"{self.name}: found no {split} problem in 10000 draws; the problem space is too small "
                         f"for heldout_fraction {self.heldout_fraction} and validation_fraction "
                         f"{self.validation_fraction}.")

    def problems(self, split: str, count: int, seed: int) -> list[Problem]:
        """Up to `count` distinct problems of `split` (fewer if the split holds fewer), in a fixed order for a seed."""
        rng = np.random.default_rng(seed)
        found: dict[str, Problem] = {}
        for _ in range(100 * count):
            problem = self.sample(rng, split)
            found.setdefault(problem.prompt, problem)
            if len(found) == count:
                break
        return list(found.values())


class Arithmetic(Task):
    """`size` integers in [0, max_value] joined by operators from `ops`; the answer is the value."""

    def __init__(self, size: int = 2, max_value: int = 9, heldout_fraction: float = 0.2, ops: str = "+",
                 validation_fraction: float = 0.1):
        super().__init__(size, max_value, heldout_fraction, validation_fraction)
        if size < 2:
            raise ValueError(f"arithmetic needs at least 2 operands, got size {size}.")
        self.ops = ops
        self.name = "add" if ops == "+" else "chain"

    def draw(self, rng: np.random.Generator) -> Problem:
        numbers = [int(n) for n in rng.integers(0, self.max_value + 1, self.size)]
        ops = [str(op) for op in rng.choice(list(self.ops), self.size - 1)]
        expression = str(numbers[0]) + "".join(op + str(n) for op, n in zip(ops, numbers[1:]))
        value = numbers[0] + sum(n if op == "+" else -n for op, n in zip(ops, numbers[1:]))
        return Problem(prompt=expression + "=", solution=str(value), numbers=tuple(numbers), target=value)

    def verify(self, problem: Problem, completion: str) -> float:
        return float(parse_int(completion) == problem.target)

    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        lowest = -(self.size - 1) * self.max_value if "-" in self.ops else 0
        return str(int(rng.integers(lowest, self.size * self.max_value + 1)))

    def question(self, problem: Problem) -> str:
        expression = problem.prompt[:-1].replace("+", " + ").replace("-", " - ")
        return f"What is {expression}? Answer with the number only."

    def final_answer(self, text: str) -> str | None:
        return last_number(text)


class Sort(Task):
    """Sort `size` integers in [0, max_value] ascending, comma-separated."""

    name = "sort"

    def draw(self, rng: np.random.Generator) -> Problem:
        numbers = tuple(int(n) for n in rng.integers(0, self.max_value + 1, self.size))
        return Problem(prompt=f"sort {','.join(map(str, numbers))}=",
                       solution=",".join(map(str, sorted(numbers))), numbers=numbers)

    def verify(self, problem: Problem, completion: str) -> float:
        items = [parse_int(item) for item in normalize(completion).split(",")]
        return float(items == sorted(problem.numbers))

    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        return ",".join(str(problem.numbers[i]) for i in rng.permutation(len(problem.numbers)))

    def question(self, problem: Problem) -> str:
        return (f"Sort the numbers {', '.join(map(str, problem.numbers))} in ascending order. Answer with the sorted "
                f"numbers separated by commas, nothing else.")

    def final_answer(self, text: str) -> str | None:
        lists = _LIST_IN_TEXT.findall(text)
        return lists[-1] if lists else None


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the integer literals of an expression of + - * / and parentheses; None if malformed."""
    text = normalize(text)
    if not _EXPRESSION_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, RecursionError):
        return None
    literals: list[int] = []

    def value(node: ast.AST) -> Fraction | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
                return None
            return _OPERATORS[type(node.op)](left, right)
        return None

    result = value(tree)
    return None if result is None else (result, literals)


class Countdown(Task):
    """Reach the target from `size` numbers in [1, max_value] with + - * / (exact), each number at most once."""

    name = "countdown"

    def draw(self, rng: np.random.Generator) -> Problem:
        while True:
            numbers = tuple(int(n) for n in rng.integers(1, self.max_value + 1, self.size))
            solution = self._random_expression(numbers, rng, subset=False)
            target = evaluate_expression(solution)[0]
            if target > 0 and target.denominator == 1:
                break
        return Problem(prompt=f"{','.join(map(str, numbers))} to {target}=", solution=solution,
                       numbers=numbers, target=int(target))

    def verify(self, problem: Problem, completion: str) -> float:
        evaluated = evaluate_expression(completion)
        if evaluated is None:
            return 0.0
        value, used = evaluated
        available = list(problem.numbers)
        for number in used:
            if number not in available:
                return 0.0
            available.remove(number)
        return float(value == problem.target)

    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        return self._random_expression(problem.numbers, rng, subset=True)

    def question(self, problem: Problem) -> str:
        return (f"Using the numbers {', '.join(map(str, problem.numbers))}, each at most once, and the operations "
                f"+, -, *, /, write an expression equal to {problem.target}. Answer with the expression only.")

    def final_answer(self, text: str) -> str | None:
        """The expression on the last line with a digit: of 'x = y', the first side holding an operator (so
        '3*7+5 = 26' and '26 = 3*7+5' both give '3*7+5'); × and ÷ read as * and /."""
        text = text.replace("×", "*").replace("÷", "/")
        lines = [line for line in text.splitlines() if any(c.isdigit() for c in line)]
        if not lines:
            return None
        for side in lines[-1].split("="):
            candidates = [c.strip() for c in _EXPRESSION_IN_TEXT.findall(side)]
            expression = max(candidates, key=len, default="")
            if any(op in expression.lstrip("-") for op in "+-*/"):
                return expression
        return None

    @staticmethod
    def _random_expression(numbers: tuple[int, ...], rng: np.random.Generator, subset: bool) -> str:
        """The numbers (all, or a random non-empty subset) in random order joined by random + - *."""
        count = int(rng.integers(1, len(numbers) + 1)) if subset else len(numbers)
        chosen = [numbers[i] for i in rng.permutation(len(numbers))[:count]]
        ops = rng.choice(["+", "-", "*"], count - 1)
        return str(chosen[0]) + "".join(f"{op}{n}" for op, n in zip(ops, chosen[1:]))


_NAMES = ("Mia", "Liam", "Ava", "Noah", "Emma", "Omar", "Sofia", "Ravi", "Chen", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "books", "cookies", "pencils", "shells", "coins")


class WordProblem(Task):
    """GSM8K-style stories: someone starts with up to max_value items, then size − 1 events change how many they
    have: buying more, giving some away, doubling or tripling them, or splitting them into equal piles and keeping
    one. The answer is how many they have at the end (never negative, always whole)."""

    name = "word"

    def __init__(self, size: int = 3, max_value: int = 9, heldout_fraction: float = 0.2,
                 validation_fraction: float = 0.1):
        super().__init__(size, max_value, heldout_fraction, validation_fraction)
        if size < 2:
            raise ValueError(f"a word problem needs a start and at least one event: size >= 2, got {size}.")

    def draw(self, rng: np.random.Generator) -> Problem:
        name, item = str(rng.choice(_NAMES)), str(rng.choice(_ITEMS))
        count = int(rng.integers(1, self.max_value + 1))
        numbers, plain, story = [count], [f"{name.lower()} has {count} {item}"], [f"{name} has {count} {item}."]
        for _ in range(self.size - 1):
            number, count, short, sentence = self._event(count, name, item, rng)
            numbers.append(number)
            plain.append(short)
            story.append(sentence)
        story.append(f"How many {item} does {name} have now?")
        return Problem(prompt=", ".join(plain) + ": how many=", solution=str(count), numbers=tuple(numbers),
                       target=count, story=" ".join(story))

    def _event(self, count: int, name: str, item: str, rng: np.random.Generator) -> tuple[int, int, str, str]:
        """One event drawn among those possible at `count`: (its number, the new count, plain text, sentence)."""
        piles = [k for k in (2, 3, 4) if count >= k and count % k == 0]
        kinds = ["buy", "times"] + (["give"] if count > 0 else []) + (["share"] if piles else [])
        kind = str(rng.choice(kinds))
        if kind == "buy":
            n = int(rng.integers(1, self.max_value + 1))
            return n, count + n, f"buys {n} more", f"{name} buys {n} more {item}."
        if kind == "give":
            n = int(rng.integers(1, count + 1))
            return n, count - n, f"gives {n} away", f"{name} gives {n} {item} to a friend."
        if kind == "times":
            k = int(rng.integers(2, 4))
            word = "doubles" if k == 2 else "triples"
            return k, count * k, f"{word} them", f"Then the number of {item} {name} has {word}."
        k = int(rng.choice(piles))
        return k, count // k, f"keeps 1 of {k} equal piles", (f"{name} splits the {item} into {k} equal piles and "
                                                              f"keeps one pile.")

    def verify(self, problem: Problem, completion: str) -> float:
        return float(parse_int(completion) == problem.target)

    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        return str(int(rng.integers(0, self.size * self.max_value * 3 ** (self.size - 1) + 1)))

    def question(self, problem: Problem) -> str:
        return f"{problem.story} Answer with the number only."

    def final_answer(self, text: str) -> str | None:
        return last_number(text)


class ChatTask(Task):
    """`task`'s problems posed to an instruct model: each one's question in words as a chat prompt (`render`: the
    question -> the prompt text, e.g. `chat_prompt(tokenizer)`); a reply scores as the plain task scores its final
    answer (`task.final_answer`), 0 when it gives none. Draws, splits and random answers are the task's."""

    def __init__(self, task: Task, render: Callable[[str], str]):
        super().__init__(task.size, task.max_value, task.heldout_fraction, task.validation_fraction)
        self.task = task
        self.render = render
        self.name = task.name

    def draw(self, rng: np.random.Generator) -> Problem:
        problem = self.task.draw(rng)
        return replace(problem, prompt=self.render(self.task.question(problem)), source=problem.prompt)

    def verify(self, problem: Problem, completion: str) -> float:
        answer = self.task.final_answer(completion)
        return 0.0 if answer is None else self.task.verify(problem, answer)

    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        return self.task.random_answer(problem, rng)

    def question(self, problem: Problem) -> str:
        return self.task.question(problem)

    def final_answer(self, text: str) -> str | None:
        return self.task.final_answer(text)


def chat_prompt(tokenizer) -> Callable[[str], str]:
    """question -> the text of a chat that asks it in a user turn and opens the assistant's, by the tokenizer's own
    chat template (a Hugging Face tokenizer with `chat_template`)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("chat prompts need a tokenizer with a chat template (an instruct model's); this one has "
                         "none: use --prompt-format plain.")

    def render(question: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)

    return render


TASKS = ("add", "chain", "sort", "countdown", "word")


def make_task(name: str, size: int = 2, max_value: int = 9, heldout_fraction: float = 0.2,
              validation_fraction: float = 0.1) -> Task:
    """A task by name: 'add', 'chain', 'sort', 'countdown' or 'word'."""
    fractions = (heldout_fraction, validation_fraction)
    if name == "add":
        return Arithmetic(size, max_value, heldout_fraction, "+", validation_fraction)
    if name == "chain":
        return Arithmetic(size, max_value, heldout_fraction, "+-", validation_fraction)
    if name == "sort":
        return Sort(size, max_value, *fractions)
    if name == "countdown":
        return Countdown(size, max_value, *fractions)
    if name == "word":
        return WordProblem(size, max_value, *fractions)
    raise ValueError(f"unknown RLVR task {name!r}; choose one of {', '.join(map(repr, TASKS))}.")
