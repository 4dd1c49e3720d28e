from . import fused_label_smoothed, sequence_risk  # noqa: F401  (registers the criteria)
from .fused_label_smoothed import FusedLabelSmoothedCrossEntropyCriterion  # noqa: F401
from .sequence_risk import CandidateSet, SequenceRiskConfig, SequenceRiskCriterion  # noqa: F401
