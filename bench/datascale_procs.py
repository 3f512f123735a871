"""
bench/datascale.py's processes: the Daphne server of a variant, the websocket client
process (bench/datascale_client.py) and the Django helper (bench/datascale_gate.py),
each driven by JSON lines; and the server's RSS and VmHWM from /proc.
"""

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
SECRET_KEY = secrets.token_urlsafe(50)  # production mode (DEBUG off) needs a strong key


def child_env(url):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=SECRET_KEY,
        PYTHONUNBUFFERED="1",
        # SIGABRT dumps every thread's stack into the server's log (see dump_stacks).
        PYTHONFAULTHANDLER="1",
    )
    env.pop("RINDLE_TEST_DATABASE_NAME", None)
    return env


def run_child(kind, env, stdin=None, timeout=None):
    """``bench/datascale.py --child kind`` from this checkout; its last stdout line, parsed."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "datascale.py"), "--child", kind],
        env=env,
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {kind} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def proc_status(pid):
    """VmRSS and VmHWM of ``pid`` in MiB (Linux /proc)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(line.split()[1]) / 1024
    return {"rss_mib": round(out["VmRSS"], 1), "hwm_mib": round(out["VmHWM"], 1)}


def free_port():
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Daphne:
    """One Daphne process serving ``project.asgi`` from checkout ``root``."""

    def __init__(self, root, env, log_dir, label):
        self.port = free_port()
        self.log_path = Path(log_dir) / f"daphne-{label}-{self.port}.log"
        self.log = open(self.log_path, "w")
        daphne = str(ROOT / ".venv" / "bin" / "daphne")
        cmd = [daphne, "-b", HOST, "-p", str(self.port), "--access-log", os.devnull]
        self.t_spawn = time.monotonic()
        self.proc = subprocess.Popen(
            [*cmd, "project.asgi:application"],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def status(self):
        return proc_status(self.proc.pid)

    def tail(self, chars=3000):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def dump_stacks(self, name):
        """Abort the server, whose faulthandler writes every thread's stack to its log,
        and keep that log in bench/results/ (for a subscription that got no answer)."""
        import shutil
        import signal

        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.log.flush()
        keep = ROOT / "bench" / "results" / name
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.log_path, keep)
        return str(keep)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Clients:
    """The client process, driven by JSON lines."""

    def __init__(self, env):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "datascale_client.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def call(self, cmd, **fields):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process exited ({self.proc.poll()}) during {cmd!r}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"client process, {cmd}: {reply}")
        return reply

    def dump_stacks(self, name):
        """Abort the server, whose faulthandler writes every thread's stack to its log,
        and keep that log in bench/results/ (for a subscription that got no answer)."""
        import shutil
        import signal

        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.log.flush()
        keep = ROOT / "bench" / "results" / name
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.log_path, keep)
        return str(keep)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


class Helper:
    """The writer and the gate: one child process with Django (bench/datascale_gate.py)."""

    def __init__(self, env):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "datascale.py"), "--child", "helper"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def call(self, cmd, **fields):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the helper exited ({self.proc.poll()}) during {cmd!r}")
        return json.loads(line)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
