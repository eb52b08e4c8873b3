"""Every private Keras and TensorFlow API tftrain uses, each checked against the installed version.

The bottom layer, above `tftrain.errors` alone: it imports nothing else from
tftrain. Code elsewhere reaches a private Keras name only through
`keras_internals` and a private TensorFlow name only through `tf_internals`;
both name each one, check it when first used (through `private_api`), and
raise `tftrain.errors.KerasInternalsError` with both versions where it is
missing. `versions` checks the installed pair at `import tftrain`.
"""
