"""A cluster client whose process is stopped for longer than the image liveness timeout, but
shorter than its leader-silence timeout, carries on with the same session and loses nothing.

A real three-member cluster (tests/support/cluster.py, demo timeouts: image liveness 2 s, leader
silence 4 s) and a client in a child process: this file run as a script (see ``_child``), which
speaks a line protocol on stdin/stdout. The test SIGSTOPs the child; the leader's driver drops the
client's ingress image for liveness (seen in the leader's counters file: the image's receiver
counters are freed), then the test SIGCONTs it. The child's driver has not run meanwhile: its
ingress sender still believes it is connected, and the data of the next request must not go to
the image the leader no longer has (cluster_node.media.sender_core, *stall*). The requests are kv APPENDs sent once
each, never resent: a lost one times out, a doubled one shows in the value.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # the child: make the project importable when run as a script
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from cluster_node.media.counters import CountersError, CountersReader, CounterType  # noqa: E402

INGRESS_STREAM = 101


# ------------------------------------------------------------------------------------- the child


def _child(config_path: str) -> None:
    """Connect, then obey stdin: ``append KEY VALUE`` / ``get KEY`` -> ``REPLY status=.. value=..``;
    ``append-and-stop KEY VALUE`` offers the append, prints ``STOPPING``, SIGSTOPs its own process
    and, once continued, prints the reply; ``state`` -> ``STATE ...``; end of input -> close and
    exit. Errors print ``FAIL ...``."""
    from cluster_node.config import load_client_config
    from cluster_node.service.examples.kv import encode_request
    from tests.support.cluster import Append, Get, open_kv_client

    async def main() -> None:
        cfg = load_client_config(config_path)
        async with open_kv_client(cfg) as kv:

            def state() -> str:
                c = kv.client
                return (
                    f"STATE session={c.cluster_session_id} leader={c.leader_member_id}"
                    f" ingress_session={c._ingress.session_id} reconnects={c.reconnects}"
                    f" new_leader_events={c.new_leader_events} connected={int(c.is_connected)}"
                )

            print("READY " + state()[6:], flush=True)
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return
                cmd, *args = line.split()
                try:
                    if cmd == "append":
                        reply = await kv.call(Append(kv.next_id(), args[0], args[1].encode()), timeout=10)
                    elif cmd == "append-and-stop":
                        # Offered into the ingress log buffer, then the process stops itself
                        # before its driver had a chance to send it (no checkpoint in between).
                        request = Append(kv.next_id(), args[0], args[1].encode())
                        result = kv.client.offer(encode_request(request))
                        if result <= 0:
                            print(f"FAIL offer refused: {result}", flush=True)
                            continue
                        print("STOPPING", flush=True)
                        os.kill(os.getpid(), signal.SIGSTOP)
                        reply = await kv.wait_reply(request.request_id, 10)
                        if reply is None:
                            print(f"FAIL no reply to {request!r} within 10s ({state()[6:]})", flush=True)
                            continue
                    elif cmd == "get":
                        reply = await kv.call(Get(kv.next_id(), args[0]), timeout=10)
                    elif cmd == "state":
                        print(state(), flush=True)
                        continue
                    else:
                        print(f"FAIL unknown command {cmd!r}", flush=True)
                        continue
                except TimeoutError as e:
                    print(f"FAIL {e} ({state()[6:]})", flush=True)
                    continue
                value = reply.value.decode() if reply.value else "-"
                print(f"REPLY status={reply.status.name} value={value}", flush=True)

    trio.run(main)


class _ChildClient:
    """The child process and its output lines, read with deadlines."""

    def __init__(self, config_path: Path, log_dir: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.stderr_path = log_dir / "client.stderr"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - the child writes it until close()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(config_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def stderr_tail(self) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def expect(self, prefix: str, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"client: no {prefix!r} within {timeout}s; saw {self.seen[-5:]}\n{self.stderr_tail()}"
                )
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(
                    f"client exited ({self.proc.wait(5)}) before {prefix!r}; saw {self.seen[-5:]}\n{self.stderr_tail()}"
                )
            self.seen.append(line)
            if line.startswith("FAIL"):
                raise AssertionError(f"client: {line}\n{self.stderr_tail()}")
            if line.startswith(prefix):
                return dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def command(self, line: str, expect: str, timeout: float = 15.0) -> dict[str, str]:
        self.send(line)
        return self.expect(expect, timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # in case a failure left it stopped
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._stderr.close()


def _ingress_image_present(counters_path: Path, session_id: int) -> bool | None:
    """Whether the member's driver has an image of the client's ingress session (its receiver
    position counter is allocated); None when the counters file cannot be read."""
    try:
        reader = CountersReader.open(counters_path)
    except (CountersError, OSError, ValueError):
        return None
    try:
        prefix = f"rcv-pos: session={session_id} stream={INGRESS_STREAM} "
        return bool([c for c in reader.find(type_id=CounterType.RECEIVER_POS) if c.label.startswith(prefix)])
    except (CountersError, ValueError):
        return None
    finally:
        reader.close()


# ------------------------------------------------------------------------------------- the test


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


# Each round stops the client once. ``stop``: by whom ("parent": SIGSTOP from the test, with the
# next request already waiting in the client's stdin, offered as soon as it runs again; "self": the
# client offers a request and SIGSTOPs itself before its driver sent it). ``at_least_s``: the stop
# ends once the leader has dropped the ingress image and this much time has passed (3 s as in the
# reported failure: the leader's egress publication to the client then loses its connection too).
ROUNDS = [
    dict(stop="parent", at_least_s=0.0),
    dict(stop="self", at_least_s=3.0),
    dict(stop="self", at_least_s=0.0),
    dict(stop="parent", at_least_s=3.0),
]


def test_client_stopped_longer_than_image_liveness_keeps_its_session_and_loses_nothing(tmp_path):
    from tests.support.cluster import TestCluster

    with TestCluster(tmp_path) as cluster:
        leader = cluster.start()
        liveness_s = cluster.client_config.driver.image_liveness_timeout_ns / 1e9
        silence_s = cluster.client_config.client.leader_silence_timeout_ns / 1e9
        assert liveness_s + 1 < silence_s, "the stop must fit between the liveness and silence timeouts"
        counters_path = cluster.nodes[leader].counters_path
        client = _ChildClient(cluster.client_config_path, tmp_path)
        try:
            ready = client.expect("READY", 30)
            assert int(ready["leader"]) == leader
            session, ingress = ready["session"], int(ready["ingress_session"])
            value = ""
            for round_, spec in enumerate(ROUNDS):
                token = f"a{round_}."
                assert client.command(f"append log {token}", "REPLY")["status"] == "OK"
                value += token
                cluster.wait_for(
                    lambda: _ingress_image_present(counters_path, ingress),
                    10,
                    "the leader has the client's ingress image",
                )
                pending = f"b{round_}0."
                if spec["stop"] == "self":
                    client.command(f"append-and-stop log {pending}", "STOPPING")
                    cluster.wait_for(lambda: _stopped(client.proc.pid), 10, "the client stops itself")
                else:
                    os.kill(client.proc.pid, signal.SIGSTOP)  # the fault under test
                stopped = time.monotonic()
                try:
                    cluster.wait_for(
                        lambda: _ingress_image_present(counters_path, ingress) is False,
                        silence_s - 0.5,
                        "the leader drops the stopped client's ingress image",
                    )
                    # The length of the stop is the fault's, not a wait for a condition.
                    time.sleep(max(0.0, stopped + spec["at_least_s"] - time.monotonic()))
                    if spec["stop"] == "parent":
                        client.send(f"append log {pending}")
                finally:
                    os.kill(client.proc.pid, signal.SIGCONT)
                # (The image went about one liveness timeout after the client's last datagram,
                # which may precede the stop by up to a heartbeat interval.)
                stop_s = time.monotonic() - stopped
                assert liveness_s / 2 < stop_s < silence_s, stop_s
                # The request of the stop and two more, each sent once: answered, in order, none
                # lost or doubled, in the same session.
                reply = client.expect("REPLY", 15)
                assert reply["status"] == "OK", reply
                value += pending
                for i in range(1, 3):
                    token = f"b{round_}{i}."
                    reply = client.command(f"append log {token}", "REPLY", timeout=15)
                    assert reply["status"] == "OK", reply
                    value += token
                got = client.command("get log", "REPLY")
                assert got == {"status": "OK", "value": value}, (got, value)
                state = client.command("state", "STATE")
                assert state["session"] == session and state["reconnects"] == "0", state
                assert int(state["leader"]) == leader, state
                assert _ingress_image_present(counters_path, ingress), "the ingress image came back"
        except AssertionError as e:
            raise AssertionError(f"{e}\n{cluster.diagnostics()}") from None
        finally:
            client.close()


if __name__ == "__main__":
    _child(sys.argv[1])
