"""The Ray cluster of an actors=ray run: join a running one (`ray.address`), or start a local head that nothing
outlives, with its ports pinned by keys, a per-run token and no dashboard unless asked.

Security: Ray's gRPC servers accept any client that can reach them, so a local head always runs with token
authentication (RAY_AUTH_MODE=token) and a fresh token in a file of mode 0600 in the run's own session dir, not a
token shared through ~/.ray. Ray binds most listeners to every interface whatever `node_ip_address` says; the
docs/ray.md lists each one with its key. The head runs under
framework/sebulba/ray/reaper.py in a session of its own: a driver stopped by Ctrl-C, SIGTERM or even SIGKILL leaves
no process of it behind.
"""
import contextlib
import importlib.metadata
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from lightspeed.framework.core.config import RAY_PORT_KEYS, RayConfig
from lightspeed.framework.core.errors import ConfigError, check
from lightspeed.framework.sebulba.ray.reaper import GRACE_SECONDS, stop_session

TOKEN_NAME = "auth_token"
MAX_TEMP_DIR = 40  # + Ray's session_<date>_<time>_<pid>/sockets/plasma_store stays under 107 bytes
# no usage report (nothing may call out) and no metrics exporter (its agent retries noisily without a dashboard)
HEAD_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0"}
TOKEN_REFUSED = "Authentication token is missing or incorrect"  # what Ray's C++ client logs, once a second


def versions() -> dict:
    """What a driver and its actor processes must agree on: a block's layout and the programs' maths."""
    import jax

    return {"lightspeed": importlib.metadata.version("lightspeed"), "jax": jax.__version__,
            "python": ".".join(map(str, sys.version_info[:2]))}


def write_token(path: Path) -> None:
    """A fresh random token readable by this user only (created with mode 0600, never wider)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))


def use_token(path: Optional[str]) -> None:
    """Token authentication for this process (and the Ray processes it starts), with the token in `path`."""
    if path is not None:
        check(Path(path).is_file(), "ray.token_file", path, "the path of the cluster's token file (its "
              "RAY_AUTH_TOKEN_PATH)", "no such file")
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
        os.environ.pop("RAY_AUTH_TOKEN", None)  # a token in the environment would win over the file
        if "ray" in sys.modules:  # Ray reads the mode and caches the token at import: make it read them again
            with contextlib.suppress(ImportError, AttributeError):
                from ray._raylet import AuthenticationTokenLoader, Config

                Config.initialize("")
                AuthenticationTokenLoader.instance().reset_cache()


def check_ports_free(config: RayConfig) -> None:
    """Every pinned port of a local head is free (else the one-paragraph error naming its key)."""
    keys = [key for key in RAY_PORT_KEYS if key != "dashboard_port" or config.dashboard]
    for key in keys:
        port = getattr(config, key)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
            except OSError as error:
                raise ConfigError(f"ray.{key}", port, "a free port (each of ray.port, ray.node_manager_port, ... "
                                  "ray.min_worker_port, ray.max_worker_port), or join a running cluster with "
                                  "ray.address", f"in use on this machine: {error}; another local Ray head, a second "
                                  "actors=ray run, may hold it") from None


def head_command(config: RayConfig, temp_dir: Path) -> list[str]:
    """`ray start --head --block` with every listener this config pins."""
    # this interpreter's Ray, the one the driver imports: a `ray` on PATH may be another environment's (a venv run
    # by its python without being activated finds the base interpreter's)
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    ports = {key: getattr(config, key) for key in RAY_PORT_KEYS
             if key not in ("client_server_port", "dashboard_port", "autoscaler_metric_port")}
    command = [*ray_cli, "start", "--head", "--block", "--disable-usage-stats", f"--temp-dir={temp_dir}",
               f"--node-ip-address={config.node_ip_address}", f"--ray-client-server-port={config.client_server_port}",
               f"--min-worker-port={config.min_worker_port}", f"--max-worker-port={config.max_worker_port}",
               *(f"--{key.replace('_', '-')}={port}" for key, port in ports.items())]
    if config.dashboard:
        command += ["--include-dashboard=true", f"--dashboard-port={config.dashboard_port}",
                    f"--dashboard-host={config.node_ip_address}"]
    else:
        command.append("--include-dashboard=false")
    if config.num_cpus is not None:
        command.append(f"--num-cpus={config.num_cpus}")
    return command


class LocalHead:
    """A Ray head started for one run: its session dir (sockets, logs, the token) and the reaper that stops it."""

    def __init__(self, config: RayConfig):
        check_ports_free(config)
        # unix socket paths must stay under ~107 bytes: a short dir, not the run dir
        check(config.temp_dir is None or len(str(config.temp_dir)) <= MAX_TEMP_DIR, "ray.temp_dir", config.temp_dir,
              f"null or a path of at most {MAX_TEMP_DIR} characters", "Ray's unix sockets live under it, and a "
              "socket path may not exceed 107 bytes")
        self.temp_dir = Path(config.temp_dir or tempfile.mkdtemp(prefix="lsray-", dir="/tmp"))
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.temp_dir / TOKEN_NAME
        write_token(self.token_file)
        use_token(str(self.token_file))
        self.address = f"{config.node_ip_address}:{config.port}"
        self.log = open(self.temp_dir / "head.log", "w")
        reaper = Path(__file__).with_name("reaper.py")  # by path: the driver's cwd need not hold the package
        command = [sys.executable, str(reaper), str(os.getpid()), "--", *head_command(config, self.temp_dir)]
        self.reaper = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, **HEAD_ENV,
                                            "AUTOSCALER_METRIC_PORT": str(config.autoscaler_metric_port)})

    def failed(self) -> Optional[str]:
        """None while the head runs; else the tail of its log."""
        if self.reaper.poll() is None:
            return None
        self.log.flush()
        return (self.temp_dir / "head.log").read_text()[-2000:]

    def stop(self) -> None:
        """SIGTERM to the reaper (it stops the whole session); back once no process of the head's session is left,
        so its ports are free for the next run (a straggler past the reaper's time is killed here)."""
        if self.reaper.poll() is None:
            self.reaper.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.reaper.wait(2 * GRACE_SECONDS + 5)
        stop_session(self.reaper.pid, GRACE_SECONDS)  # the reaper leads the session: its pid is the session id
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.reaper.wait(GRACE_SECONDS)
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def connect(config: RayConfig, timeout_s: float) -> tuple[Any, Optional[LocalHead]]:
    """Ray connected to this run's cluster: (ray, the local head it started or None when it joined one)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    head = None
    if config.address is None:
        head = LocalHead(config)  # sets this process's token before Ray is imported
        address = head.address
    else:
        use_token(config.token_file)
        address = config.address
    import ray  # after the token is set: Ray reads it at import (config validation checked that it is installed)

    connecting = tempfile.TemporaryFile(mode="w+")
    try:
        if address != "auto":  # ray.init retries an address that does not answer for minutes: wait here instead
            wait_for_listener(address, timeout_s, head)
        with stderr_to(connecting):  # Ray's C++ client logs every failed try there: not before our paragraph
            ray.init(address=address, namespace="lightspeed", log_to_driver=True, configure_logging=False)
    except Exception as error:  # noqa: BLE001 - Ray's connection errors have no common type
        if head is not None:
            head.stop()
        connecting.seek(0)
        refused = " (the cluster refused this run's token: Ray said \"" + TOKEN_REFUSED + "\")" if (
            TOKEN_REFUSED in connecting.read()) else ""
        raise ConfigError("ray.address", config.address, "null (a local head, its ports free: ray.port, ...), auto "
                          "or host:port of a running cluster, with its token (ray.token_file or RAY_AUTH_TOKEN_PATH)",
                          f"could not connect to the Ray cluster at {address}{refused}: {type(error).__name__}: "
                          f"{first_line(error)}") from None
    else:  # connected: what Ray said meanwhile is the user's to read
        connecting.seek(0)
        sys.stderr.write(connecting.read())
    finally:
        connecting.close()
    return ray, head


@contextlib.contextmanager
def stderr_to(file: Any):
    """File descriptor 2 (Python's and C++'s writes alike) into `file` for the block; restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(file.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def wait_for_listener(address: str, timeout_s: float, head: Optional[LocalHead]) -> None:
    """Return once `address` (host:port) accepts a TCP connection; TimeoutError after `timeout_s`, RuntimeError
    as soon as the local head being waited for has died."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        dead = head.failed() if head is not None else None
        if dead is not None:
            raise RuntimeError(f"the local Ray head exited: {dead.strip()[-600:]}")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1.0):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens at {address} after {timeout_s:.0f} s")
        time.sleep(0.3)
