"""GRPO's group-relative advantages against hand-computed values."""

import math

import numpy as np
import pytest

from engine.rl.grpo import ADV_EPS, group_advantages


def test_eps_is_the_documented_one():
    assert ADV_EPS == 1e-6


def test_half_right_group_is_plus_minus_one():
    # mean 0.5, population std 0.5: (r - 0.5) / (0.5 + 1e-6)
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 1.0]), 4)
    expected = np.array([0.5, -0.5, -0.5, 0.5]) / (0.5 + 1e-6)
    np.testing.assert_allclose(adv, expected, rtol=1e-12)
    np.testing.assert_allclose(adv, [1, -1, -1, 1], atol=1e-5)


def test_population_std_not_sample_std():
    # one right of four: mean 0.25, population std sqrt(0.1875) (the sample std would be 0.5)
    adv = group_advantages(np.array([0.0, 0.0, 0.0, 1.0]), 4)
    std = math.sqrt(0.1875)
    expected = np.array([-0.25, -0.25, -0.25, 0.75]) / (std + 1e-6)
    np.testing.assert_allclose(adv, expected, rtol=1e-12)
    np.testing.assert_allclose(adv, [-1 / math.sqrt(3)] * 3 + [math.sqrt(3)], rtol=1e-5)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.37])
def test_all_equal_group_has_zero_advantage(value):
    adv = group_advantages(np.full(8, value), 8)
    np.testing.assert_array_equal(adv, np.zeros(8))


def test_groups_are_normalised_independently():
    first, second = [1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]
    together = group_advantages(np.array(first + second), 4)
    np.testing.assert_allclose(together[:4], group_advantages(np.array(first), 4), rtol=0)
    np.testing.assert_allclose(together[4:], group_advantages(np.array(second), 4), rtol=0)
    # changing the second group's rewards leaves the first group's advantages alone
    other = group_advantages(np.array([*first, 1.0, 1.0, 1.0, 1.0]), 4)
    np.testing.assert_array_equal(other[:4], together[:4])
    np.testing.assert_array_equal(other[4:], np.zeros(4))


def test_each_group_sums_to_zero_and_order_is_kept():
    rng = np.random.default_rng(0)
    rewards = rng.random(6 * 5)
    adv = group_advantages(rewards, 5)
    assert adv.shape == (30,)
    assert adv.dtype == np.float64
    np.testing.assert_allclose(adv.reshape(6, 5).sum(axis=1), np.zeros(6), atol=1e-9)
    # within a group, a higher reward means a higher advantage
    for r, a in zip(rewards.reshape(6, 5), adv.reshape(6, 5), strict=True):
        np.testing.assert_array_equal(np.argsort(r), np.argsort(a))


def test_accepts_lists_and_rejects_ragged_groups():
    np.testing.assert_allclose(group_advantages([1, 0], 2), [1, -1], atol=1e-5)
    with pytest.raises(ValueError, match="reshape"):
        group_advantages(np.zeros(5), 4)
