"""Start and stop `legato rl serve` and `legato rl serve-policy` from Python,
for the examples' tests and for trying the client on one machine.

LEGATO_BIN names the legato binary (default: `legato` on PATH). Everything
listens on loopback.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
from typing import List, Optional

LEGATO_BIN = os.environ.get("LEGATO_BIN", "legato")


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A legato process whose first stdout line names its address."""

    def __init__(self, args: List[str], pattern: str, log_path: Optional[str] = None) -> None:
        self.args = [LEGATO_BIN] + args
        self.log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log, env=os.environ.copy())
        line = self.proc.stdout.readline().decode()
        m = re.search(pattern, line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"{' '.join(self.args)}: first line {line!r}, exit {self.proc.poll()}")
        self.url = m.group(1)
        # Drain the rest so the process never blocks on a full pipe.
        self._drain = threading.Thread(target=self.proc.stdout.read, daemon=True)
        self._drain.start()

    def stop(self) -> int:
        """Ask it to stop (SIGTERM, as Ctrl-C) and wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._release()
        return code

    def kill(self) -> None:
        """kill -9: no chance to clean up or write anything."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)
        self._release()

    def close(self) -> None:
        self.stop()

    def _release(self) -> None:
        self._drain.join(timeout=10)
        self.proc.stdout.close()
        if self.log is not subprocess.DEVNULL and not self.log.closed:
            self.log.close()


def policy_server(*flags: str, log_path: Optional[str] = None) -> Process:
    """The scripted model server (no GPU) on a free loopback port."""
    return Process(["rl", "serve-policy", "--addr", "127.0.0.1:0", *flags], r"on (http://\S+)", log_path)


def service(out: str, port: int, *flags: str, log_path: Optional[str] = None) -> Process:
    """`legato rl serve` on fake desktops into run directory ``out``."""
    return Process(["rl", "serve", "--out", out, "--addr", f"127.0.0.1:{port}", *flags], r"serving (http://\S+)", log_path)
