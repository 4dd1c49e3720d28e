from . import convs2s, presets  # noqa: F401  (registers the model and its --arch presets)
from .convs2s import ConvS2SModel  # noqa: F401
