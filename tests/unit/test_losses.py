import math

import pytest
import torch

from opdflow.compute.losses import LossOptions, policy_loss, rl_advantage


def test_policy_loss_value_and_gradient_on_hand_made_tensors():
    logp_learner = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    logp_teacher = torch.tensor([[-0.5, -3.0, -0.5]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = policy_loss(logp_learner, logp_teacher, mask)
    # A = teacher - learner = [0.5, -1.0]; loss = -(0.5 * -1 + -1 * -2) / 2 = -0.75
    assert math.isclose(loss.item(), -0.75, rel_tol=1e-6)
    loss.backward()
    # d loss / d logp_t = -A_t / tokens (advantage is stop-gradient); masked token gets 0
    assert torch.allclose(logp_learner.grad, torch.tensor([[-0.25, 0.5, 0.0]]))
    # training KL (k1 of learner vs teacher on the sampled tokens) = mean(learner - teacher)
    assert math.isclose(stats["train_kl"], ((-1.0 + 0.5) + (-2.0 + 3.0)) / 2, rel_tol=1e-6)


def test_gradient_descent_on_policy_loss_moves_a_categorical_towards_the_teacher():
    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.tensor([2.0, 0.0, -1.0, 0.5]), 0)
    theta = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.5)

    def kl():
        p = torch.log_softmax(theta.detach(), 0)
        return float((p.exp() * (p - teacher)).sum())

    start = kl()
    for _ in range(200):
        logp_all = torch.log_softmax(theta, 0)
        y = torch.multinomial(logp_all.exp().detach(), 256, replacement=True)
        loss, _ = policy_loss(
            logp_all[y][None], teacher[y][None], torch.ones(1, 256, dtype=torch.bool)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert kl() < 0.1 * start


def test_options_engine_advantage_is_clip_and_centering():
    lp_l = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    lp_t = torch.tensor([[-1.0, -3.0]])
    lp_e = torch.tensor([[-2.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, _ = policy_loss(lp_l, lp_t, mask, lp_e, LossOptions(advantage_from="engine"))
    # A = teacher - engine = [1, -2]; loss = -(1*-1 + -2*-1)/2 = -0.5
    assert math.isclose(loss.item(), -0.5, rel_tol=1e-6)
    loss, _ = policy_loss(lp_l, lp_t, mask, lp_e, LossOptions(is_clip=1.5))
    # w = min(exp(l - e), 1.5) = [1.5, 1]; A = [0, -2]; loss = -(0 + 1*-2*-1)/2 = -1
    assert math.isclose(loss.item(), -1.0, rel_tol=1e-6)
    loss, _ = policy_loss(lp_l, lp_t, mask, None, LossOptions(center_advantage=True))
    # A = [0, -2] - mean(-1) = [1, -1]; loss = -(1*-1 + -1*-1)/2 = 0
    assert abs(loss.item()) < 1e-7


def test_rl_advantages_by_hand():
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    group = torch.tensor([7, 7, 7, 3, 3, 3])
    assert torch.equal(rl_advantage(reward, group, "reinforce"), reward)
    adv = rl_advantage(reward, group, "grpo")
    # group 7: mean 1/3, std sqrt(2)/3; group 3 all equal -> 0
    s = math.sqrt(2) / 3
    expected = torch.tensor([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0, 0.0, 0.0])
    assert torch.allclose(adv, expected, atol=1e-4)
    with pytest.raises(ValueError, match="unknown RL objective"):
        rl_advantage(reward, group, "ppo")


def test_rl_loss_broadcasts_the_response_advantage_and_centering_subtracts_its_mean():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    reward, group = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    loss, stats = policy_loss(lp, None, mask, None, LossOptions(loss="reinforce"), reward, group)
    # A = [1, 1 | 0]; loss = -(1*-1 + 1*-2) / 3 = 1
    assert math.isclose(loss.item(), 1.0, rel_tol=1e-6) and "train_kl" not in stats
    opts = LossOptions(loss="reinforce", center_advantage=True)
    loss, _ = policy_loss(lp, None, mask, None, opts, reward, group)
    # token-weighted mean A = 2/3: A = [1/3, 1/3 | -2/3]; loss = -(-1/3 - 2/3 + 1/3) / 3
    assert math.isclose(loss.item(), 2 / 9, rel_tol=1e-6)
    with pytest.raises(ValueError, match="needs a reward"):
        policy_loss(lp, None, mask, None, LossOptions(loss="grpo"))


@pytest.mark.parametrize("kind", ["reinforce", "grpo"])
def test_rl_gradient_descent_raises_the_reward_of_a_categorical(kind):
    torch.manual_seed(0)
    theta = torch.zeros(4, requires_grad=True)  # arm 2 is the correct answer
    opt = torch.optim.SGD([theta], lr=1.0)
    for _ in range(100):
        logp_all = torch.log_softmax(theta, 0)
        y = torch.multinomial(logp_all.exp().detach(), 64, replacement=True)
        reward = (y == 2).float()
        group = torch.arange(64) // 8  # 8 groups of 8 responses
        loss, _ = policy_loss(
            logp_all[y][:, None],
            None,
            torch.ones(64, 1, dtype=torch.bool),
            None,
            LossOptions(loss=kind),
            reward,
            group,
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.softmax(theta, 0)[2] > 0.9
