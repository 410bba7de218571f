"""Settings for the whole test suite."""

import os
import signal

# Shared logins (dagster-slurm login) of whoever runs the tests are not the tests' business:
# the tests use a directory of their own, where the shared-login tests start theirs.
os.environ["DAGSTER_SLURM_LOGIN_DIR"] = f"/tmp/dslurm-test-logins-{os.getuid()}"

# A pytest started in the background (``&``, some CI runners) ignores SIGINT. Dagster gives
# SIGTERM the handler of SIGINT whenever it restores its interrupt handlers (after each
# in-process ``materialize``), so from then on this process would ignore SIGTERM too, and
# every job script a later test starts would inherit both as ignored: a shell cannot trap a
# signal ignored when it started, so the tests that signal job scripts would hang. With
# Python's own SIGINT handler in place, a run in the background behaves as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The same for SIGHUP under nohup: the scripts the tests hang up on must not inherit it ignored.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist, the modules with a test marked ``slow`` go first (the order is
    otherwise kept): the workers take modules in collection order, and the few modules that
    take 20 to 50 s sort near the end, where they left one worker busy while the others
    had nothing left to do. Without xdist the order is the collection's."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_modules = {item.nodeid.split("::")[0] for item in items
                    if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)
