"""The code_gen harness that runs inside the confined child (``nemo_gym.sandbox.isolation``).

The child confines itself first (no new processes, no network, writes only in the working
directory), then calls :func:`main` with the job. ``solution.py`` in the working directory is
compiled and run: as ``__main__`` (stdin → stdout) in ``stdio`` mode, or imported as module
``solution`` with ``fn_name(*args)`` called and its JSON-encoded return value written to stdout
in ``call`` mode. Standard library only: the project is not importable in the child.

Exit status: 0 the code ran to the end; 10 it does not compile; 11 it raised; 12 the function
to call is missing; 13 its return value is not JSON. A line starting with ``__NG_SANDBOX__`` on
stderr says why.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import traceback
import types
from typing import Any

EXIT_OK = 0
EXIT_COMPILE_ERROR = 10
EXIT_RUNTIME_ERROR = 11
EXIT_MISSING_FUNCTION = 12
EXIT_BAD_RETURN = 13
MARKER = "__NG_SANDBOX__"


def _report(message: str) -> None:
    try:
        os.write(2, f"\n{MARKER} {message}\n".encode(errors="replace"))
    except OSError:
        pass


def _exception_line(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return (lines[-1] if lines else type(exc).__name__).strip()


def run_code(job: dict[str, Any], source: str) -> int:
    """Compile and run ``source`` as the job's mode says; returns the exit status."""
    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
        _report(f"compile error: {_exception_line(exc)}")
        return EXIT_COMPILE_ERROR
    run = job["run"]
    call_mode = run["mode"] == "call"
    if call_mode:
        result_fd = os.dup(1)  # the result goes here; the code's own prints go nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    # Function-call tasks import the code as a module, so ``if __name__ == "__main__":`` does not run.
    module = types.ModuleType("solution" if call_mode else "__main__")
    module.__file__ = os.path.join(job["workdir"], "solution.py")
    module.__dict__["__builtins__"] = builtins
    sys.modules[module.__name__] = module
    sys.argv = ["solution.py"]
    # As if the code were run as a script: its folder first (-I left the child's folder out).
    sys.path.insert(0, job["workdir"])
    try:
        exec(code, module.__dict__)
        if not call_mode:
            return EXIT_OK
        fn_name = run["fn_name"]
        solution_class = module.__dict__.get("Solution")
        if isinstance(solution_class, type) and hasattr(solution_class, fn_name):
            function = getattr(solution_class(), fn_name)
        elif callable(module.__dict__.get(fn_name)):
            function = module.__dict__[fn_name]
        else:
            _report(f"function {fn_name!r} not found (neither Solution.{fn_name} nor a top-level function)")
            return EXIT_MISSING_FUNCTION
        value = function(*run["args"])
    except SystemExit as exc:
        if not call_mode and exc.code in (None, 0):
            return EXIT_OK
        _report(f"runtime error: SystemExit({exc.code!r})")
        return EXIT_RUNTIME_ERROR
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is its own failure
        _report(f"runtime error: {_exception_line(exc)}")
        return EXIT_RUNTIME_ERROR
    if isinstance(value, tuple):
        value = list(value)
    try:
        encoded = json.dumps(value)
    except (TypeError, ValueError) as exc:
        _report(f"return value is not JSON-serializable: {exc}")
        return EXIT_BAD_RETURN
    data = (encoded + "\n").encode()
    while data:
        written = os.write(result_fd, data)
        data = data[written:]
    return EXIT_OK


def main(job: dict[str, Any]) -> int:
    """Run ``solution.py`` of the job's working directory; returns the exit status."""
    with open(os.path.join(job["workdir"], "solution.py"), encoding="utf-8") as f:
        source = f.read()
    status = run_code(job, source)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    return status
