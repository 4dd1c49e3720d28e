"""ConvS2S (Gehring et al., 2017) as a fairseq plugin: ``--user-dir fairseq_convs2s --arch convs2s_*``.

Importing the package registers the ``convs2s`` model, its ``--arch`` presets and ``--criterion sequence_risk``,
lets fairseq's checkpoints load under torch's safe unpickler and without the pre-trained embedding files a model was
trained from (``checkpoint_compat``), makes fairseq's diverse beam search decode more than one batch and refuses a
beam or n-best of none (``search_compat``), warns when fairseq's batching leaves sentences out or has none left, and
names an empty binarized split where fairseq's loader fails on it unnamed (``batching_compat``).
"""

from .batching_compat import refuse_empty_splits, warn_on_dropped_sentences
from .checkpoint_compat import allow_fairseq_checkpoints, build_models_to_load
from .search_compat import fix_diverse_beam_search, refuse_empty_beams

allow_fairseq_checkpoints()
build_models_to_load()
fix_diverse_beam_search()
refuse_empty_beams()
warn_on_dropped_sentences()
refuse_empty_splits()

from . import criterions, models  # noqa: E402,F401  (registers the model, its presets and the criterion)
from .models import ConvS2SModel  # noqa: E402,F401

__version__ = "0.1.0"
