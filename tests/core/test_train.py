import re

import pytest
import torch

from multigpu.core.data import get_dataset, make_loader, tensors
from multigpu.core.models import ConvNet
from multigpu.core.reproducibility import set_seed
from multigpu.core.train import History, TrainConfig, evaluate, evaluation_sums, train


def run(epochs=2, progress=False):
    config = TrainConfig(epochs=epochs, batch_size=64, lr=0.05, seed=0)
    set_seed(config.seed)
    model = ConvNet()
    loader = make_loader(get_dataset("digits"), config.batch_size, seed=config.seed)
    test = make_loader(get_dataset("digits", train=False), 256, shuffle=False)
    history = train(
        model, loader, config, device="cpu", test_loader=test, progress=progress
    )
    return model, history, test


def test_training_is_repeatable_with_the_same_seed():
    model_a, history_a, _ = run()
    model_b, history_b, _ = run()
    assert history_a.train_loss == history_b.train_loss
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)


def test_training_learns_digits():
    model, history, test = run(epochs=6)
    assert len(history.train_loss) == len(history.seconds) == 6
    assert len(history.step_loss) == 6 * 23  # 1437 samples in batches of 64
    assert history.train_loss[-1] < 0.5 * history.train_loss[0]
    assert history.test_accuracy[-1] > 0.8
    assert evaluate(model, test, "cpu") == pytest.approx(
        (history.test_loss[-1], history.test_accuracy[-1])
    )


def test_single_step_is_plain_sgd():
    set_seed(0)
    model = torch.nn.Linear(3, 2)
    X, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(X), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    loader = [(X, y)]
    train(
        model,
        loader,
        TrainConfig(epochs=1, lr=0.1, momentum=0.0),
        "cpu",
        progress=False,
    )
    for p, p0, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g)


def test_history_holds_the_final_weights_on_the_cpu():
    model, history, _ = run(epochs=1)
    assert history.parameters.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert history.parameters[name].device.type == "cpu"
        assert torch.equal(history.parameters[name], tensor)
    # A copy: training on does not change the weights the history holds.
    before = {name: t.clone() for name, t in history.parameters.items()}
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert all(torch.equal(history.parameters[k], t) for k, t in before.items())


def test_step_losses_average_to_the_epoch_loss():
    _, history, _ = run(epochs=1)
    batch_sizes = [64] * 22 + [1437 - 22 * 64]  # the last batch has 29 samples
    weighted = sum(loss * n for loss, n in zip(history.step_loss, batch_sizes))
    assert weighted / 1437 == pytest.approx(history.train_loss[0], rel=1e-12)


def test_evaluate_restores_training_mode():
    model = ConvNet().train()
    loader = make_loader(get_dataset("digits", train=False), 120, shuffle=False)
    loss, accuracy = evaluate(model, loader, "cpu")
    assert model.training and loss > 0 and 0 <= accuracy <= 1


def test_evaluate_one_batch_of_tensors_equals_the_loader():
    model = ConvNet()
    dataset = get_dataset("digits", train=False)
    X, y = tensors(dataset)  # (360, 1, 8, 8), (360,)
    by_loader = evaluate(model, make_loader(dataset, 100, shuffle=False))
    assert evaluate(model, [(X, y)]) == pytest.approx(by_loader, rel=1e-5)


def test_evaluation_sums_of_parts_add_up_to_the_whole():
    set_seed(0)
    model = ConvNet().train()
    X, y = tensors(get_dataset("digits", train=False))  # (360, 1, 8, 8), (360,)
    batches = [(X[:100], y[:100]), (X[100:250], y[100:250]), (X[250:], y[250:])]
    loss, correct, count = evaluation_sums(model, batches)
    assert model.training  # restored
    assert count == 360 and isinstance(correct, int)
    expected = torch.nn.functional.cross_entropy(model.eval()(X), y, reduction="sum")
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    assert correct == (model(X).argmax(dim=1) == y).sum().item()
    parts = [evaluation_sums(model, [batch]) for batch in batches]
    assert sum(part[0] for part in parts) == loss  # the same additions, in order
    assert [sum(part[i] for part in parts) for i in (1, 2)] == [correct, count]
    assert evaluate(model, batches) == (loss / count, correct / count)
    assert evaluation_sums(model, []) == (0.0, 0, 0)  # an empty shard adds nothing


def test_evaluate_given_parameters_leaves_the_model_unchanged():
    set_seed(0)
    model, other = ConvNet(), ConvNet()  # different initial weights
    X, y = tensors(get_dataset("digits", train=False))
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with_other = evaluate(model, [(X, y)], parameters=other.state_dict())
    assert with_other == evaluate(other, [(X, y)])
    assert with_other != evaluate(model, [(X, y)])
    assert all(torch.equal(model.state_dict()[k], t) for k, t in before.items())


def test_progress_bar_text_has_no_timing(capsys):
    run(epochs=1, progress=True)
    err = capsys.readouterr().err
    assert "epoch 1/1: 100%|" in err and "23/23, loss=" in err
    # no rate, no elapsed or remaining time (tqdm's default shows [00:01<00:00])
    assert "it/s" not in err and "<" not in err
    assert not re.search(r"\d\d:\d\d", err)


def test_history_rows_are_rounded_and_free_of_timings():
    history = History([1.234567], [0.5], [0.912345], [3.2])
    assert history.rows() == [
        {"epoch": 1, "train_loss": 1.235, "test_loss": 0.5, "test_accuracy": 0.9123}
    ]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"batch_size": 0}, "batch_size must be an integer of at least 1"),
        ({"epochs": 0}, "epochs must be an integer of at least 1"),
        ({"epochs": 2.0}, r"got 2\.0\. .* e\.g\. epochs=2\."),
        ({"lr": 0.0}, "lr must be positive"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            {"lr": "0.1"},
            TypeError,
            "lr must be a number, got '0.1' (str). Pass e.g. lr=0.05.",
        ),
        ({"lr": float("nan")}, ValueError, "lr must be a finite number, got nan."),
        ({"lr": float("inf")}, ValueError, "lr must be a finite number, got inf."),
        ({"lr": -0.1}, ValueError, "lr must be positive, got -0.1."),
        (
            {"momentum": -0.5},
            ValueError,
            "momentum must not be negative, got -0.5. Pass e.g. momentum=0.9, or "
            "0.0 for none.",
        ),
        ({"momentum": True}, TypeError, "momentum must be a number, got True (bool)."),
    ],
)
def test_config_numbers_are_checked_up_front(kwargs, error, message):
    with pytest.raises(error) as raised:
        TrainConfig(**kwargs)
    assert str(raised.value).startswith(message)


def test_zero_momentum_is_allowed():
    assert TrainConfig(momentum=0).momentum == 0


def test_an_empty_loader_is_a_clear_error():
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0))
    loader = make_loader(empty, batch_size=4, shuffle=False)
    with pytest.raises(ValueError) as raised:
        train(ConvNet(), loader, TrainConfig(epochs=1), device="cpu", progress=False)
    assert str(raised.value).startswith("train_loader gave no batches")
    with pytest.raises(ValueError) as raised:
        evaluate(ConvNet(), loader, device="cpu")
    assert str(raised.value).startswith("evaluate got no samples")
    with pytest.raises(ValueError, match="evaluate got no samples"):
        evaluate(ConvNet(), [])


def test_reusing_a_loader_gives_the_same_run():
    config = TrainConfig(epochs=2, seed=0)
    loader = make_loader(get_dataset("digits"), config.batch_size, seed=config.seed)
    models = []
    for _ in range(2):  # the same loader object twice: the order must not drift
        set_seed(config.seed)
        models.append(ConvNet())
        train(models[-1], loader, config, device="cpu", progress=False)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
