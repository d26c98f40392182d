"""A release environment's Python kept warm: torch and vLLM imported once, one forked child per
``python -c CODE`` or ``python -m MODULE`` command.

A command in a release environment spends most of its time importing: about 6 of the 8 s a
one-example ``kvgate check --target vllm`` takes are torch and vLLM's configuration and
connector modules. The suite runs dozens of such commands, so ``run`` hands each to a server
process started once per interpreter and environment (per pytest-xdist worker): the server has
imported those modules and forks a child per command. The child is the command as a fresh
``python -c``/``python -m`` would run it, in the same working folder, environment and hash
seed, with its stdout and stderr in files and its stdin empty: kvgate's own modules, Hypothesis
and pytest are imported by the child, never by the server, so every import-time read of the
environment happens in the command as before. A module the server could not import (an older
release lacks it) is imported, or fails, in the child as it would anywhere.

``KVGATE_NO_FORKSERVER=1`` runs every command as a plain subprocess.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path

# What the server imports before its first fork: what every kvgate command in a release
# environment imports anyway (each is tried alone; one a release lacks is left out).
PRELOAD = (
    "torch",
    "vllm.config",
    "vllm.distributed.kv_transfer.kv_connector.v1.base",
    "vllm.v1.core.sched.scheduler",
)

# The server, run as ``python -c SERVER`` (so that sys.path[0] is the working folder, as for
# the commands it forks): one JSON request a line on stdin, one JSON answer a line on stdout.
SERVER = r"""
import importlib, json, os, signal, sys, time
# the answers go out on a copy of stdout; what the imports print goes nowhere
protocol_out = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
for name in {preload!r}:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
def child(req):
    os.setsid()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    code = 0
    try:
        import runpy
        args = req["args"]
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[0] = ""
            exec(compile(args[1], "<string>", "exec"), {{"__name__": "__main__"}})
        else:
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code & 0xFF)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(req)
    deadline = time.monotonic() + req["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            answer = {{"code": os.waitstatus_to_exitcode(status)}}
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            answer = {{"timeout": True}}
            break
        time.sleep(0.02)
    protocol_out.write(json.dumps(answer) + "\n")
    protocol_out.flush()
"""


class _Busy(Exception):
    """The server runs another thread's command: this one runs as a plain subprocess."""


class _Server:
    def __init__(self, python: Path, env: dict[str, str], cwd: Path):
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [str(python), "-c", SERVER.format(preload=PRELOAD)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, req: dict) -> dict:
        """The server's answer; ``_Busy`` when another thread's command holds it."""
        if not self.lock.acquire(blocking=False):
            raise _Busy
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        finally:
            self.lock.release()
        if not line:
            raise RuntimeError("the release's fork server ended")
        return json.loads(line)

    def close(self) -> None:
        if self.alive():
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_SERVERS: dict[tuple, _Server] = {}


def _close_all() -> None:
    for server in _SERVERS.values():
        server.close()


atexit.register(_close_all)


def _server(python: Path, env: dict[str, str], cwd: Path) -> _Server:
    # what the interpreter reads at its start (the hash seed, the path) keys the server
    key = (
        str(python),
        str(cwd),
        tuple(sorted(i for i in env.items() if i[0].startswith("PYTHON"))),
    )
    server = _SERVERS.get(key)
    if server is None or not server.alive():
        server = _SERVERS[key] = _Server(python, env, cwd)
    return server


def run(
    python: Path, args: tuple[str, ...], env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess:
    """``python ARGS`` as ``subprocess.run(..., capture_output=True, text=True)`` would give it,
    forked from the warm server where ``ARGS`` is ``-c CODE ...`` or ``-m MODULE ...``."""
    plain = [str(python), *args]

    def as_subprocess() -> subprocess.CompletedProcess:
        return subprocess.run(
            plain, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )

    if os.environ.get("KVGATE_NO_FORKSERVER") == "1" or args[:1] not in (("-c",), ("-m",)):
        return as_subprocess()
    with tempfile.TemporaryDirectory(prefix="kvgate-fork-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        req = {
            "args": list(args),
            "env": env,
            "cwd": str(cwd),
            "stdout": str(out),
            "stderr": str(err),
            "timeout": timeout,
        }
        try:
            answer = _server(python, env, cwd).ask(req)
        except (_Busy, RuntimeError, OSError):  # busy with another thread's, or gone
            return as_subprocess()
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
    if answer.get("timeout"):
        raise subprocess.TimeoutExpired(plain, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(plain, answer["code"], stdout, stderr)
