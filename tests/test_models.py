import pytest
import torch

from multigpu.models import ConvNet, count_parameters, resnet


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
    "kwargs", [{"width": 0}, {"num_classes": -1}, {"in_channels": 1.5}]
)
def test_bad_sizes_are_clear_errors(kwargs):
    with pytest.raises(ValueError, match=r"ConvNet needs \w+ >= 1"):
        ConvNet(**kwargs)


def test_resnet_adapts_to_grey_images():
    model = resnet(num_classes=10, in_channels=1).eval()
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    assert count_parameters(model) > 10_000_000
