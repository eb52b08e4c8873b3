"""SimCLR (Chen et al., 2020) self-supervised pretraining, written on tftrain."""
