"""A fork server for the tests' `python run.py ...` and `python -m lightspeed.framework.tools.* ...` commands.

About 150 such commands run in the default suite, and each spent ~2 s of its few seconds importing jax, flax,
Hydra, matplotlib and the plugins. The server (one per pytest-xdist worker, started with it) imports them once,
before any JAX backend exists, and forks a fresh process per command: the command's own pid (signals,
psutil's children and sockets see the real process), its stdin, stdout and stderr, working directory, environment,
sys.argv and sys.path as `python ...` would set them; run.py or the module runs as `__main__`, and its SystemExit or
exception leaves through the interpreter, which ends the process as it ends any script (threads joined, atexit
handlers run, a traceback printed); the client gets its exit status, negative where a signal killed it, as Popen's.

What a forked command shares with the server, unlike a fresh interpreter: the modules imported above (so what
they read from the environment at import time is the server's: a command whose environment differs from the
server's in what is read at start or import starts a real interpreter instead, `Server.mismatch` says why) and str
hashing's random seed. Anything not eligible, or any failure to reach the server, runs as a plain subprocess.
LIGHTSPEED_TESTS_FORK=0 turns the server off; LIGHTSPEED_TESTS_FORK_LOG=FILE writes why each command that was not
forked was not.

    server:  python tests/forkserver.py SOCKET  (its stdin a pipe from the worker: end of file ends it)
    request: 8-byte length, then JSON {argv, cwd, env, path}, with the command's stdin, stdout, stderr passed
             as file descriptors (SCM_RIGHTS); answers "pid N\\n", then "exit CODE\\n" (negative: killed by -CODE)
"""
import atexit
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
RUN_PY = str(ROOT / "run.py")
FORKED_MODULES = ("lightspeed.framework.tools.",)  # `python -m` commands the server runs; others start an interpreter
# read when a run starts its backend or logger, not at import: a command may set them to its own values
ALLOWED_TO_DIFFER = ("XLA_FLAGS", "LIGHTSPEED_", "WANDB_", "PYTEST_", "COLUMNS", "LINES")
# read when the module named imports (libraries the tests import in their own process set them there): where the
# server has not imported it, the forked command imports it after taking its own environment, as a fresh one would
READ_AT_IMPORT_BY = {"MUJOCO_GL": "mujoco", "PYOPENGL_PLATFORM": "OpenGL", "CRC32C_SW_MODE": "tensorboardX"}
# what every command imports before it does anything (the tools' own modules are not: runpy warns about those)
PRELOADED = ("lightspeed.framework.app.main", "lightspeed.framework.app.train", "lightspeed.envs",
             "lightspeed.algorithms", "lightspeed.framework.run.policy", "lightspeed.framework.core.evaluation",
             "PIL.Image", "rliable.library", "scipy.stats")


# ---------------------------------------------------------------------------------------------------------------
# The server


def preload() -> None:
    import importlib

    import matplotlib

    matplotlib.use("Agg")  # as framework/run/plots.py does before its first plot
    for module in (*PRELOADED, "matplotlib.pyplot"):
        importlib.import_module(module)


def receive(connection: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    size = struct.unpack("!Q", data[:8])[0]
    data = data[8:]
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the request ended early")
        data += chunk
    return json.loads(data), fds


def run_command(request: dict, fds: list[int]) -> None:
    """In the forked process: become `python ARGV`. Never returns: its SystemExit, exception or KeyboardInterrupt
    leaves through the server's frames to the interpreter, which ends the process as it ends any script's."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):  # stdin, stdout, stderr
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = request["path"]
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0], as -m does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)  # the script returned


def supervise(connection: socket.socket, request: dict, fds: list[int]) -> None:
    """In a forked supervisor: fork the command, tell the client its pid, then how it ended. Never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        connection.close()
        run_command(request, fds)
    for fd in fds:
        os.close(fd)
    try:
        connection.sendall(f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:  # the client went away: the command runs on as an orphan would
        pass
    os._exit(0)


def serve(path: str) -> None:
    sys.path[0] = str(ROOT)  # as run.py's own directory is for `python run.py`, not this file's
    preload()
    with open(path + ".tmp", "w") as report:  # what the imports left: the environment and the modules
        json.dump({"env": dict(os.environ), "modules": sorted(sys.modules)}, report)
    os.rename(path + ".tmp", path + ".json")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped without a wait
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:  # the worker is gone
                return
            connection, _ = listener.accept()
            try:
                request, fds = receive(connection)
            except (OSError, ValueError, struct.error):  # not a request: nothing to run
                connection.close()
                continue
            if os.fork() == 0:
                selector.close()
                listener.close()
                supervise(connection, request, fds)
            connection.close()
            for fd in fds:
                os.close(fd)


# ---------------------------------------------------------------------------------------------------------------
# The client


class ForkedProcess:
    """What tests use of subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True), for a forked command."""

    def __init__(self, args: list[str], connection: socket.socket, pid: int, stdout: int, stderr: int):
        self.args, self.pid, self.returncode = args, pid, None
        self._connection, self._status = connection, b""
        self._pipes = {stdout: bytearray(), stderr: bytearray()}
        self._stdout, self._stderr = stdout, stderr
        self._open = {stdout, stderr}

    def _read_status(self, timeout: Optional[float]) -> None:
        self._connection.settimeout(timeout)
        try:
            while not self._status.endswith(b"\n"):
                chunk = self._connection.recv(64)
                if not chunk:
                    raise RuntimeError(f"the fork server lost {self.args}: no exit status")
                self._status += chunk
        except (TimeoutError, BlockingIOError):  # a timeout, or none (0) and nothing there yet
            raise subprocess.TimeoutExpired(self.args, timeout) from None
        self.returncode = int(self._status.split()[1])
        self._connection.close()

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                self._read_status(0)
            except subprocess.TimeoutExpired:
                pass
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self._read_status(timeout)
        return self.returncode

    def _drain(self, deadline: Optional[float]) -> None:
        with selectors.DefaultSelector() as selector:
            for fd in self._open:
                selector.register(fd, selectors.EVENT_READ)
            while self._open:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, None)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self._pipes[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
                        os.close(key.fd)
                        self._open.discard(key.fd)

    def communicate(self, input: None = None, timeout: Optional[float] = None) -> tuple[str, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._drain(deadline)
            self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(self.args, timeout) from None
        # text=True's universal newlines
        text = lambda fd: self._pipes[fd].decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        return text(self._stdout), text(self._stderr)

    def __del__(self):  # as Popen's pipes close with it, read to the end or not
        for fd in self._open:
            try:
                os.close(fd)
            except OSError:
                pass

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _pythonpath(env: dict) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


class Server:
    """This process's fork server, started by start_server (a pytest-xdist worker's conftest) or on first use, ended
    with the process."""

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="lightspeed-fork-")
        self.path = os.path.join(self.directory, "socket")
        self.env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        self.imported: Optional[dict] = None  # the server's environment and modules once it has imported
        self.sys_path = self._interpreter_path()
        self.process = subprocess.Popen([sys.executable, __file__, self.path], env=self.env, cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(self.close)

    def _interpreter_path(self) -> list[str]:
        """sys.path of `python -c ...` in this environment, less its first entry (the script's or the cwd)."""
        probe = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                               env=self.env, capture_output=True, text=True, check=True)
        return json.loads(probe.stdout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def wait_until_imported(self, timeout: float = 60) -> dict:
        """The server's environment and modules once it has imported (written before its socket is bound)."""
        deadline = time.monotonic() + timeout
        while self.imported is None:
            try:
                self.imported = json.loads(Path(self.path + ".json").read_text())
            except FileNotFoundError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise ConnectionError("the fork server did not start") from None
                time.sleep(0.05)
        return self.imported

    def connect(self, timeout: float = 60) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(self.path)
                return connection
            except (FileNotFoundError, ConnectionRefusedError):
                connection.close()
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise ConnectionError("the fork server did not start") from None
                time.sleep(0.05)

    def sys_path_of(self, argv: list[str], cwd: Path, env: dict) -> list[str]:
        """sys.path of `python ARGV` in `cwd` with `env`: the server's, after a first entry and PYTHONPATH's."""
        pythonpath = _pythonpath(env)
        first = str(Path(cwd).resolve()) if argv[0] == "-m" else str(Path(argv[0]).resolve().parent)
        return [first, *pythonpath, *self.sys_path]

    def mismatch(self, argv: list[str], cwd: Path, env: dict) -> Optional[str]:
        """Why a fork of the server would not be `python ARGV` in `cwd` with `env`; None where it would."""
        if argv[:1] != [RUN_PY] and not (argv[:1] == ["-m"] and argv[1].startswith(FORKED_MODULES)):
            return f"not run.py or a tool: {argv[:2]}"
        pythonpath = _pythonpath(env)
        if pythonpath not in ([], [str(ROOT)]) or str(ROOT) not in self.sys_path_of(argv, cwd, env)[:2]:
            # or this checkout's packages found through its installed copy
            return f"another path: PYTHONPATH={env.get('PYTHONPATH')!r}, cwd {cwd}"
        server_env = self.wait_until_imported()["env"]
        differs = {key for key in env.keys() | server_env.keys() if env.get(key) != server_env.get(key)}
        read_at_start = sorted(key for key in differs - {"PYTHONPATH"}
                               if not self._same_for_a_fork(key, env, server_env))
        return f"environment differs in {read_at_start}" if read_at_start else None

    def _same_for_a_fork(self, key: str, env: dict, server_env: dict) -> bool:
        if key.startswith(ALLOWED_TO_DIFFER):
            return True
        if key in READ_AT_IMPORT_BY:
            return READ_AT_IMPORT_BY[key] not in self.imported["modules"]
        if key == "LD_LIBRARY_PATH":  # the loader reads it at start; entries naming no directory find nothing
            existing = lambda value: [entry for entry in (value or "").split(":") if entry and os.path.isdir(entry)]
            return existing(env.get(key)) == existing(server_env.get(key))
        return False

    def start(self, argv: list[str], cwd: Path, env: dict) -> Optional[ForkedProcess]:
        """`python ARGV` forked by the server, or None where it would not be the same as a fresh interpreter."""
        if self.mismatch(argv, cwd, env) is not None:
            return None
        path = self.sys_path_of(argv, cwd, env)
        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "path": path}).encode()
        connection = self.connect()
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        try:
            message = struct.pack("!Q", len(request)) + request
            sent = socket.send_fds(connection, [message], [0, stdout_write, stderr_write])
            connection.sendall(message[sent:])
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = connection.recv(1)
                if not chunk:
                    raise ConnectionError("the fork server closed the connection before forking")
                answer += chunk
        except OSError:  # ConnectionError among them: the caller starts a fresh interpreter instead
            for fd in (stdout_read, stderr_read):
                os.close(fd)
            connection.close()
            raise ConnectionError("the fork server did not take the command") from None
        finally:
            os.close(stdout_write)
            os.close(stderr_write)
        return ForkedProcess([sys.executable, *argv], connection, int(answer.split()[1]), stdout_read, stderr_read)


_server: Optional[Server] = None
ENABLED = os.environ.get("LIGHTSPEED_TESTS_FORK", "1") != "0"


def start_server() -> None:
    """Start this process's server now (it imports for a few seconds while the first tests run)."""
    global _server
    if ENABLED and _server is None:
        _server = Server()


def popen(argv: list[str], cwd: Path, env: dict):
    """`python ARGV` in `cwd` with exactly `env`: forked by this process's server where that is the same as a fresh
    interpreter, else subprocess.Popen; stdout and stderr captured, as text."""
    if ENABLED:
        try:
            start_server()
            process = _server.start(argv, cwd, env)
            if process is not None:
                return process
            if os.environ.get("LIGHTSPEED_TESTS_FORK_LOG"):  # why commands start afresh, one line each
                with open(os.environ["LIGHTSPEED_TESTS_FORK_LOG"], "a") as log:
                    log.write(f"{os.environ.get('PYTEST_CURRENT_TEST')}: {_server.mismatch(argv, cwd, env)}\n")
        except ConnectionError:
            pass
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


if __name__ == "__main__":
    serve(sys.argv[1])
