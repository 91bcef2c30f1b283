"""Glue between `legato rl serve` and the slime trainer (THUDM/slime).

Where it plugs in
-----------------
slime lets a run replace its whole rollout with a function named by
``--rollout-function-path``; slime loads it and calls

    generate_rollout(args, rollout_id, data_source, evaluation=False)
        -> RolloutFnTrainOutput | RolloutFnEvalOutput

(the signature of the default ``slime.rollout.sglang_rollout.generate_rollout``,
documented in docs/en/get_started/customization.md, section 1; the output types
are in slime/rollout/base_types.py, where ``call_rollout_fn`` also accepts a bare
``list[list[Sample]]``). This module's ``generate_rollout`` has exactly that
signature, so a run uses it with

    --rollout-function-path slime_glue.generate_rollout
    --custom-reward-post-process-path slime_glue.reward_post_process
    --custom-config-path legato.yaml     # legato_url: http://HOST:8300, ...

The narrower hook, ``--custom-generate-function-path`` (``async def
custom_generate(args, sample, sampling_params) -> Sample | list[Sample]``), is
called once per sample, while legato runs a whole GRPO group of attempts on its
desktops and grades them together; the rollout function is the entry point
that hands over whole groups, which is what legato returns. (Read at THUDM/slime
624b824a: slime/rollout/sglang_rollout.py, slime/rollout/base_types.py,
slime/utils/types.py, slime/ray/rollout.py, slime/observability/
rollout_data_utils.py, slime/utils/arguments.py, slime/ray/actor_group.py,
train.py, train_async.py, and the doc named above; descriptors/slime.json
holds the interface as read there, and glue_conform.py checks this module's
output against it.)

What it does
------------
``data_source.get_samples(args.rollout_batch_size)`` gives groups of
``args.n_samples_per_prompt`` copies of one prompt sample. For each group the
glue submits one legato group of that size for the task named in the sample's
``metadata["legato_task"]`` (a tasks-file entry: ``{"task_id", "domain"}`` or
``{"task_id", "domain", "config"}``; slime's dataset loader fills ``metadata``
from the prompt file's ``metadata`` column), waits for it to end, and turns
each attempt into slime samples. The prompt text of the data set is not sent:
legato's harness builds the prompt from the task and the screen.

Two layouts (``legato_layout``):

* ``trajectory`` (default), as slime's own multi-turn examples build a sample
  (examples/search-r1/generate_with_search.py, examples/geo3k_vlm_multi_turn/
  rollout.py): one ``Sample`` per attempt; ``tokens`` is the first step's
  prompt followed by every step's generated ids (``loss_mask`` 1, their
  logprobs) and the tokens the next prompt adds after them (the new screenshot
  and text: ``loss_mask`` 0, logprob 0.0). It needs each step's prompt to
  extend the previous prompt and response token for token: run legato with
  ``--history contiguous`` (without it, a screenshot leaving the prompt breaks
  the chain and the glue raises ``NotContiguous``).
* ``step``: one ``Sample`` per model call, its own prompt and response, the
  attempt's samples in one list sharing ``Sample.rollout_id`` (slime's
  contract for one rollout split into several training samples: customization
  doc, "Returning multiple training samples for one prompt", checked by
  ``validate_rollout_id_annotated``). Works with any history mode.

Rewards and advantages: ``Sample.reward`` is the attempt's graded reward;
legato's group advantage, computed over the attempts that count for the group
only, is in ``metadata["legato"]["advantage"]``. slime's default reward
post-processing would normalise over every sample it is given (placeholders
and per-step samples included), so point ``--custom-reward-post-process-path``
at ``reward_post_process`` below: it returns legato's advantages, 0 for
masked attempts, and slime's GRPO uses them as they are
(``get_grpo_returns`` broadcasts each sample's value over its tokens). Legato's
advantage divides by the population standard deviation; slime's own divides by
``torch.std`` (n - 1).

Masked attempts (an infrastructure failure, a cancelled, skipped or surplus
attempt) never train. A group keeps ``n_samples_per_prompt`` entries (slime
counts rollouts per train step), so each masked slot is filled with a
placeholder: ``remove_sample=True``, ``loss_mask`` all 0, reward and advantage
0, status ``failed``. An unmasked attempt whose steps lack exact token ids,
prompt ids or aligned logprobs cannot give token-level data either and is
handled the same way (``metadata["legato"]["untrainable"]`` says why).

Weight sync and policy versions: ``generate_rollout`` never changes
legato's policy (under train_async.py the next rollout is generated while
the current one trains, so a version stamped per call would name the wrong
weights). The version moves with the weights: ``install_weight_sync(
actor_model, args)``, one line in slime's train.py (or train_async.py)
after ``create_training_models``, wraps ``actor_model.update_weights`` in
legato's pause and serve: ``POST /v1/policy`` paused with drain (no model
call in flight while the weights swap), then serving the next version with
``base_urls`` = the router slime's SGLang engines sit behind
(``http://{sglang_router_ip}:{sglang_router_port}/v1``, or
``legato_base_urls``), so legato's model calls go where the new weights are.
The k-th sync of a process (from 0) serves ``legato_version_prefix +
str(start_rollout_id + k)`` (default ``slime-rollout-``): under train.py the
rollout these weights generate. ``Sample.weight_versions`` lists each
step's version.

Screenshots stay references: ``metadata["legato"]["images"]`` lists the
sha256 of every image in the sample's prompt, in order, as legato lists
them (``step_images``: the last step's for a trajectory sample, which holds
every screenshot of the attempt), and ``metadata["legato"]["image_spans"]``
where their placeholder tokens are in ``tokens``. A vision-language run sets
``legato_multimodal_function_path`` to a function ``f(client, shas) -> dict``,
called with the shas in that order, that returns ``multimodal_train_inputs``
(e.g. the model's processor output without input_ids); without it that
field stays None.

Settings, read from ``args`` (set them with ``--custom-config-path``) or the
environment: legato_url (LEGATO_URL, default http://127.0.0.1:8300),
legato_token (LEGATO_SERVE_TOKEN), legato_run_dir (LEGATO_RUN_DIR: the
service's run directory, whose serve.token is the token when none is given),
legato_layout, legato_version_prefix, legato_base_urls (LEGATO_BASE_URLS,
comma-separated: where the weights are served, default slime's router),
legato_wait_timeout (seconds per group, default 3600), legato_pad_token_id
(default 0), legato_eval_tasks (a list of tasks for ``evaluation=True``),
legato_multimodal_function_path, legato_key_prefix (LEGATO_KEY_PREFIX: a
name unique to the training run; with it each submission is keyed by it, the
rollout id and the group index, so a run resumed from a checkpoint gets the
groups of an interrupted rollout back instead of running them again; leave it
empty when runs share a service's run directory with no unique name).

slime is not needed to import or test this module: without it, samples are
``LegatoSample`` objects with the same field names and the outputs are small
stand-ins with the same attributes. With slime importable, they are
``slime.utils.types.Sample`` and slime's own output types.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from legato_client import (Attempt, Client, Group, NotContiguous, WeightSync, concatenate_steps, image_refs,
                           step_images, trainable, untrainable_reason)

try:  # slime is optional: real Sample objects when it is there.
    from slime.utils.types import Sample as _SlimeSample  # type: ignore
except Exception:  # ImportError, or torch missing underneath
    _SlimeSample = None
try:
    from slime.rollout.base_types import RolloutFnEvalOutput as _EvalOutput  # type: ignore
    from slime.rollout.base_types import RolloutFnTrainOutput as _TrainOutput  # type: ignore
except Exception:
    _TrainOutput = _EvalOutput = None

__all__ = [
    "LegatoSample", "NotContiguous", "generate_rollout", "reward_post_process",
    "rollout_groups", "group_to_samples", "concatenate_steps", "untrainable_reason",
    "image_refs", "task_from_sample", "install_weight_sync", "router_base_urls",
]

# Token id sources whose ids are the ones the server generated (legato's
# schema.TokenIDSource.Exact); "strings" would need re-tokenizing.


@dataclasses.dataclass
class LegatoSample:
    """The fields of slime.utils.types.Sample this glue reads or sets, with
    slime's names and defaults; ``status`` holds Sample.Status's value."""

    group_index: Optional[int] = None
    index: Optional[int] = None
    rollout_id: Optional[int] = None
    prompt: Any = ""
    tokens: List[int] = dataclasses.field(default_factory=list)
    multimodal_inputs: Optional[Dict[str, Any]] = None
    multimodal_train_inputs: Optional[Dict[str, Any]] = None
    response: str = ""
    response_length: int = 0
    label: Optional[str] = None
    reward: Optional[float] = None
    loss_mask: Optional[List[int]] = None
    weight_versions: List[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: Optional[List[float]] = None
    remove_sample: bool = False
    status: str = "pending"
    metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)
    train_metadata: Optional[Dict[str, Any]] = None
    session_id: Optional[str] = None


@dataclasses.dataclass
class TrainOutput:
    """Stand-in for slime's RolloutFnTrainOutput when slime is absent."""

    samples: list
    metrics: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class EvalOutput:
    """Stand-in for slime's RolloutFnEvalOutput when slime is absent."""

    data: Dict[str, Dict[str, Any]]
    metrics: Optional[Dict[str, Any]] = None


# -- building slime samples --------------------------------------------------


def _status(sample: Any, value: str) -> Any:
    if _SlimeSample is not None and isinstance(sample, _SlimeSample):
        return _SlimeSample.Status(value)
    return value


def _new_sample(template: Any, fields: Dict[str, Any]) -> Any:
    """A sample for one attempt (or step): a copy of the data source's
    ``template`` with ``fields`` set, a real slime Sample when slime is
    importable."""
    if template is not None and (_SlimeSample is None or isinstance(template, _SlimeSample)):
        s = copy.deepcopy(template)
    else:
        cls = _SlimeSample or LegatoSample
        keep = {k: getattr(template, k) for k in ("group_index", "index", "prompt", "label")
                if template is not None and hasattr(template, k)}
        s = cls(**keep)
    meta = dict(getattr(template, "metadata", None) or {})
    meta["legato"] = fields.pop("legato")
    fields["metadata"] = meta
    status = fields.pop("status")
    for k, v in fields.items():
        setattr(s, k, v)
    s.status = _status(s, status)
    return s


def _attempt_meta(group: Group, a: Optional[Attempt], **extra: Any) -> Dict[str, Any]:
    m = {"group_id": group.id, "task_id": group.task_id}
    if a is not None:
        m.update(rollout_id=a.rollout_id, attempt=a.attempt, status=a.status, reward=a.reward,
                 advantage=a.advantage, masked=a.masked, policy_version=a.policy_version,
                 stale_steps=a.stale_steps)
    m.update(extra)
    return m


def group_to_samples(group: Group, templates: Sequence[Any], layout: str = "trajectory",
                     pad_token_id: int = 0,
                     multimodal: Optional[Callable[[List[str]], Optional[Dict[str, Any]]]] = None,
                     next_rollout_id: Optional[Callable[[], int]] = None) -> List[Any]:
    """An ended legato group as one slime group of ``len(templates)`` entries.

    Entry i is the i-th attempt that trains (attempt order): a Sample in the
    trajectory layout, a list of per-step Samples sharing ``rollout_id`` in
    the step layout. The remaining entries are placeholders that do not
    train (``remove_sample``, loss mask all 0, reward and advantage 0).
    """
    if layout not in ("trajectory", "step"):
        raise ValueError(f"layout {layout!r}: trajectory or step")
    if not group.ended:
        raise ValueError(f"group {group.id} is {group.state}, not ended")
    G = len(templates)
    ok, why = trainable(group)
    if len(ok) > G:
        raise ValueError(f"group {group.id}: {len(ok)} attempts count, more than the {G} slots")
    counter = iter(range(1 << 62))
    next_id = next_rollout_id or (lambda: next(counter))

    def rid(template: Any) -> int:
        idx = getattr(template, "index", None)
        return idx if idx is not None else next_id()

    entries: List[Any] = []
    for a, template in zip(ok, templates):
        steps = a.steps
        truncated = a.status == "truncated" or steps[-1].get("finish_reason") == "length"
        if layout == "trajectory":
            prompt, resp, mask, lps, starts = concatenate_steps(steps)
            images = step_images(steps[-1])
            refs = [img["sha256"] for img in images]
            entries.append(_new_sample(template, {
                "rollout_id": rid(template),
                "tokens": prompt + resp,
                "response": "".join(s.get("response_text") or "" for s in steps),
                "response_length": len(resp),
                "loss_mask": mask,
                "rollout_log_probs": lps,
                "reward": float(a.reward),
                "weight_versions": [s["policy_version"] for s in steps],
                "remove_sample": False,
                "status": "truncated" if truncated else "completed",
                "multimodal_train_inputs": multimodal(refs) if multimodal else None,
                "legato": _attempt_meta(group, a, images=refs, image_spans=[img.get("token_span") for img in images],
                                        step_starts=starts, prompt_length=len(prompt)),
            }))
        else:
            r = rid(template)
            per_step = []
            for s in steps:
                ids = [int(t) for t in s["response_token_ids"] or []]
                images = step_images(s)
                refs = [img["sha256"] for img in images]
                per_step.append(_new_sample(template, {
                    "rollout_id": r,
                    "tokens": [int(t) for t in s["prompt_token_ids"]] + ids,
                    "response": s.get("response_text") or "",
                    "response_length": len(ids),
                    "loss_mask": [1] * len(ids),
                    "rollout_log_probs": [float(x) for x in s["response_logprobs"]],
                    "reward": float(a.reward),
                    "weight_versions": [s["policy_version"]],
                    "remove_sample": False,
                    "status": "truncated" if s.get("finish_reason") == "length" else "completed",
                    "multimodal_train_inputs": multimodal(refs) if multimodal else None,
                    "legato": _attempt_meta(group, a, step=s["step"], images=refs,
                                            image_spans=[img.get("token_span") for img in images],
                                            prompt_length=len(s["prompt_token_ids"])),
                }))
            entries.append(per_step)

    # Placeholders for the slots no attempt fills: borrowed tokens that never
    # train. They keep the group at n_samples_per_prompt rollouts.
    if ok:
        s0 = ok[0].steps[0]
        filler_prompt = [int(t) for t in s0["prompt_token_ids"]]
        filler_resp = [int(t) for t in (s0["response_token_ids"] or [pad_token_id])[:1]]
        filler_refs = [img["sha256"] for img in step_images(s0)]
    else:
        filler_prompt, filler_resp, filler_refs = [pad_token_id], [pad_token_id], []
    left_out = [a for a in sorted(group.attempts, key=lambda a: a.attempt) if a.rollout_id in why]
    for i, template in enumerate(templates[len(ok):]):
        a = left_out[i] if i < len(left_out) else None
        sample = _new_sample(template, {
            "rollout_id": rid(template),
            "tokens": filler_prompt + filler_resp,
            "response": "",
            "response_length": len(filler_resp),
            "loss_mask": [0] * len(filler_resp),
            "rollout_log_probs": [0.0] * len(filler_resp),
            "reward": 0.0,
            "weight_versions": [],
            "remove_sample": True,
            "status": "failed",
            "multimodal_train_inputs": multimodal(filler_refs) if (multimodal and filler_refs) else None,
            "legato": _attempt_meta(group, a, placeholder=True, masked=True, advantage=0.0,
                                    untrainable=why.get(a.rollout_id) if a else "no attempt",
                                    images=filler_refs),
        })
        entries.append([sample] if layout == "step" else sample)
    return entries


# -- talking to legato ---------------------------------------------------------


def task_from_sample(sample: Any) -> Dict[str, Any]:
    """The legato task of a data-source sample: ``metadata["legato_task"]``."""
    meta = getattr(sample, "metadata", None) or {}
    task = meta.get("legato_task")
    if isinstance(task, str):
        task = json.loads(task)
    if not isinstance(task, dict) or "task_id" not in task:
        raise ValueError(f"sample {getattr(sample, 'index', None)}: metadata has no legato_task "
                         "({\"task_id\", \"domain\"[, \"config\"]})")
    return task


def _wait_ended(client: Client, group_id: str, timeout: float) -> Group:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        g = client.group(group_id, wait=max(0.0, min(60.0, left)))
        if g.ended:
            return g
        if left <= 0:
            raise TimeoutError(f"legato group {group_id} still {g.state} after {timeout:g}s")


def rollout_groups(client: Client, prompt_groups: Sequence[Sequence[Any]], layout: str = "trajectory",
                   task_of: Callable[[Any], Dict[str, Any]] = task_from_sample,
                   key_prefix: str = "", wait_timeout: float = 3600.0, pad_token_id: int = 0,
                   multimodal: Optional[Callable[[List[str]], Optional[Dict[str, Any]]]] = None,
                   ) -> Tuple[List[List[Any]], Dict[str, Any], List[Group]]:
    """Run one legato group per prompt group and convert them.

    Every group is submitted first (legato runs them side by side on its
    desktops), then each is awaited and converted with ``group_to_samples``.
    With ``key_prefix`` the submissions are idempotent (a restarted trainer
    gets the same groups back). Returns (slime groups, metrics, legato groups).
    """
    submitted = []
    for i, pg in enumerate(prompt_groups):
        head = pg[0]
        key = ""
        if key_prefix:
            key = f"{key_prefix}{getattr(head, 'group_index', None) if getattr(head, 'group_index', None) is not None else i}"
        submitted.append(client.submit(task_of(head), group_size=len(pg), key=key))
    out, ended = [], []
    counter = iter(range(1 << 62))
    for g, pg in zip(submitted, prompt_groups):
        done = _wait_ended(client, g.id, wait_timeout)
        ended.append(done)
        out.append(group_to_samples(done, pg, layout=layout, pad_token_id=pad_token_id,
                                    multimodal=multimodal, next_rollout_id=lambda: next(counter)))
    return out, _metrics(ended), ended


def _metrics(groups: Sequence[Group]) -> Dict[str, Any]:
    attempts = [a for g in groups for a in g.attempts]
    trained = [a for g in groups for a in trainable(g)[0]]
    rewards = [a.reward for a in trained if a.reward is not None]
    return {
        "legato/groups": len(groups),
        "legato/attempts": len(attempts),
        "legato/masked_attempts": sum(1 for a in attempts if a.masked),
        "legato/trained_attempts": len(trained),
        "legato/groups_without_trained_attempt": sum(1 for g in groups if not trainable(g)[0]),
        "legato/mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
    }


# -- slime's entry points ------------------------------------------------------


@dataclasses.dataclass
class Settings:
    url: str
    token: Optional[str]
    run_dir: Optional[str]
    layout: str
    version_prefix: str
    base_urls: List[str]
    wait_timeout: float
    pad_token_id: int
    eval_tasks: List[Dict[str, Any]]
    multimodal_path: str
    key_prefix: str

    @classmethod
    def from_args(cls, args: Any) -> "Settings":
        def get(name: str, env: str, default: Any) -> Any:
            v = getattr(args, name, None)
            if v is None:
                v = os.environ.get(env, default)
            return v
        return cls(
            url=get("legato_url", "LEGATO_URL", "http://127.0.0.1:8300"),
            token=getattr(args, "legato_token", None),
            run_dir=get("legato_run_dir", "LEGATO_RUN_DIR", None),
            layout=get("legato_layout", "LEGATO_LAYOUT", "trajectory"),
            version_prefix=get("legato_version_prefix", "LEGATO_VERSION_PREFIX", "slime-rollout-"),
            base_urls=_url_list(get("legato_base_urls", "LEGATO_BASE_URLS", None)),
            wait_timeout=float(get("legato_wait_timeout", "LEGATO_WAIT_TIMEOUT", 3600)),
            pad_token_id=int(get("legato_pad_token_id", "LEGATO_PAD_TOKEN_ID", 0)),
            eval_tasks=list(getattr(args, "legato_eval_tasks", None) or []),
            multimodal_path=get("legato_multimodal_function_path", "LEGATO_MULTIMODAL_FUNCTION_PATH", ""),
            key_prefix=get("legato_key_prefix", "LEGATO_KEY_PREFIX", ""),
        )


def _url_list(v: Any) -> List[str]:
    if not v:
        return []
    if isinstance(v, str):
        v = v.split(",")
    return [u.strip() for u in v if u and u.strip()]


def _load(path: str) -> Callable[..., Any]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime's --rollout-function-path entry point (see the module docstring)."""
    cfg = Settings.from_args(args)
    client = Client(cfg.url, token=cfg.token, run_dir=cfg.run_dir)
    multimodal = None
    if cfg.multimodal_path:
        fn = _load(cfg.multimodal_path)
        multimodal = lambda shas: fn(client, shas)  # noqa: E731
    if evaluation:
        if not cfg.eval_tasks:
            raise ValueError("evaluation with legato needs legato_eval_tasks (a list of tasks)")
        n = int(getattr(args, "n_samples_per_eval_prompt", None) or 1)
        groups = [[LegatoSample(index=i * n + j, group_index=i, metadata={"legato_task": t}) for j in range(n)]
                  for i, t in enumerate(cfg.eval_tasks)]
        out, metrics, _ = rollout_groups(client, groups, layout=cfg.layout, wait_timeout=cfg.wait_timeout,
                                         pad_token_id=cfg.pad_token_id, multimodal=multimodal)
        # One sample per attempt that counts (its last step in the step layout).
        kept = [e[-1] if isinstance(e, list) else e for g in out for e in g]
        kept = [s for s in kept if not s.remove_sample]
        data = {"legato": {
            "rewards": [s.reward for s in kept],
            "truncated": [_status_value(s) == "truncated" for s in kept],
            "samples": kept,
        }}
        return (_EvalOutput or EvalOutput)(data=data, metrics=metrics)

    groups = data_source.get_samples(args.rollout_batch_size)
    key = f"{cfg.key_prefix}-r{rollout_id}-g" if cfg.key_prefix else ""
    out, metrics, _ = rollout_groups(client, groups, layout=cfg.layout, key_prefix=key,
                                     wait_timeout=cfg.wait_timeout, pad_token_id=cfg.pad_token_id,
                                     multimodal=multimodal)
    return (_TrainOutput or TrainOutput)(samples=out, metrics=metrics)


# What the weight sync relies on in slime, checked against its descriptor
# (glue_conform.py): the train group's weight update its train.py calls, and
# the arguments naming the router of its SGLang engines.
SEAM = {"group_method": "update_weights", "router_args": ["sglang_router_ip", "sglang_router_port"]}


def router_base_urls(args: Any) -> List[str]:
    """Where slime serves its weights, as legato's base URLs: the router
    in front of its SGLang engines (``sglang_router_ip``/``_port``, set by
    slime when it starts them), with the OpenAI API's /v1."""
    ip, port = (getattr(args, a, None) for a in SEAM["router_args"])
    return [f"http://{ip}:{port}/v1"] if ip and port else []


def install_weight_sync(actor_model: Any, args: Any, client: Optional[Client] = None) -> WeightSync:
    """Wrap ``actor_model.update_weights`` (slime's RayTrainGroup) in
    legato's pause (drained) and serve, with the next version and the
    router's address (see the module docstring). In slime's train.py:

        actor_model, critic_model = create_training_models(args, pgs, rollout_manager)
        slime_glue.install_weight_sync(actor_model, args)
    """
    cfg = Settings.from_args(args)
    client = client or Client(cfg.url, token=cfg.token, run_dir=cfg.run_dir)
    urls = cfg.base_urls or router_base_urls(args)
    if not urls:
        raise ValueError("install_weight_sync: no address for the weights: slime's args have no "
                         "sglang_router_ip/sglang_router_port; set legato_base_urls (LEGATO_BASE_URLS)")
    sync = WeightSync(client, urls)
    update = getattr(actor_model, SEAM["group_method"])
    start = int(getattr(args, "start_rollout_id", 0) or 0)

    def update_weights(*a: Any, **kw: Any) -> Any:
        return sync.around(f"{cfg.version_prefix}{start + len(sync.synced)}", update, *a, **kw)

    setattr(actor_model, SEAM["group_method"], update_weights)
    return sync


def _status_value(sample: Any) -> str:
    st = sample.status
    return getattr(st, "value", st)


def reward_post_process(args, samples):
    """slime's --custom-reward-post-process-path: (raw rewards, advantages).

    ``samples`` is slime's flattened list. The advantage of a sample is its
    attempt's legato group advantage; masked attempts and placeholders get 0,
    so they add nothing even before their zero loss mask.
    """
    raw, adv = [], []
    for s in samples:
        meta = (getattr(s, "metadata", None) or {}).get("legato")
        if meta is None:
            raise ValueError(f"sample {getattr(s, 'index', None)} did not come from slime_glue (no metadata['legato'])")
        raw.append(float(s.reward or 0.0))
        if s.remove_sample or meta.get("masked") or meta.get("advantage") is None:
            adv.append(0.0)
        else:
            adv.append(float(meta["advantage"]))
    return raw, adv
