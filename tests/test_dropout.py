"""The CPU dropout: the distribution of F.dropout, fairseq's seeding and --retain-dropout, an exact gradient."""

import math

import pytest
import torch
from utils import build_model

from fairseq_convs2s.modules.dropout import Dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_mask_keeps_each_element_with_probability_one_minus_p(p):
    torch.manual_seed(0)
    n = 1_000_001  # odd: the last 64-bit draw gives one element
    keep = keep_mask(torch.Size([n]), p).double()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(keep.mean().item() - (1 - p)) < 5 * sigma
    # the two halves of one 64-bit draw, and neighbouring draws, are independent
    pairs = keep[: n - 1].view(-1, 2)
    assert abs((pairs[:, 0] * pairs[:, 1]).mean().item() - (1 - p) ** 2) < 5 * math.sqrt(2 / n)
    odd_even = keep[1 : n - 2].view(-1, 2)
    assert abs((odd_even[:, 0] * odd_even[:, 1]).mean().item() - (1 - p) ** 2) < 5 * math.sqrt(2 / n)


def test_mask_at_the_edges_of_p_and_of_size():
    torch.manual_seed(0)
    assert keep_mask(torch.Size([1000]), 0.0).all()
    assert not keep_mask(torch.Size([1000]), 1.0 - 1e-12).any()  # the threshold stays within int32
    assert keep_mask(torch.Size([0, 3]), 0.5).shape == (0, 3)


def test_mask_follows_the_seed():
    torch.manual_seed(3)
    a = keep_mask(torch.Size([5, 7, 3]), 0.3)
    torch.manual_seed(3)
    b = keep_mask(torch.Size([5, 7, 3]), 0.3)
    c = keep_mask(torch.Size([5, 7, 3]), 0.3)
    assert a.shape == (5, 7, 3) and a.dtype == torch.bool
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_training_output_and_gradient_are_the_kept_elements_scaled(dtype):
    torch.manual_seed(1)
    dropout = Dropout(0.25).train()
    x = (torch.rand(4, 6, 9, dtype=torch.float64) + 0.5).to(dtype).requires_grad_()  # no zeros
    y = dropout(x)
    kept = y != 0
    assert 0 < kept.sum() < kept.numel()
    torch.testing.assert_close(y, torch.where(kept, x / 0.75, 0).detach())
    grad = torch.randn_like(y)
    y.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(kept, grad / 0.75, 0))


def test_gradient_matches_finite_differences():
    dropout = Dropout(0.4).train()
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)

    def with_fixed_mask(x):  # the same mask at every evaluation
        torch.manual_seed(7)
        return dropout(x)

    assert torch.autograd.gradcheck(with_fixed_mask, (x,))


def test_inactive_in_eval_unless_retained_and_as_fairseq_at_p_zero_and_one():
    x = torch.randn(8, 16)
    dropout = Dropout(0.5).eval()
    assert dropout(x) is x
    dropout.make_generation_fast_("dropout", retain_dropout=True)  # fairseq's --retain-dropout
    assert (dropout(x) == 0).any()
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_model_uses_it_everywhere_and_drops_in_training():
    torch.manual_seed(0)
    model = build_model("convs2s_iwslt_de_en", dropout=0.2)
    dropouts = [m for m in model.modules() if type(m).__name__.endswith("Dropout")]
    assert dropouts and all(isinstance(m, Dropout) for m in dropouts)
    src = torch.randint(4, 20, (2, 5))
    lengths = torch.tensor([5, 5])
    prev = torch.randint(4, 20, (2, 6))
    model.train()
    a, b = (model(src, lengths, prev)[0] for _ in range(2))
    assert not torch.allclose(a, b)
    model.eval()
    torch.testing.assert_close(model(src, lengths, prev)[0], model(src, lengths, prev)[0], rtol=0, atol=0)
