"""``python -m fairseq_convs2s.compat``: print the table of the plugin's fixes to fairseq."""

from . import FIXES

for fix in FIXES:
    when = "python -m fairseq_convs2s.train" if fix.training else "importing the plugin"
    print(f"{fix.name}\n  without it: {fix.without_it}\n  wraps: {fix.wraps}\n  installed by: {when}")
