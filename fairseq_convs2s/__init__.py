"""ConvS2S (Gehring et al., 2017) as a fairseq plugin: ``--user-dir fairseq_convs2s --arch convs2s_*``.

Importing the package registers the ``convs2s`` model, its ``--arch`` presets, the criteria
(``--criterion fused_label_smoothed_cross_entropy``, ``--criterion sequence_risk``) and the learning-rate schedule
``--lr-scheduler budget``, and installs the plugin's fixes
to fairseq (``compat``: one file per fix, listed in one table there).
"""

import sys

try:
    from . import compat

    compat.install()

    from . import budget_schedule, criterions, models  # noqa: F401  (registers the model, presets, criteria, schedule)
    from .models import ConvS2SModel  # noqa: F401
except KeyboardInterrupt:
    if sys.argv[:1] != ["-m"]:  # (imported by a program, which handles its interrupts)
        raise
    # Ctrl-C in the seconds `python -m fairseq_convs2s.TOOL` spends importing torch and fairseq: one line, as later
    print("fairseq_convs2s: interrupted while starting", file=sys.stderr)
    sys.exit(130)

__version__ = "0.1.0"
