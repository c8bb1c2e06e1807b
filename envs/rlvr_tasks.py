"""Tasks with verifiable rewards for RLVR: arithmetic (a+b, chains), sorting, countdown.

A task draws `Problem`s from a seeded numpy Generator and scores a completion with `verify`
(1.0 correct, 0.0 otherwise). Verifiers first normalise the text by removing all whitespace, since
character tokenisers may decode "17" as "1 7". The problem space is split into train and held-out
parts by a hash of the prompt, so held-out prompts are never trained on, whatever the seed.
`random_answer` writes a well-formed but random answer: the data of a format-only warm-up.

    add        '3+5='          -> '8'        size operands in [0, max_value]
    chain      '3+5-2='        -> '6'        size operands joined by + or -
    sort       'sort 3,1,2='   -> '1,2,3'    size integers in [0, max_value]
    countdown  '3,5,7 to 26='  -> '3*7+5'    reach the target with + - * / and each number at most once
"""

from __future__ import annotations

import ast
import math
import operator
import re
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

SPLITS = ("train", "heldout")
_INTEGER = re.compile(r"-?\d+")
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/()]+")


@dataclass(frozen=True)
class Problem:
    prompt: str
    """the text the model continues, e.g. '3+5='"""
    solution: str
    """one correct completion (verifiers accept any correct one)"""
    numbers: tuple[int, ...]
    """the operands, the list to sort, or countdown's numbers"""
    target: int = 0
    """the value to reach (arithmetic result or countdown target; unused by sorting)"""


def normalize(text: str) -> str:
    """Drop all whitespace: '1 7' and ' 17\\n' both read as '17'."""
    return "".join(text.split())


def parse_int(text: str) -> int | None:
    text = normalize(text)
    return int(text) if _INTEGER.fullmatch(text) else None


def split_of(prompt: str, heldout_fraction: float) -> str:
    """'heldout' for a fixed share of all prompts (by a hash of the text, independent of any seed), else 'train'."""
    return "heldout" if zlib.crc32(prompt.encode()) % 10_000 < heldout_fraction * 10_000 else "train"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) as a product, which stays accurate for large n
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


class Task(ABC):
    """Prompt generator, verifier and train/held-out split of one problem family."""

    name: str

    def __init__(self, size: int, max_value: int, heldout_fraction: float = 0.2):
        if size < 1 or max_value < 1:
            raise ValueError(f"task size and max_value must be positive, got {size} and {max_value}.")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must lie strictly between 0 and 1, got {heldout_fraction}.")
        self.size = size
        self.max_value = max_value
        self.heldout_fraction = heldout_fraction

    @abstractmethod
    def draw(self, rng: np.random.Generator) -> Problem:
        """A problem from the whole space, either split."""

    @abstractmethod
    def verify(self, problem: Problem, completion: str) -> float:
        """1.0 if `completion` (decoded text, EOS excluded) answers `problem`, else 0.0."""

    @abstractmethod
    def random_answer(self, problem: Problem, rng: np.random.Generator) -> str:
        """A well-formed answer chosen at random (right only by chance)."""

    def sample(self, rng: np.random.Generator, split: str = "train") -> Problem:
        """A problem of `split`, drawn by rejection from the whole space."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        for _ in range(10_000):
            problem = self.draw(rng)
            if split_of(problem.prompt, self.heldout_fraction) == split:
                return problem
        raise ValueError(f"{self.name}: found no {split} problem in 10000 draws; the problem space is too small "
                         f"for heldout_fraction {self.heldout_fraction}.")

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

    def __init__(self, size: int = 2, max_value: int = 9, heldout_fraction: float = 0.2, ops: str = "+"):
        super().__init__(size, max_value, heldout_fraction)
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

    @staticmethod
    def _random_expression(numbers: tuple[int, ...], rng: np.random.Generator, subset: bool) -> str:
        """The numbers (all, or a random non-empty subset) in random order joined by random + - *."""
        count = int(rng.integers(1, len(numbers) + 1)) if subset else len(numbers)
        chosen = [numbers[i] for i in rng.permutation(len(numbers))[:count]]
        ops = rng.choice(["+", "-", "*"], count - 1)
        return str(chosen[0]) + "".join(f"{op}{n}" for op, n in zip(ops, chosen[1:]))


def make_task(name: str, size: int = 2, max_value: int = 9, heldout_fraction: float = 0.2) -> Task:
    """A task by name: 'add', 'chain', 'sort' or 'countdown'."""
    if name == "add":
        return Arithmetic(size, max_value, heldout_fraction, ops="+")
    if name == "chain":
        return Arithmetic(size, max_value, heldout_fraction, ops="+-")
    if name == "sort":
        return Sort(size, max_value, heldout_fraction)
    if name == "countdown":
        return Countdown(size, max_value, heldout_fraction)
    raise ValueError(f"unknown RLVR task {name!r}; choose one of 'add', 'chain', 'sort', 'countdown'.")
