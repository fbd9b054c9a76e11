import math

import torch

from opdflow.losses import LossOptions, opd_loss


def test_opd_loss_value_and_gradient_on_hand_made_tensors():
    logp_learner = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    logp_teacher = torch.tensor([[-0.5, -3.0, -0.5]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = opd_loss(logp_learner, logp_teacher, mask)
    # A = teacher - learner = [0.5, -1.0]; loss = -(0.5 * -1 + -1 * -2) / 2 = -0.75
    assert math.isclose(loss.item(), -0.75, rel_tol=1e-6)
    loss.backward()
    # d loss / d logp_t = -A_t / tokens (advantage is stop-gradient); masked token gets 0
    assert torch.allclose(logp_learner.grad, torch.tensor([[-0.25, 0.5, 0.0]]))
    # training KL (k1 of learner vs teacher on the sampled tokens) = mean(learner - teacher)
    assert math.isclose(stats["train_kl"], ((-1.0 + 0.5) + (-2.0 + 3.0)) / 2, rel_tol=1e-6)


def test_gradient_descent_on_opd_loss_moves_a_categorical_towards_the_teacher():
    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.tensor([2.0, 0.0, -1.0, 0.5]), 0)
    theta = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.5)

    def kl():
        p = torch.log_softmax(theta, 0)
        return float((p.exp() * (p - teacher)).sum())

    start = kl()
    for _ in range(200):
        logp_all = torch.log_softmax(theta, 0)
        y = torch.multinomial(logp_all.exp().detach(), 256, replacement=True)
        loss, _ = opd_loss(
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
    loss, _ = opd_loss(lp_l, lp_t, mask, lp_e, LossOptions(advantage_from="engine"))
    # A = teacher - engine = [1, -2]; loss = -(1*-1 + -2*-1)/2 = -0.5
    assert math.isclose(loss.item(), -0.5, rel_tol=1e-6)
    loss, _ = opd_loss(lp_l, lp_t, mask, lp_e, LossOptions(is_clip=1.5))
    # w = min(exp(l - e), 1.5) = [1.5, 1]; A = [0, -2]; loss = -(0 + 1*-2*-1)/2 = -1
    assert math.isclose(loss.item(), -1.0, rel_tol=1e-6)
    loss, _ = opd_loss(lp_l, lp_t, mask, None, LossOptions(center_advantage=True))
    # A = [0, -2] - mean(-1) = [1, -1]; loss = -(1*-1 + -1*-1)/2 = 0
    assert abs(loss.item()) < 1e-7
