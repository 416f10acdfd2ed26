"""Put first on PYTHONPATH by `qaudit guard`. In every Python process the launch command runs
it only arms a finder (no import: a helper Python without torch, or one that never imports
Megatron, is not touched); the guard starts when the process first imports `megatron` or
`transformer_engine`. Then it runs the job's own `sitecustomize`, if there is one, as Python
would have (docs/guard.md). Never stops the process: a failure to start is said on stderr and
left for the launcher to report."""

import os
import sys

_ROOTS = ("megatron", "transformer_engine")
_HERE = os.path.dirname(os.path.abspath(__file__))


class _StartOnFirstImport:
    """A meta-path finder that finds nothing: at the first import of Megatron or TE it starts
    the guard, then lets that import go on as usual (the finders after it do the finding)."""

    def __init__(self):
        self.fired = False

    def find_spec(self, name, path=None, target=None):
        if self.fired or name not in _ROOTS:
            return None
        self.fired = True  # once, also when the start itself imports TE
        _start()
        done = sys.modules.get(name)
        if done is None:
            return None
        # The start imported it (--cpu boots TE): hand over that module, not a second run.
        # The import system takes the spec of a module already in sys.modules, so the
        # handing-over spec goes there; the module's own is put back when it is handed over.
        import importlib.util

        done.__spec__ = importlib.util.spec_from_loader(name, _Imported(done))
        return done.__spec__

    def invalidate_caches(self):
        pass


class _Imported:
    """The loader of a module already imported: the import system's module setup is undone."""

    def __init__(self, module):
        self.module = module
        self.spec, self.loader = module.__spec__, getattr(module, "__loader__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__, module.__loader__ = self.spec, self.loader


def _start():
    try:
        from qaudit.guard.child import start_from_environment

        start_from_environment()
    except Exception as exc:  # the guard's own failure: the launcher reports it (exit 3)
        message = f"the guard could not start in {sys.executable}: {type(exc).__name__}: {exc}"
        left = _leave_failure(message)
        if _mode() == "warn":
            sys.stderr.write(f"qaudit guard: {message}; the job runs on unguarded "
                             "(--mode warn)\n")
            return
        # --mode stop: this process runs Megatron and cannot be vouched for; it ends here,
        # before anything trains (the import under way would only fail further on). The
        # launcher says why, last; said here only if it cannot be told.
        if not left:
            sys.stderr.write(f"qaudit guard: {message}\n")
            sys.stderr.flush()
        os._exit(3)


def _mode():
    import json

    try:
        return json.loads(os.environ.get("QAUDIT_GUARD", "")).get("mode")
    except (ValueError, AttributeError):
        return None


def _leave_failure(message):
    results = os.environ.get("QAUDIT_GUARD_RESULTS", "")
    if not results:
        return False
    path = os.path.join(results, f"start-failed-{os.getpid()}.txt")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with os.fdopen(os.open(path, flags, 0o600), "w") as handle:
            handle.write(message[:2000])
        return True
    except OSError:
        return False


def _run_the_jobs_own():
    """Import `sitecustomize` again by the normal machinery with this directory out of the
    search: the job's own module (source, .pyc or package) runs once, under its own spec, and
    becomes sys.modules["sitecustomize"]. Its exceptions propagate as they would without the
    guard (Python's site module reports them)."""
    sys.path[:] = [entry for entry in sys.path
                   if os.path.abspath(entry or os.curdir) != _HERE]
    sys.path_importer_cache.pop(_HERE, None)
    ours = sys.modules.pop(__name__, None)
    try:
        import sitecustomize  # noqa: F401  (the job's, found past this directory)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        # The job has none: this module stays (the import that runs it expects an entry).
        sys.modules[__name__] = ours


if os.environ.get("QAUDIT_GUARD") and not any(
        isinstance(finder, _StartOnFirstImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _StartOnFirstImport())
_run_the_jobs_own()
