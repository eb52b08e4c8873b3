"""`tftrain.examples.models`: one definition of the classifiers for the program and the benchmark."""

from tftrain.bench import workloads
from tftrain.examples import fashion_mnist, models


def test_the_program_and_the_benchmark_train_the_same_networks():
    assert fashion_mnist.MODELS == {"mlp": models.build_mlp, "cnn": models.build_cnn}
    assert workloads.WORKLOADS["mlp"].build_model is models.build_mlp
    assert workloads.WORKLOADS["cnn"].build_model is models.build_cnn


def test_the_classifiers_take_28x28_images_and_give_10_logits():
    mlp, cnn = models.build_mlp(), models.build_cnn()
    assert mlp.input_shape == (None, 28, 28) and cnn.input_shape == (None, 28, 28, 1)
    assert mlp.output_shape == cnn.output_shape == (None, models.NUM_CLASSES)
