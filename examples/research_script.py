"""A research script: its own flags, every Trainer option as a flag, a dry run first, the run in TensorBoard's HParams tab.

    python examples/research_script.py --model_dir=runs/lr0.003 --learning_rate=0.003
    python examples/research_script.py --flagfile=base.flags --model_dir=runs/lr0.0003 --learning_rate=0.0003
    tensorboard --logdir runs        # the HParams tab: one row per run

docs/research_scripts.md walks through it; tests/examples/test_research_script.py runs it.
"""

import keras
import numpy as np
from absl import app
from absl import flags as absl_flags

import tftrain
from tftrain import flags

absl_flags.DEFINE_float("learning_rate", 0.003, "Adam's learning rate.")
absl_flags.DEFINE_integer("width", 32, "Units of the hidden layer.")
absl_flags.DEFINE_integer("batch_size", 64, "Global batch size.")
absl_flags.DEFINE_integer("num_examples", 4096, "Examples of the generated data.")
absl_flags.DEFINE_boolean("dry_run", True, "First run each stage once (train, validate, checkpoint, predict).")
flags.define_trainer_flags()  # --model_dir, --steps_per_loop, --jit_compile, --epochs, --use_gpu, ...
FLAGS = absl_flags.FLAGS


def main(argv):
    del argv  # the flags hold the configuration
    rng = np.random.default_rng(0)  # generated data: 4 classes, each the largest of 4 projections of x
    x = rng.normal(size=(FLAGS.num_examples, 16)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(16, 4)), axis=1)
    strategy = flags.strategy_from_flags()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((16,)), keras.layers.Dense(FLAGS.width, activation="relu"), keras.layers.Dense(4),
        ])  # fmt: skip
    trainer = tftrain.Trainer(
        model, keras.optimizers.Adam(FLAGS.learning_rate), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], strategy=strategy, **flags.trainer_kwargs(),
    )  # fmt: skip
    fit_args = dict(x=x, y=y, batch_size=FLAGS.batch_size, validation_split=0.25, verbose=2, **flags.fit_kwargs())
    if FLAGS.dry_run:
        trainer.check(**fit_args)  # seconds; raises DryRunError naming the stage that failed
    history = trainer.fit(**fit_args)
    print(f"val_accuracy {history.history['val_accuracy'][-1]:.3f} after {int(trainer.global_step)} steps")


if __name__ == "__main__":
    app.run(main)
