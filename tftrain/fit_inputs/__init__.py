"""Fit's inputs: what `fit`, `evaluate` and `predict` take, and the passes over it.

- `inputs`: `adapt`, the inputs through Keras's own adapters (what
  `model.fit` accepts), and `split_validation`.
- `distributed_data`: a `tf.distribute.DistributedDataset` input, read as
  distributed.
- `epoch_plan`: `EpochPlan`, the pass-by-pass plan over an adapted input
  (shaped like Keras's `EpochIterator`): which iterator each epoch reads and
  how many steps it runs.
- `epoch_order`: the order of a shuffled array pass, kept so that a
  checkpoint can resume it.
- `fit_checks`: checks of the data against the model and the call.

The named datasets the programs load (`tftrain.data.load`, `info`) are in
`tftrain.data`, independent of this package.

May import: `tftrain.options`, `compat`, `errors`. Nothing above it.
"""
