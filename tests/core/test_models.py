import pytest
import torch

from multigpu.core.models import ConvNet, count_parameters, resnet


@pytest.mark.parametrize("channels,size", [(1, 8), (1, 28), (3, 32)])
def test_convnet_maps_any_image_size_to_logits(channels, size):
    model = ConvNet(in_channels=channels, num_classes=7)
    assert model(torch.randn(5, channels, size, size)).shape == (5, 7)


def test_convnet_parameter_count_is_small_and_known():
    # conv 1->16 (144 + 16), conv 16->32 (4608 + 32), linear 128->10 (1280 + 10)
    assert count_parameters(ConvNet()) == 160 + 4640 + 1290


def test_batch_norm_variant_has_running_statistics():
    model = ConvNet(batch_norm=True)
    buffers = dict(model.named_buffers())
    assert "features.1.running_mean" in buffers
    assert all(
        m.bias is None for m in model.modules() if isinstance(m, torch.nn.Conv2d)
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"width": 0},
            "width must be an integer of at least 1, got 0. Pass a whole "
            "number, e.g. ConvNet(width=16).",
        ),
        (
            {"num_classes": -1},
            "num_classes must be an integer of at least 1, got "
            "-1. Pass a whole number, e.g. ConvNet(num_classes=10).",
        ),
        (
            {"in_channels": 1.5},
            "in_channels must be an integer of at least 1, got "
            "1.5. Pass a whole number, e.g. ConvNet(in_channels=1).",
        ),
        (
            {"width": True},
            "width must be an integer of at least 1, got True. Pass "
            "a whole number, e.g. ConvNet(width=16).",
        ),
    ],
)
def test_bad_sizes_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError) as caught:
        ConvNet(**kwargs)
    assert str(caught.value) == message


def test_resnet_adapts_to_grey_images():
    model = resnet(num_classes=10, in_channels=1).eval()
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    assert count_parameters(model) > 10_000_000


def test_temperature_net_divides_the_convnet_logits():
    from multigpu.core.models import TemperatureNet

    torch.manual_seed(0)
    model = TemperatureNet()
    x = torch.randn(3, 1, 8, 8)
    logits = model.net(x)  # (3, 10)
    torch.testing.assert_close(model(x), logits)
    torch.testing.assert_close(model(x, temperature=2.0), logits / 2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_net_returns_the_cross_entropy(reduction):
    from multigpu.core.models import LossNet

    torch.manual_seed(0)
    net = ConvNet()
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 3, 3, 9])
    expected = torch.nn.functional.cross_entropy(net(x), y, reduction=reduction)
    torch.testing.assert_close(LossNet(net, reduction)(x, y), expected)
    assert LossNet(net).net is net  # wraps the classifier, does not copy it


def test_flat_gradients_is_the_gradient_of_the_loss_only():
    from multigpu.core.models import flat_gradients

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3)
    model(x).sum().backward()  # stale gradients, to be zeroed first
    grad = flat_gradients(model, model(x).pow(2).sum())
    weight_grad = 2 * (model(x).detach().T @ x)  # (2, 3)
    bias_grad = 2 * model(x).detach().sum(0)  # (2,)
    torch.testing.assert_close(grad, torch.cat([weight_grad.flatten(), bias_grad]))


def test_batch_norm_couples_the_rows_of_a_batch_in_training_only():
    torch.manual_seed(0)
    x = torch.randn(6, 1, 8, 8)
    for batch_norm, coupled in ((False, False), (True, True)):
        model = ConvNet(batch_norm=batch_norm)
        first_rows = model(x)[:3]  # the same three rows, in a batch of 6 ...
        alone = model(x[:3])  # ... and on their own
        assert torch.allclose(first_rows, alone, atol=1e-6) is not coupled
    model.eval()  # running statistics instead of the batch's: rows independent
    torch.testing.assert_close(model(x)[:3], model(x[:3]))
