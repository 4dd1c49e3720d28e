"""The signals every test's commands start with: SIGINT and SIGHUP at their defaults, as a terminal starts a command.
A shell that runs the suite in the background ignores SIGINT, and ``nohup`` ignores SIGHUP; a command started with a
signal ignored keeps it ignored (Python, the recipes' driver and the plugin's training, as they should), and the tests
that stop commands with these signals would then fail by how the suite was launched."""

import signal


def pytest_configure(config) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (the child of an exec starts with SIG_DFL: Ctrl-C)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
