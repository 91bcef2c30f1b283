"""Tests of the client and the examples against a real `legato rl serve`.

    LEGATO_BIN=/path/to/legato python3 -m unittest discover -s examples/python -v

Each test starts its own service on fake desktops (and, where it needs one,
the scripted model server), on loopback ports.
"""

from __future__ import annotations

import http.server
import json
import os
import tempfile
import threading
import time
import unittest

import async_trainer
import harness
from legato_client import Client, LegatoError, StreamError

TASK = {"task_id": "demo-write-note", "domain": "os"}


class ServiceCase(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.out = os.path.join(self.dir.name, "run")
        self.log = os.path.join(self.dir.name, "legato.log")
        self.port = harness.free_port()
        self.procs = []

    def tearDown(self) -> None:
        for p in reversed(self.procs):
            p.close()
        if self._outcome.success is False and os.path.exists(self.log):  # type: ignore[attr-defined]
            with open(self.log, errors="replace") as f:
                print("--- legato log ---\n" + f.read()[-4000:])

    def start(self, *flags: str) -> harness.Process:
        p = harness.service(self.out, self.port, *flags, log_path=self.log)
        self.procs.append(p)
        return p


class TestTrainerLoop(ServiceCase):
    def test_twenty_groups_pause_switch_kill_restart(self) -> None:
        """The issue's "done when": 20 groups consumed from the stream while
        they finish, the version switched twice through pause and serve,
        the service killed -9 and restarted mid-stream, and a model server
        that aborts one generation in nine."""
        pol = harness.policy_server("--fault", "abort", "--fault-every", "9", "--no-latency", log_path=self.log)
        self.procs.append(pol)
        # Groups of 2 on 8 desktops: 4 groups at a time, so that most are
        # queued or running when a switch or the kill comes (checked
        # below). No fake latencies: the wait for the screen to settle after
        # each action (two looks, 300 ms apart) keeps each attempt in flight
        # for over a second.
        size = 2
        flags = ("--policy-url", pol.url, "--model", "scripted", "--version", "v1", "--desktops", "8",
                 "--group", str(size), "--max-steps", "5", "--fake-speed", "none")
        svc = self.start(*flags)
        client = Client(svc.url, run_dir=self.out)
        client.wait_ready()
        restarted = []
        unended_at_kill = []

        def kill_mid_stream(item) -> None:
            if item.cursor == 12 and not restarted:
                groups = client.status()["groups"]
                unended_at_kill.append(sum(n for state, n in groups.items() if state not in ("closed", "short", "cancelled")))
                svc_now = self.procs.pop()
                svc_now.kill()
                restarted.append(self.start(*flags))

        st = async_trainer.run(client, [TASK], groups=20, group_size=size, switch_every=8, on_group=kill_mid_stream)

        self.assertTrue(restarted, "the service was never killed")
        self.assertGreater(unended_at_kill[0], 0, "every group had ended before the kill: nothing was in flight")
        self.assertEqual([it.cursor for it in st.items], list(range(1, 21)), "cursors lost or repeated")
        ids = [it.group.id for it in st.items]
        self.assertEqual(len(set(ids)), 20, f"a group came twice: {ids}")
        status = client.status()
        self.assertEqual(sum(status["groups"].values()), 20, f"groups submitted: {status['groups']}")
        self.assertEqual([s["version"] for s in st.switches], ["v2", "v3"])
        order = {"v1": 1, "v2": 2, "v3": 3}
        started_late = 0
        for it in st.items:
            g = it.group
            self.assertEqual(g.state, "closed", f"group {g.id}")
            self.assertEqual(g.advantage_std, "population", f"group {g.id}: the std of its advantages")
            unmasked = [a for a in g.attempts if not a.masked]
            self.assertEqual(len(unmasked), size, f"group {g.id}: {[(a.status, a.error) for a in g.attempts]}")
            for a in g.attempts:
                self.assertNotEqual(a.status, "error", f"{a.rollout_id}: {a.error}")
                versions = [s["policy_version"] for s in a.steps]
                # Every step sent after a switch carries the new version:
                # within an attempt versions only go up, and never below the
                # version in force when the attempt started.
                ranks = [order[v] for v in versions]
                self.assertEqual(ranks, sorted(ranks), f"{a.rollout_id}: versions {versions}")
                self.assertTrue(all(r >= order[a.policy_version] for r in ranks), f"{a.rollout_id}: {a.policy_version} {versions}")
                if a.policy_version != "v1":
                    started_late += 1
                for s in a.steps:
                    self.assertNotEqual(s["finish_reason"], "abort")
        self.assertGreater(started_late, 0, "no attempt started after a switch")

        # The aborted generations were sent again: steps with more than one
        # request, none of them kept.
        resent = 0
        with open(os.path.join(self.out, "rollouts.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                resent += sum(1 for s in rec["steps"] if s["model"]["attempts"] > 1)
        self.assertGreater(resent, 0, "the model server aborted nothing")


class TestClientErrors(ServiceCase):
    def test_bad_input_and_cancel(self) -> None:
        svc = self.start("--desktops", "1", "--fake-speed", "none", "--no-ready-signal")
        c = Client(svc.url, run_dir=self.out)
        c.wait_ready()
        # The service made a token: without it nothing is answered.
        for token in ("", "wrong"):
            with self.assertRaises(LegatoError) as cm:
                Client(svc.url, token=token).status()
            self.assertEqual(cm.exception.status, 401, cm.exception.message)
        cases = [
            (lambda: c.submit({"task_id": "no-such-task", "domain": "os"}), 404, "no-such-task"),
            (lambda: c.submit(TASK, group_size=5000), 400, "group_size"),
            (lambda: c._request("POST", "/v1/groups", {"task": TASK, "group_size": 0}), 400, "group_size 0"),
            (lambda: c.submit({"task_id": TASK["task_id"], "domain": "chrome"}), 400, 'domain "chrome"'),
            (lambda: c.submit(dict(TASK, extra=1)), 400, "extra: unknown field"),
            (lambda: c._request("GET", "/v1/groups/g1?wait=NaN"), 400, "wait="),
            (lambda: c.serve("v2\x00"), 400, "version"),
            (lambda: c.submit({"task_id": "x", "config": {"id": "x"}}), 400, "instruction"),
            (lambda: c.group("g999999"), 404, "no such group"),
            (lambda: c.blob("00" * 32), 404, "no blob"),
            (lambda: c._request("POST", "/v1/groups", {"task": TASK, "extra": 1}), 400, "unknown field"),
            (lambda: c._request("POST", "/v1/groups", {"task": "x" * (2 << 20)}), 413, "body over"),
            (lambda: c._request("POST", "/v1/policy", {"state": "sleeping"}), 400, "paused"),
        ]
        for call, status, words in cases:
            with self.assertRaises(LegatoError) as cm:
                call()
            self.assertEqual(cm.exception.status, status, cm.exception.message)
            self.assertIn(words, cm.exception.message)
        # The service still serves after all that.
        c.pause()
        g = c.submit(TASK, group_size=2)
        gone = c.cancel(g.id)
        self.assertEqual(gone.state, "cancelled")
        c.serve()
        item = next(c.stream(after=0, limit=1))
        self.assertEqual((item.cursor, item.group.id, item.group.state), (1, g.id, "cancelled"))
        self.assertTrue(all(a.masked for a in item.group.attempts))
        # A key makes a submission idempotent.
        a = c.submit(TASK, group_size=2, key="k-1")
        b = c.submit(TASK, group_size=2, key="k-1")
        self.assertEqual(a.id, b.id)
        done = c.group(a.id, wait=60)
        self.assertEqual(done.state, "closed")
        img = next(s for at in done.attempts for s in at.steps)["messages"][-1]["content"]
        ref = next(p["image_url"]["url"] for p in img if p["type"] == "image_url")
        png = c.blob(ref.rsplit("/", 1)[-1])
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")


class TestStreamGivesUp(unittest.TestCase):
    """stream() retries a service that went away for a bounded time, and
    never a line that is not a stream line."""

    def test_dead_service(self) -> None:
        c = Client(f"http://127.0.0.1:{harness.free_port()}", token="t")
        start = time.monotonic()
        with self.assertRaises(StreamError) as cm:
            next(c.stream(after=7, retry_for=1.0))
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(cm.exception.cursor, 7)
        self.assertIn("retry_for=1", cm.exception.message)

    def test_bad_line(self) -> None:
        for line in (b"not json\n", b'{"cursor": 1, "group": {"id": "g1"}}\n'):
            with self.subTest(line=line):
                self.bad_line(line)

    def bad_line(self, line: bytes) -> None:
        requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.end_headers()
                self.wfile.write(line)

            def log_message(self, *args) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # Polled every 50 ms for shutdown, not 0.5 s: each subtest ends it.
        t = threading.Thread(target=srv.serve_forever, args=(0.05,))
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        c = Client(f"http://127.0.0.1:{srv.server_address[1]}", token="t")
        with self.assertRaises(StreamError) as cm:
            next(c.stream(after=0))
        self.assertIn("not a stream line", cm.exception.message)
        self.assertEqual(len(requests), 1, "a bad line was asked for again")


if __name__ == "__main__":
    unittest.main()
