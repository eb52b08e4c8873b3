"""The GAN template trains under the Trainer and model.fit, with both optimizers stepping."""

import importlib.util
import math
import pathlib
import re

import keras
import pytest
from absl import flags

import tftrain

TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "gan.py"


@pytest.fixture(scope="module")
def gan():
    spec = importlib.util.spec_from_file_location("gan_template", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines no flags: those are defined under __main__
    return module


def run_main(gan, monkeypatch, args):
    """Runs the template's `main` with its own flags parsed from `args`."""
    flag_values = flags.FlagValues()
    gan.define_flags(flag_values)
    flag_values(["gan.py", *args])
    monkeypatch.setattr(gan, "FLAGS", flag_values)
    gan.main(["gan.py"])


@pytest.mark.parametrize(
    "args",
    [
        ["--loop=trainer", "--steps_per_loop=5"],
        ["--loop=fit"],
        ["--loop=trainer", "--use_tf_function=false"],
        ["--loop=fit", "--use_tf_function=false"],
    ],
    ids=["trainer_loop5", "fit", "trainer_eager", "fit_eager"],
)
def test_main_trains_both_networks(gan, monkeypatch, capsys, args):
    run_main(gan, monkeypatch, ["--epochs=2", "--steps_per_epoch=5", "--batch_size=32", *args])
    out = capsys.readouterr().out
    losses = re.search(r"final d_loss=(\S+) g_loss=(\S+)", out)
    assert losses, out[-2000:]
    assert all(math.isfinite(float(value)) for value in losses.groups())
    assert "optimizer steps: discriminator=10 generator=10" in out
    assert re.search(r"samples within 0.25 of a mode: \S+% at init -> \S+% trained", out)
    assert "step time median" in out  # the timing report of either loop


def test_compile_builds_both_optimizers(gan):
    model = gan.GAN()
    d_optimizer, g_optimizer = keras.optimizers.Adam(), keras.optimizers.Adam()
    model.compile(d_optimizer, g_optimizer, keras.losses.BinaryCrossentropy(from_logits=True))
    assert d_optimizer.built and g_optimizer.built
    assert model.optimizer is None
    assert [m.name for m in model.metrics] == ["d_loss", "g_loss"]


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_one_trace_in_a_k_step_loop(gan, loop):
    result = gan.train(2, 6, 16, loop, True, steps_per_loop=3)
    assert result["d_steps"] == result["g_steps"] == 12
    # Optimizers built in `compile`: no second trace for creating their variables.
    assert result["trace_count"] == 1


def test_gan_learns_the_ring(gan):
    result = gan.train(3, 500, 256, "trainer", True, steps_per_loop=50)
    assert result["near_mode_before"] < 0.05
    assert result["near_mode_after"] > 0.4, result
    assert result["modes_covered"] >= 6, result


def test_unknown_loop_is_a_clear_error(gan):
    with pytest.raises(ValueError, match="Expected 'trainer' or 'fit'"):
        gan.train(1, 1, 8, "estimator", True)
    flag_values = flags.FlagValues()
    gan.define_flags(flag_values)
    with pytest.raises(flags.IllegalFlagValueError, match="trainer|fit"):
        flag_values(["gan.py", "--loop=estimator"])


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_loss_trackers_reset_each_epoch(gan, loop):
    model = gan.GAN()
    model.compile(
        keras.optimizers.Adam(), keras.optimizers.Adam(), keras.losses.BinaryCrossentropy(from_logits=True)
    )
    data = gan.make_data(batch_size=16, num_examples=64)
    if loop == "trainer":
        tftrain.Trainer(model).fit(data, epochs=2, steps_per_epoch=3, verbose=0)
    else:
        model.fit(data, epochs=2, steps_per_epoch=3, verbose=0)
    # Each tracker averaged the last epoch's 3 steps only.
    assert float(model.d_loss_tracker.count) == float(model.g_loss_tracker.count) == 3.0


def test_unbuilt_optimizers_cost_a_second_trace_in_a_k_step_loop(gan):
    # What the template's docstring says: the Trainer builds only `model.optimizer`;
    # optimizers left unbuilt still work inside the k-step loop, but trace twice.
    class LazyGAN(gan.GAN):
        def compile(self, d_optimizer, g_optimizer, loss_fn, **kwargs):
            keras.Model.compile(self, optimizer=None, **kwargs)
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    model = LazyGAN()
    model.compile(
        keras.optimizers.Adam(), keras.optimizers.Adam(), keras.losses.BinaryCrossentropy(from_logits=True)
    )
    assert not model.d_optimizer.built
    trainer = tftrain.Trainer(model, steps_per_loop=3)
    trainer.fit(gan.make_data(batch_size=16, num_examples=64), epochs=2, steps_per_epoch=3, verbose=0)
    assert int(model.d_optimizer.iterations) == int(model.g_optimizer.iterations) == 6
    assert trainer.timing.trace_count == 2
