from . import sequence_risk  # noqa: F401  (registers --criterion sequence_risk)
from .sequence_risk import CandidateSet, SequenceRiskConfig, SequenceRiskCriterion  # noqa: F401
