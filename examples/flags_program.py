"""Every Trainer option from the command line or a flagfile (`tftrain.flags`).

    python examples/flags_program.py --model_dir=runs/flags --steps_per_loop=4 --epochs=3
    python examples/flags_program.py --flagfile=run.flags     # the same flags, one per line
    python examples/flags_program.py --helpfull               # the Trainer's flags, under tftrain.flags
"""

import keras
import numpy as np
from absl import app

import tftrain
from tftrain import flags

flags.define_trainer_flags()  # a flag for each Trainer option, fit's budget and the strategy


def main(argv):
    del argv  # the flags hold the configuration
    strategy = flags.strategy_from_flags()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    x = np.random.default_rng(0).random((64, 4), dtype="float32")
    trainer = tftrain.Trainer(model, "sgd", "mse", strategy=strategy, **flags.trainer_kwargs())
    history = trainer.fit(x, x.sum(axis=1), batch_size=8, verbose=0, **flags.fit_kwargs())
    print(f"trained {len(history.history['loss'])} epochs, {int(trainer.global_step)} steps, engine {trainer.timing.engine}")


if __name__ == "__main__":
    app.run(main)
