"""A switch under test: one namespace holding a switch (software target or BMv2) and veths.

Inside one namespace of its own: veth pairs pN <-> tN for N = 1..ports; the switch owns pN,
the packet tests (PTF) or a benchmark's traffic generator use tN, and P4Runtime runs on that
namespace's loopback. Nothing leaves the namespace, and ``close`` ends the switch by its PID
and deletes the namespace. Used by tests/test_packets.py and benchmarks/switch_pps.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bml.paths import REPO_ROOT
from bml.protocol import DEFAULT_LANES
from emulation.net import find_bmv2
from emulation.processes import stop_pid

PTF_DIR = REPO_ROOT / "tests" / "ptf"
GRPC = "127.0.0.1:9559"


def have_netns() -> str | None:
    """None if namespaces can be used here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    name = f"bmlprobe{os.getpid()}"  # concurrent runs must not meet on one probe name
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return None


def in_namespace(namespace: str, *command: str, check: bool = True,
                 timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", namespace, *command], capture_output=True,
                          text=True, check=check, timeout=timeout)


def start_switch(namespace: str, command: list[str], address: str, log: Path,
                 name: str) -> subprocess.Popen:
    """A switch process in ``namespace``, logging to ``log``; returns once its P4Runtime
    server at ``address`` accepts connections (or raises, with the log's tail)."""
    with open(log, "wb") as out:
        process = subprocess.Popen(["ip", "netns", "exec", namespace, *command],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} switch exited: {log.read_text()[-2000:]}")
        probe = in_namespace(namespace, sys.executable, "-c",
                             "import socket,sys; s=socket.socket(); s.settimeout(0.3); "
                             f"sys.exit(s.connect_ex(('127.0.0.1', {address.rsplit(':')[1]})))",
                             check=False)
        if probe.returncode == 0:
            return process
        time.sleep(0.2)
    stop_pid(process.pid, first=signal.SIGKILL)
    raise RuntimeError(f"{name} switch did not serve P4Runtime within 30 s")


class SwitchTestbed:
    """A switch under test in its own namespace, ports 1..``ports`` on veths pN/tN."""

    def __init__(self, target: str, name: str, log_dir: Path, ports: int = 8,
                 bmv2: str | None = None) -> None:
        self.target = target
        self.namespace = name
        self.log_dir = log_dir
        self.ports = range(1, ports + 1)
        self.bmv2 = bmv2 or find_bmv2()
        self.process: subprocess.Popen | None = None
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        try:
            for key in ("all", "default"):
                in_namespace(name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1",
                             check=False)
            in_namespace(name, "ip", "link", "set", "lo", "up")
            for port in self.ports:
                in_namespace(name, "ip", "link", "add", f"p{port}", "type", "veth", "peer", "name",
                    f"t{port}")
                for interface in (f"p{port}", f"t{port}"):
                    in_namespace(name, "sysctl", "-qw", f"net.ipv6.conf.{interface}.disable_ipv6=1",
                        check=False)
                    in_namespace(name, "ip", "link", "set", interface, "mtu", "9000")
                    in_namespace(name, "ip", "link", "set", interface, "up")
            self._start_switch()
        except BaseException:
            self.close()
            raise

    def _start_switch(self) -> None:
        interfaces = [a for p in self.ports for a in ("-i", f"{p}@p{p}")]
        if self.target == "soft":
            command = [sys.executable, "-m", "soft_target.switch", *interfaces,
                       "--grpc-server-addr", GRPC]
        else:
            logging = ["--log-console"] if os.environ.get("BML_BMV2_LOG") else []
            command = [self.bmv2, "--device-id", "1", *interfaces, "--no-p4", *logging,
                       "--", "--grpc-server-addr", GRPC, "--cpu-port", "510"]
        self.log = self.log_dir / f"switch-{self.target}-{self.namespace}.log"
        self.process = start_switch(self.namespace, command, GRPC, self.log, self.target)

    def run_ptf(self, tests: list[str] | None = None, timeout: float = 900,
                lanes: int = DEFAULT_LANES) -> dict[str, str]:
        """Run the PTF suite against the switch running the ``lanes``-wide build (the test
        parameter the tests read the width from); returns {test name: 'ok' | 'FAIL' |
        'ERROR' | 'skipped ...'}."""
        command = [shutil.which("ptf") or str(Path(sys.executable).parent / "ptf"),
                   "--test-dir", str(PTF_DIR), "--pypath", str(REPO_ROOT),
                   "--log-dir", str(self.log_dir / f"ptf-{self.target}"),
                   "--socket-recv-size", "9216",  # PTF's 4096 would cut wide frames short
                   "--test-params",
                   f"grpc_addr='{GRPC}';target='{self.target}';lanes={lanes}",
                   *[a for p in self.ports for a in ("-i", f"{p}@t{p}")], *(tests or [])]
        done = subprocess.run(["ip", "netns", "exec", self.namespace, *command],
                              capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
        (self.log_dir / f"ptf-{self.target}.out").write_text(done.stdout + done.stderr)
        results = dict(re.findall(r"^(\w+\.\w+) \.\.\. (ok|FAIL|ERROR|skipped.*)$",
                                  done.stdout + done.stderr, re.M))
        if not results:
            raise RuntimeError(f"PTF ran no test (exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return results

    def close(self) -> None:
        if self.process is not None:
            # `ip netns exec` execs the command, so this PID is the switch's own.
            stop_pid(self.process.pid)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.process = None
        subprocess.run(["ip", "netns", "delete", self.namespace], capture_output=True)
