"""A minimal asynchronous trainer loop on `legato rl serve`.

It keeps a number of groups in flight, trains on each group as it ends (here:
it only checks and counts what a GRPO loss would use), and every few groups
pauses the policy, "swaps the weights" and serves the next version, as a
fully asynchronous trainer does. Its cursor is saved after every group, so a
restart of the trainer, or of the service, loses and repeats nothing.

    legato rl serve --out runs/serve &
    python3 examples/python/async_trainer.py --url http://127.0.0.1:8300 --run-dir runs/serve --groups 20

Standard library only; the client is legato_client.py beside it.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from legato_client import Client, Group, StreamItem


@dataclass
class TrainerState:
    """What the loop saw, for its caller (and its test) to check."""

    cursor: int = 0
    items: List[StreamItem] = field(default_factory=list)
    version: str = ""
    # Versions switched to, in order, with the number of groups consumed
    # when each was served.
    switches: List[Dict[str, object]] = field(default_factory=list)


def train_step(group: Group) -> int:
    """Stand-in for a GRPO update: the token-level data of the group's
    unmasked attempts. Returns the number of generated tokens used."""
    tokens = 0
    for a in group.attempts:
        if a.masked:
            continue
        assert a.advantage is not None, f"{a.rollout_id}: unmasked attempt without an advantage"
        for s in a.steps:
            ids, lps = s["response_token_ids"], s["response_logprobs"]
            assert lps is not None and len(ids) == len(lps), f"{a.rollout_id} step {s['step']}: ids and logprobs misaligned"
            tokens += len(ids)
    return tokens


def run(client: Client, tasks: List[dict], groups: int, group_size: int = 4,
        switch_every: int = 8, first_version: str = "v1",
        cursor_file: Optional[str] = None,
        on_group: Optional[Callable[[StreamItem], None]] = None) -> TrainerState:
    """Submit ``groups`` groups (keys make resubmission after a crash
    harmless), consume them from the stream as they end, and switch the
    policy version after every ``switch_every`` groups consumed."""
    st = TrainerState(version=first_version)
    if cursor_file and os.path.exists(cursor_file):
        with open(cursor_file) as f:
            st.cursor = json.load(f)["cursor"]
    for i in range(groups):
        client.submit(tasks[i % len(tasks)], group_size=group_size, key=f"trainer-group-{i}")
    for item in client.stream(after=st.cursor):
        train_step(item.group)
        st.items.append(item)
        st.cursor = item.cursor
        if cursor_file:
            tmp = cursor_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"cursor": st.cursor}, f)
            os.replace(tmp, cursor_file)
        if on_group:
            on_group(item)
        if switch_every and len(st.items) % switch_every == 0:
            client.pause()
            # The weights would be swapped on the model server here; new
            # model calls wait meanwhile, attempts keep their desktops.
            st.version = f"v{len(st.switches) + 2}"
            client.serve(st.version)
            st.switches.append({"version": st.version, "after_groups": len(st.items)})
        if len(st.items) >= groups:
            break
    return st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8300")
    ap.add_argument("--run-dir", default=None, help="the service's run directory, whose serve.token the client sends "
                    "(default: the token in LEGATO_SERVE_TOKEN)")
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--task", default='{"task_id": "demo-write-note", "domain": "os"}',
                    help="a tasks-file entry, as JSON")
    ap.add_argument("--cursor-file", default="trainer-cursor.json")
    args = ap.parse_args()
    client = Client(args.url, run_dir=args.run_dir)
    client.wait_ready()
    st = run(client, [json.loads(args.task)], args.groups, args.group_size, cursor_file=args.cursor_file)
    for item in st.items:
        versions = sorted({s["policy_version"] for a in item.group.attempts for s in a.steps})
        print(f"cursor {item.cursor}: group {item.group.id} {item.group.state}, versions {versions}")


if __name__ == "__main__":
    main()
