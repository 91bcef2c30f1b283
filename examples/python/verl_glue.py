"""Glue between `legato rl serve` and verl's agent loop (volcengine/verl).

Where it plugs in
-----------------
verl's rollout runs one agent loop per trajectory: ``AgentLoopWorker``
instantiates the class registered under the sample's ``agent_name`` and
awaits

    async def run(self, sampling_params, **kwargs) -> AgentLoopOutput

(verl/experimental/agent_loop/agent_loop.py), ``kwargs`` being the sample's
data-set columns (``raw_prompt``, ``extra_info``, ``uid``, ...). The output
is one trajectory in one token sequence: ``prompt_ids``, then
``response_ids`` holding the generated tokens and what the environment added
between them, ``response_mask`` 1 on generated tokens only, their
``response_logprobs``, ``reward_score``, ``multi_modal_data`` with the
prompt's ``images`` in order. That is legato's contiguous shape (``--history
contiguous``: each attempt's ``sequence``, what ``legato rl export
--contiguous`` writes), so ``LegatoAgentLoop`` only cuts it:

    # legato_agent.yaml, named by actor_rollout_ref.rollout.agent.agent_loop_config_path
    - name: legato
      _target_: verl_glue.LegatoAgentLoop

and the data set's ``agent_name`` column says ``legato``, its
``extra_info.legato_task`` the task (a tasks-file entry ``{"task_id",
"domain"[, "config"]}``, or its JSON). The first of a prompt's
``rollout.n`` loops submits one legato group of n attempts, keyed by the
sample's ``uid`` (so the others, and a retry, get the same group); each loop
takes the next attempt. The n loops of a prompt must run in one
AgentLoopWorker (verl cuts the batch into one contiguous chunk per worker:
keep the batch divisible by the worker count).

The prompt and sampling params verl passes are not used: legato's harness
builds each prompt from the task and the screen, its flags set the sampling.

Masked attempts
---------------
verl wants an output per trajectory, and computes GRPO advantages over a
uid's ``reward_score``. A masked attempt (infrastructure failure, cancelled,
skipped or surplus) and an unmasked one without exact token ids or
logprobs get a placeholder: a trainable sibling's prompt and first
generated token (else ``pad_token_id``), ``response_mask`` all 0, and as
``reward_score`` the mean of the group's trainable attempts, which leaves the
group mean, and so the sign of every advantage, unchanged.
``extra_fields["legato"]`` says which attempt each output is, its legato
advantage (population std; verl's GRPO divides by ``torch.std``, n - 1) and
why a placeholder does not train.

Images
------
``multi_modal_data["images"]`` holds the attempt's screenshots in the order
legato lists them (the last step's ``images``: every screenshot of the
attempt, with its ``token_span`` in the sequence, kept in
``extra_fields["legato"]["image_spans"]``), each PNG loaded by
``image_loader`` (default: a PIL image, RGB, when PIL is importable, as verl's
processor takes them; else the PNG's bytes).

Weight sync
-----------
``install_weight_sync(trainer, client)`` wraps the trainer's
``checkpoint_manager.update_weights`` (called once before training and after
each actor update) in legato's pause (drained: no model call in flight while
the weights swap) and serve, with version ``verl-step-`` + the step these
weights generate for (``global_steps + 1``) and ``base_urls`` = the rollout
replicas' addresses (``async_rollout_manager.server_addresses``, with /v1):
one line in verl's main_ppo after ``trainer.init_workers()``.

Read at volcengine/verl b178a3cd: verl/experimental/agent_loop/agent_loop.py,
single_turn_agent_loop.py, tool_agent_loop.py, verl/trainer/ppo/ray_trainer.py,
verl/checkpoint_engine/base.py, verl/workers/rollout/replica.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import io
import json
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from legato_client import (Attempt, Client, Group, WeightSync, concatenate_steps, step_images, trainable,
                           untrainable_reason)

try:  # verl is optional: its own classes when it is there.
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase as _Base  # type: ignore
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics as _Metrics  # type: ignore
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput as _Output  # type: ignore
except Exception:  # ImportError, or torch/ray missing underneath
    _Base, _Metrics, _Output = object, None, None

__all__ = ["LegatoAgentLoop", "AgentLoopOutput", "AgentLoopMetrics", "group_outputs", "attempt_output",
           "install_weight_sync", "replica_base_urls", "untrainable_reason"]


@dataclasses.dataclass
class AgentLoopMetrics:
    """Stand-in for verl's AgentLoopMetrics (same fields and defaults)."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    num_preempted: int = -1


@dataclasses.dataclass
class AgentLoopOutput:
    """Stand-in for verl's AgentLoopOutput when verl is absent: the fields
    this glue sets, with verl's names and defaults."""

    prompt_ids: List[int]
    response_ids: List[int]
    response_mask: List[int]
    metrics: Any
    response_logprobs: Optional[List[float]] = None
    routed_experts: Optional[Any] = None
    multi_modal_data: Optional[Dict[str, Any]] = None
    reward_score: Optional[float] = None
    num_turns: int = 0
    extra_fields: Dict[str, Any] = dataclasses.field(default_factory=dict)


def _new_output(**fields: Any) -> Any:
    metrics = fields.pop("metrics")
    if _Output is not None:
        return _Output(metrics=_Metrics(**metrics), **fields)
    return AgentLoopOutput(metrics=AgentLoopMetrics(**metrics), **fields)


def default_image_loader(png: bytes) -> Any:
    """A PIL image (RGB) of ``png`` when PIL is importable, else the bytes."""
    try:
        from PIL import Image  # type: ignore
    except Exception:
        return png
    return Image.open(io.BytesIO(png)).convert("RGB")


def _sequence(a: Attempt) -> Dict[str, Any]:
    """The attempt as one sequence: the service's (contiguous history), or
    built from its steps the same way."""
    if a.sequence:
        return a.sequence
    prompt, resp, mask, lps, starts = concatenate_steps(a.steps)
    return {"token_ids": prompt + resp, "loss_mask": [0] * len(prompt) + mask,
            "logprobs": [0.0] * len(prompt) + lps, "prompt_length": len(prompt),
            "step_starts": [len(prompt) + s for s in starts],
            "policy_versions": [s["policy_version"] for s in a.steps]}


def _meta(group: Group, a: Optional[Attempt], **extra: Any) -> Dict[str, Any]:
    m: Dict[str, Any] = {"group_id": group.id, "task_id": group.task_id}
    if a is not None:
        m.update(rollout_id=a.rollout_id, attempt=a.attempt, status=a.status, reward=a.reward,
                 advantage=a.advantage, masked=a.masked)
    m.update(extra)
    return m


def attempt_output(group: Group, a: Attempt, images: Optional[Callable[[List[str]], List[Any]]] = None,
                   response_length: Optional[int] = None) -> Any:
    """One trainable attempt as verl's AgentLoopOutput. ``images(shas)``
    gives the loaded images of the hashes, in order; without it
    ``multi_modal_data`` is empty. ``response_length`` truncates the
    response as verl's own loops do (``extra_fields`` says so)."""
    seq = _sequence(a)
    n = seq["prompt_length"]
    ids = [int(t) for t in seq["token_ids"]]
    resp, mask, lps = ids[n:], [int(m) for m in seq["loss_mask"][n:]], [float(x) for x in seq["logprobs"][n:]]
    cut = response_length is not None and len(resp) > response_length
    if cut:
        resp, mask, lps = resp[:response_length], mask[:response_length], lps[:response_length]
    imgs = step_images(a.steps[-1])
    shas = [img["sha256"] for img in imgs]
    return _new_output(
        prompt_ids=ids[:n], response_ids=resp, response_mask=mask, response_logprobs=lps,
        multi_modal_data={"images": images(shas)} if (images and shas) else {},
        reward_score=float(a.reward),
        # A user turn, then each step's reply and the screen after it but the last.
        num_turns=2 * len(a.steps),
        metrics={},
        extra_fields={"legato": _meta(group, a, policy_versions=list(seq["policy_versions"]),
                                      step_starts=[s - n for s in seq["step_starts"]], images=shas,
                                      image_spans=[img.get("token_span") for img in imgs], truncated=cut)},
    )


def group_outputs(group: Group, slots: int, images: Optional[Callable[[List[str]], List[Any]]] = None,
                  response_length: Optional[int] = None, pad_token_id: int = 0) -> List[Any]:
    """An ended group as ``slots`` AgentLoopOutputs: slot k holds the k-th
    attempt that trains (attempt order), the rest placeholders that do not
    (see the module docstring)."""
    if not group.ended:
        raise ValueError(f"group {group.id} is {group.state}, not ended")
    ok, why = trainable(group)
    if len(ok) > slots:
        raise ValueError(f"group {group.id}: {len(ok)} attempts count, more than its {slots} trajectories")
    out = [attempt_output(group, a, images, response_length) for a in ok]
    left_out = [a for a in sorted(group.attempts, key=lambda a: a.attempt) if a.rollout_id in why]
    mean = sum(a.reward for a in ok) / len(ok) if ok else 0.0
    # A placeholder borrows a sibling's first prompt with its images (a
    # vision processor wants the images its image tokens stand for).
    if ok:
        s0 = ok[0].steps[0]
        prompt = [int(t) for t in s0["prompt_token_ids"]]
        resp = [int(t) for t in (s0["response_token_ids"] or [pad_token_id])[:1]]
        shas = [img["sha256"] for img in step_images(s0)]
    else:
        prompt, resp, shas = [pad_token_id], [pad_token_id], []
    for k in range(slots - len(ok)):
        a = left_out[k] if k < len(left_out) else None
        out.append(_new_output(
            prompt_ids=list(prompt), response_ids=list(resp), response_mask=[0] * len(resp),
            response_logprobs=[0.0] * len(resp), multi_modal_data={"images": images(shas)} if (images and shas) else {},
            reward_score=mean, num_turns=2,
            metrics={},
            extra_fields={"legato": _meta(group, a, placeholder=True, masked=True, policy_versions=[],
                                          untrainable=why.get(a.rollout_id) if a else "no attempt")},
        ))
    return out


# -- the agent loop ------------------------------------------------------------


def _task(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    extra = kwargs.get("extra_info") or {}
    task = extra.get("legato_task") if isinstance(extra, dict) else None
    task = task or kwargs.get("legato_task")
    if isinstance(task, str):
        task = json.loads(task)
    if not isinstance(task, dict) or "task_id" not in task:
        raise ValueError(f"sample {kwargs.get('index')}: no legato_task in extra_info "
                         "({\"task_id\", \"domain\"[, \"config\"]})")
    return task


class _Groups:
    """The legato group of each uid in this process, run once, and the
    next slot each of its loops takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: Dict[str, concurrent.futures.Future] = {}
        self._taken: Dict[str, int] = {}

    def take(self, uid: str, n: int, run: Callable[[], List[Any]]) -> Tuple[concurrent.futures.Future, int]:
        with self._lock:
            fut = self._futures.get(uid)
            if fut is None:
                fut = self._futures[uid] = concurrent.futures.Future()
                threading.Thread(target=self._run, args=(fut, run), daemon=True).start()
            slot = self._taken.get(uid, 0)
            if slot >= n:
                raise ValueError(f"uid {uid}: a {n + 1}th trajectory, but rollout.n is {n}")
            self._taken[uid] = slot + 1
            if slot + 1 == n:  # every loop of the uid has its future: forget it
                del self._futures[uid], self._taken[uid]
            return fut, slot

    @staticmethod
    def _run(fut: concurrent.futures.Future, run: Callable[[], List[Any]]) -> None:
        try:
            fut.set_result(run())
        except BaseException as e:  # handed to every loop of the uid
            fut.set_exception(e)


_GROUPS = _Groups()


class LegatoAgentLoop(_Base):  # type: ignore[misc, valid-type]
    """verl's agent loop whose trajectories are legato attempts (see the
    module docstring). Settings from the environment: LEGATO_URL (default
    http://127.0.0.1:8300), LEGATO_RUN_DIR (the service's run directory,
    for its token) or LEGATO_SERVE_TOKEN, LEGATO_KEY_PREFIX (a name unique
    to the training run), LEGATO_WAIT_TIMEOUT (seconds, default 3600)."""

    def __init__(self, trainer_config: Any = None, server_manager: Any = None, tokenizer: Any = None,
                 processor: Any = None, dataset_cls: Any = None, dataset_config: Any = None,
                 client: Optional[Client] = None, n: Optional[int] = None, response_length: Optional[int] = None,
                 image_loader: Callable[[bytes], Any] = default_image_loader, **kwargs: Any) -> None:
        if _Base is not object:
            super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, dataset_config,
                             **kwargs)
        rollout = None
        if trainer_config is not None:
            rollout = trainer_config.config.actor_rollout_ref.rollout
        self.n = n if n is not None else int(rollout.n)
        self.response_length = response_length if response_length is not None else (
            int(rollout.response_length) if rollout is not None else None)
        self.client = client or Client(os.environ.get("LEGATO_URL", "http://127.0.0.1:8300"),
                                       run_dir=os.environ.get("LEGATO_RUN_DIR") or None)
        self.key_prefix = os.environ.get("LEGATO_KEY_PREFIX", "")
        self.wait_timeout = float(os.environ.get("LEGATO_WAIT_TIMEOUT", "3600"))
        self.image_loader = image_loader

    async def run(self, sampling_params: Dict[str, Any], **kwargs: Any) -> Any:
        uid = str(kwargs["uid"])
        task = _task(kwargs)
        fut, slot = _GROUPS.take(uid, self.n, lambda: self._group(uid, task))
        return (await asyncio.wrap_future(fut))[slot]

    def _images(self, shas: List[str]) -> List[Any]:
        got: Dict[str, bytes] = {}
        for i in range(0, len(shas), 256):
            got.update(self.client.blobs(sorted(set(shas[i:i + 256]))))
        return [self.image_loader(got[s]) for s in shas]

    def _group(self, uid: str, task: Dict[str, Any]) -> List[Any]:
        g = self.client.submit(task, group_size=self.n, key=f"{self.key_prefix}{uid}" if self.key_prefix else "")
        deadline = time.monotonic() + self.wait_timeout
        while not g.ended:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"legato group {g.id} still {g.state} after {self.wait_timeout:g}s")
            g = self.client.group(g.id, wait=max(0.0, min(60.0, left)))
        return group_outputs(g, self.n, self._images, self.response_length)


# -- weight sync ------------------------------------------------------------------


# What the weight sync relies on in verl, checked against its descriptor
# (glue_conform.py): the checkpoint manager's weight update the trainer's
# fit calls, and the agent loop manager's replica addresses.
SEAM = {"manager_method": "update_weights", "replica_addresses": "server_addresses"}


def replica_base_urls(trainer: Any) -> List[str]:
    """Where a verl trainer's weights are served, as legato's base URLs: its
    rollout replicas' addresses (host:port) with the OpenAI API's /v1."""
    mgr = getattr(trainer, "async_rollout_manager", None)
    return [f"http://{addr}/v1" for addr in getattr(mgr, SEAM["replica_addresses"], None) or []]


def install_weight_sync(trainer: Any, client: Client, base_urls: Optional[Sequence[str]] = None,
                        version_prefix: str = "verl-step-") -> WeightSync:
    """Wrap ``trainer.checkpoint_manager.update_weights`` (verl's
    RayPPOTrainer, after ``init_workers``) in legato's pause (drained) and
    serve: version ``version_prefix + str(global_steps + 1)``, the weights'
    replicas as ``base_urls``."""
    urls = list(base_urls) if base_urls is not None else replica_base_urls(trainer)
    if not urls:
        raise ValueError("install_weight_sync: no address for the weights: the trainer has no "
                         "async_rollout_manager.server_addresses (call it after init_workers), and none was given")
    sync = WeightSync(client, urls)
    mgr = trainer.checkpoint_manager
    update = getattr(mgr, SEAM["manager_method"])

    def update_weights(*a: Any, **kw: Any) -> Any:
        return sync.around(f"{version_prefix}{int(getattr(trainer, 'global_steps', 0)) + 1}", update, *a, **kw)

    setattr(mgr, SEAM["manager_method"], update_weights)
    return sync
