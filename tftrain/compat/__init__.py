"""Every private Keras and TensorFlow API tftrain uses, each checked against the installed version.

The bottom layer, above `tftrain.errors` alone: it imports nothing else from
tftrain. Code elsewhere reaches a private Keras/TF name only through
`keras_internals`, which names each one, checks it when first used, and
raises `tftrain.errors.KerasInternalsError` with both versions where it is
missing.
"""
