"""Value heads: two-hot and C51 projection by hand, HL-Gauss histograms, one interface for all heads."""

import math

import pytest
import torch
import torch.nn.functional as F

from keelrl.networks import C51Head, HLGaussHead, ScalarHead


def hl_gauss_by_hand(target: float, v_min: float, v_max: float, num_bins: int, sigma: float) -> list[float]:
    """The HL-Gauss histogram from its definition, in float64 with math.erf: the mass of N(y, σ²) in each of
    the equal bins, divided by the mass inside [v_min, v_max]; y is first clipped into the support."""
    y = min(max(target, v_min), v_max)
    edges = [v_min + (v_max - v_min) * i / num_bins for i in range(num_bins + 1)]
    cdf = [0.5 * (1 + math.erf((edge - y) / (sigma * math.sqrt(2)))) for edge in edges]
    return [(cdf[i + 1] - cdf[i]) / (cdf[-1] - cdf[0]) for i in range(num_bins)]


def test_two_hot_splits_mass_between_neighbouring_atoms():
    head = C51Head(0.0, 4.0, 5)  # atoms 0, 1, 2, 3, 4
    probs = head.target_distribution(torch.tensor([1.25, 3.0, 4.0, 7.0, -3.0]))
    expected = torch.tensor([
        [0.0, 0.75, 0.25, 0.0, 0.0],  # 1.25 is a quarter of the way from atom 1 to atom 2
        [0.0, 0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 1.0],
        [0.0, 0.0, 0.0, 0.0, 1.0],  # outside the support: clipped to the end atoms
        [1.0, 0.0, 0.0, 0.0, 0.0],
    ])
    torch.testing.assert_close(probs, expected)


def test_c51_projection_preserves_mass_and_mean_inside_the_support():
    torch.manual_seed(0)
    head = C51Head(-10.0, 10.0, 51)
    next_probs = F.softmax(torch.randn(64, 51), dim=-1)
    rewards = torch.empty(64).uniform_(-2, 2)
    discounts = torch.full((64,), 0.5)  # r + 0.5 z stays within [-7, 7]
    not_done = torch.ones(64)
    target = head.project(next_probs, rewards, discounts, not_done)
    torch.testing.assert_close(target.sum(-1), torch.ones(64))
    torch.testing.assert_close(target @ head.support, rewards + 0.5 * (next_probs @ head.support))
    assert (target >= 0).all()


def test_c51_projection_by_hand_with_terminal_and_clipped_targets():
    head = C51Head(0.0, 4.0, 5)
    next_probs = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2], [0.0, 0.0, 0.0, 0.0, 1.0]])
    rewards = torch.tensor([1.0, 2.5, 3.0])
    discounts = torch.full((3,), 0.5)
    not_done = torch.tensor([1.0, 0.0, 1.0])
    target = head.project(next_probs, rewards, discounts, not_done)
    # row 0: atoms 0, 1 move to 1.0 and 1.5; row 1: terminal, all mass on 2.5; row 2: atom 4 moves to 5 -> clipped to 4
    expected = torch.tensor([[0.0, 0.75, 0.25, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    torch.testing.assert_close(target, expected)


def test_hl_gauss_histogram_sums_to_one_with_the_target_as_mean():
    head = HLGaussHead(-5.0, 5.0, 101)
    assert head.sigma == pytest.approx(0.75 * 10 / 101)
    targets = torch.tensor([-4.0, -1.234, 0.0, 0.05, 2.71, 4.5])
    probs = head.target_distribution(targets)
    torch.testing.assert_close(probs.sum(-1), torch.ones(6))
    expected = torch.tensor([hl_gauss_by_hand(t, -5.0, 5.0, 101, 0.75 * 10 / 101) for t in targets.tolist()],
                            dtype=torch.float64)
    # The float32 bin edges from torch.linspace are off the exact ones by up to 2.4e-7 (half an ulp near ±5), and
    # by how much at which edge depends on the CPU kernel; a bin's mass moves by its edges' errors times the Gaussian
    # density there (up to 4.3 per edge for a target on a bin centre), so up to ~2.1e-6. Measured: 1.69e-6 at
    # (2, 50) with ATen's scalar kernels (ATEN_CPU_CAPABILITY=default: edge 50 off by 1.9e-7), 6.0e-7 with AVX2.
    torch.testing.assert_close(probs.double(), expected, atol=2.5e-6, rtol=0)
    # the mean is the target only up to the binning (3.4e-7 here, below float32's resolution of 4.5 at 1e-4
    # of a bin width): the histogram's own mean, computed in float64, is matched to float32 rounding
    centres = torch.tensor([-5.0 + 10.0 * (i + 0.5) / 101 for i in range(101)], dtype=torch.float64)
    torch.testing.assert_close((probs.double() @ centres), expected @ centres, atol=1e-6, rtol=0)
    torch.testing.assert_close(probs @ head.support, targets, atol=2e-6, rtol=0)
    # a target on a bin centre puts erf(half width / (σ √2)) = erf(1 / (1.5 √2)) of its mass in that bin
    assert probs[2, 50] == pytest.approx(math.erf(1 / (1.5 * math.sqrt(2))), rel=1e-5)


def test_hl_gauss_renormalises_near_the_edge():
    head = HLGaussHead(0.0, 1.0, 10, sigma=0.2)
    probs = head.target_distribution(torch.tensor([1.0, 50.0]))
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    torch.testing.assert_close(probs[0], probs[1], rtol=0, atol=0)  # far targets are clipped to the edge first
    # a target on the upper edge keeps only the lower half of its Gaussian, renormalised by the mass inside:
    # the top bin [0.9, 1] holds (Φ(0) − Φ(−0.1/0.2)) / (Φ(0) − Φ(−1/0.2)) = 0.1914625 / 0.4999997 = 0.3829251
    expected = torch.tensor(hl_gauss_by_hand(1.0, 0.0, 1.0, 10, 0.2), dtype=torch.float64)
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    assert expected[-1].item() == pytest.approx((0.5 - phi(-0.5)) / (0.5 - phi(-5.0)), rel=1e-12)
    assert expected[-1].item() == pytest.approx(0.3829251, abs=1e-7)
    torch.testing.assert_close(probs.double(), expected.expand(2, 10), atol=1e-6, rtol=0)


@pytest.mark.parametrize("head", [C51Head(-5.0, 5.0, 11), HLGaussHead(-5.0, 5.0, 10)], ids=["c51", "hl_gauss"])
def test_value_of_one_hot_logits_is_the_bin_centre(head):
    logits = 100.0 * torch.eye(head.num_outputs)  # row k: (numerically) one-hot on bin k
    torch.testing.assert_close(head.value(logits), head.support)


def test_hl_gauss_bin_centres():
    torch.testing.assert_close(HLGaussHead(0.0, 1.0, 4).support, torch.tensor([0.125, 0.375, 0.625, 0.875]))


def test_scalar_head_is_squared_error():
    head = ScalarHead()
    logits = torch.randn(2, 7, 1)  # (E, B, 1)
    target = torch.randn(7)
    assert head.num_outputs == 1
    torch.testing.assert_close(head.value(logits), logits.squeeze(-1))
    torch.testing.assert_close(head.loss(logits, target), F.mse_loss(logits.squeeze(-1), target.expand(2, 7), reduction="none"))


@pytest.mark.parametrize("head", [C51Head(-5.0, 5.0, 11), HLGaussHead(-5.0, 5.0, 10)], ids=["c51", "hl_gauss"])
def test_categorical_loss_is_cross_entropy_for_scalar_and_distribution_targets(head):
    torch.manual_seed(0)
    logits = torch.randn(2, 6, head.num_outputs, requires_grad=True)  # (E, B, K)
    target = torch.empty(6).uniform_(-4, 4)
    histogram = head.target_distribution(target)
    expected = -(histogram * F.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(head.loss(logits, target), expected)
    torch.testing.assert_close(head.loss(logits, histogram), expected)
    head.loss(logits, target).mean().backward()
    # d/dz of −Σ p log softmax(z) is softmax(z) − p; the mean over E·B = 12 samples divides it by 12
    torch.testing.assert_close(logits.grad, (F.softmax(logits.detach(), -1) - histogram) / 12, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("head", [C51Head(-5.0, 5.0, 21), HLGaussHead(-5.0, 5.0, 20)], ids=["c51", "hl_gauss"])
def test_minimising_the_loss_recovers_the_target_value(head):
    targets = torch.tensor([-3.3, 0.0, 1.7])
    logits = torch.zeros(3, head.num_outputs, requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    for _ in range(300):
        optimizer.zero_grad()
        head.loss(logits, targets).mean().backward()
        optimizer.step()
    # atol 0.02 is the optimiser's, not rounding's: after 300 Adam steps the softmax is within 0.004 of the
    # target histogram (its zero bins are only approached as the logits go to −inf)
    torch.testing.assert_close(head.value(logits.detach()), targets, atol=0.02, rtol=0)
    # the cross-entropy's minimum is the entropy of the target histogram (Gibbs' inequality): reached to 0.01
    histogram = head.target_distribution(targets)
    entropy = -(histogram * histogram.clamp_min(1e-30).log()).sum(-1)
    loss = head.loss(logits.detach(), targets)
    assert (loss >= entropy - 1e-6).all() and (loss - entropy).max() < 0.01


def test_min_value_probs_picks_the_member_with_the_smaller_mean():
    head = C51Head(0.0, 2.0, 3)  # atoms 0, 1, 2
    member_0 = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.3, 0.6]])  # means 0.5, 1.5
    member_1 = torch.tensor([[0.25, 0.5, 0.25], [0.2, 0.7, 0.1]])  # means 1.0, 0.9
    logits = torch.stack([member_0, member_1]).log()  # (E=2, B=2, K=3)
    expected = torch.stack([member_0[0], member_1[1]])  # each sample takes the whole distribution of its pessimist
    torch.testing.assert_close(head.min_value_probs(logits), expected)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: C51Head(1.0, 1.0, 11), "--v-min"),
        (lambda: C51Head(5.0, -5.0, 11), "--v-min"),
        (lambda: HLGaussHead(0.0, float("inf"), 11), "--v-max"),
        (lambda: C51Head(-5.0, 5.0, 1), "--num-bins"),
        (lambda: HLGaussHead(-5.0, 5.0, 0), "--num-bins"),
        (lambda: HLGaussHead(-5.0, 5.0, 11, sigma=0.0), "sigma"),
        (lambda: HLGaussHead(-5.0, 5.0, 11, sigma=-1.0), "sigma"),
    ],
)
def test_bad_head_arguments_raise_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_target_shapes_raise_value_error():
    with pytest.raises(ValueError, match="scalar TD targets"):
        ScalarHead().loss(torch.zeros(4, 1), torch.zeros(4, 1))
    with pytest.raises(ValueError, match=r"distributions \(B, 11\)"):
        C51Head(-5.0, 5.0, 11).loss(torch.zeros(4, 11), torch.zeros(4, 7))
