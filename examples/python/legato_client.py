"""A client of `legato rl serve`, for Python trainers. Standard library only.

legato runs computer-use rollouts on its desktops against your model server
and hands each finished GRPO group back with everything a token-level loss
needs: per step the prompt and response token ids, logprobs, finish reason,
policy version and image references; per attempt the reward, the group
advantage and a mask for attempts that must not train (infrastructure
failures, cancelled or surplus attempts).

    from legato_client import Client

    c = Client("http://127.0.0.1:8300", run_dir="runs/serve")   # its token
    g = c.submit({"task_id": "demo-write-note", "domain": "os"}, group_size=8)
    for item in c.stream(after=0):          # groups in the order they end
        train_on(item.group)
        save_cursor(item.cursor)            # resume from it after a restart

    c.pause()                               # hold new model calls
    swap_weights()
    c.serve("step-42")                      # later steps carry step-42

A stream read again from a saved cursor yields every group after it exactly
once, across restarts of the trainer and of the service.

Every call needs the service's bearer token: LEGATO_SERVE_TOKEN when the
service was started with it, else the one it made at start, in its run
directory's serve.token (readable by its owner only) and read from there with
``run_dir``.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

__all__ = ["Client", "LegatoError", "StreamError", "StreamItem", "Group", "Attempt", "NotContiguous",
           "WeightSync", "untrainable_reason", "trainable", "image_refs", "step_images", "concatenate_steps",
           "EXACT_SOURCES", "IMAGE_PREFIX"]

JSON = Dict[str, Any]

# The file in a service's run directory holding the token it made at start.
TOKEN_FILE = "serve.token"


class LegatoError(Exception):
    """An answer of the service other than success: status and message."""

    def __init__(self, status: int, message: str, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: {status}: {message}")
        self.status = status
        self.message = message


class StreamError(LegatoError):
    """The stream cannot go on: the service stayed unreachable longer than
    ``retry_for``, or it sent a line that is not a stream line. ``cursor`` is
    the last cursor yielded: read on from it once the service is back."""

    def __init__(self, message: str, cursor: int) -> None:
        super().__init__(0, message, "GET", "/v1/stream")
        self.cursor = cursor


@dataclasses.dataclass
class Attempt:
    """One attempt of an ended group.

    ``masked`` attempts must stay out of the loss; the others count for the
    group and carry an ``advantage``. ``steps`` are the samples of a graded
    attempt, one per model call, as ``legato rl export`` writes them, each
    with its ``policy_version`` and ``staleness`` (versions behind the one in
    force when the group ended); ``stale_steps`` counts those a service
    started with --max-staleness left out.
    """

    rollout_id: str
    attempt: int
    status: str
    reward: Optional[float]
    advantage: Optional[float]
    masked: bool
    error: Optional[JSON]
    policy_version: str
    steps: List[JSON]
    stale_steps: int = 0
    # With --history contiguous: the attempt as one sequence (token_ids,
    # loss_mask, logprobs, prompt_length, step_starts, policy_versions), or
    # why there is none.
    sequence: Optional[JSON] = None
    sequence_error: str = ""
    # With images="attempt": each image of the attempt once, sha256 to a
    # PNG data URL (the steps' messages keep legato-image:// references).
    images: Optional[Dict[str, str]] = None

    @classmethod
    def from_json(cls, d: JSON) -> "Attempt":
        return cls(
            rollout_id=d["rollout_id"],
            attempt=d["attempt"],
            status=d["status"],
            reward=d.get("reward"),
            advantage=d.get("advantage"),
            masked=d["masked"],
            error=d.get("error"),
            policy_version=d.get("policy_version", ""),
            steps=d.get("steps") or [],
            stale_steps=d.get("stale_steps", 0),
            sequence=d.get("sequence"),
            sequence_error=d.get("sequence_error", ""),
            images=d.get("images"),
        )


@dataclasses.dataclass
class Group:
    """A group as the service reports it; ``attempts`` once it ended.

    ``state`` is queued, running, closed (G attempts finished), short (it
    ended with fewer) or cancelled.
    """

    id: str
    task_id: str
    domain: str
    group_size: int
    state: str
    cursor: int
    key: str
    attempts: List[Attempt]
    # The policy version in force when the group ended (steps' staleness
    # counts the versions after theirs up to it).
    end_version: str = ""
    # Which standard deviation divided the attempts' advantages:
    # "population" (n, legato's default) or "sample" (n - 1, as slime and
    # SkyRL compute theirs); the service's --advantage-std.
    advantage_std: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ("closed", "short", "cancelled")

    @classmethod
    def from_json(cls, d: JSON) -> "Group":
        return cls(
            id=d["id"],
            task_id=d["task_id"],
            domain=d.get("domain", ""),
            group_size=d["group_size"],
            state=d["state"],
            cursor=d.get("cursor", 0),
            key=d.get("key", ""),
            attempts=[Attempt.from_json(a) for a in d.get("attempts") or []],
            end_version=d.get("end_version", ""),
            advantage_std=d.get("advantage_std", ""),
        )


@dataclasses.dataclass
class StreamItem:
    """One line of the stream: an ended group and its cursor."""

    cursor: int
    group: Group


class Client:
    """Talks to one `legato rl serve`.

    ``token`` is the service's bearer token (default: the LEGATO_SERVE_TOKEN
    environment variable, else the token in ``run_dir``/serve.token, which a
    service started without LEGATO_SERVE_TOKEN makes; read again when the
    service refuses it, since a restarted service makes a new one).
    ``timeout`` bounds each request that does not wait on purpose.
    """

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 30.0,
                 run_dir: Optional[str] = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token_file = ""
        if token is None:
            token = os.environ.get("LEGATO_SERVE_TOKEN", "")
            if not token and run_dir:
                self._token_file = os.path.join(run_dir, TOKEN_FILE)
                token = _read_token(self._token_file)
        self.token = token

    def _reload_token(self) -> bool:
        """After a 401: whether the run directory holds another token now (the
        service restarted and made a new one), which is then taken."""
        if not self._token_file:
            return False
        token = _read_token(self._token_file)
        if token and token != self.token:
            self.token = token
            return True
        return False

    # -- plumbing --------------------------------------------------------

    def _request(self, method: str, path: str, body: Optional[JSON] = None,
                 timeout: Optional[float] = None, headers: Optional[Dict[str, str]] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        while True:
            req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers or {})
            if data is not None:
                req.add_header("Content-Type", "application/json")
            if self.token:
                req.add_header("Authorization", "Bearer " + self.token)
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                    raw = resp.read()
                    if resp.headers.get_content_type() == "application/json":
                        return json.loads(raw)
                    return raw
            except urllib.error.HTTPError as e:
                # A 401 was not acted on: sending again with a new token is safe.
                if e.code == 401 and self._reload_token():
                    continue
                raise LegatoError(e.code, _message(e.read()), method, path) from None

    # -- groups ----------------------------------------------------------

    def submit(self, task: JSON, group_size: int = 0, key: str = "",
               policy: Optional[JSON] = None, policy_key: str = "", history: str = "") -> Group:
        """Queue a group of attempts at ``task``.

        ``task`` is a tasks-file entry: ``{"task_id", "domain"}`` names a task
        the service knows, ``{"task_id", "domain", "config": {...}}`` carries
        an OSWorld task config. ``group_size`` 0 is the service's default.
        With a ``key`` the call is idempotent: submitting again after a lost
        answer returns the same group. ``policy`` ({"base_url", "model",
        "temperature", "top_p", "max_tokens"}) sends the group's model calls
        to its own server, with ``policy_key`` as its key: sent in a header,
        never stored by the service (a group with a key does not survive a
        restart of the service; it ends cancelled). ``history="contiguous"``
        keeps every screenshot in the group's prompts, and each graded
        attempt then carries its ``sequence`` (one token sequence with a loss
        mask).
        """
        body: JSON = {"task": task}
        if group_size:
            body["group_size"] = group_size
        if key:
            body["key"] = key
        if history:
            body["history"] = history
        headers = {}
        if policy is not None:
            body["policy"] = policy
            if policy_key:
                headers["X-Legato-Policy-Key"] = policy_key
        return Group.from_json(self._request("POST", "/v1/groups", body, headers=headers))

    def group(self, group_id: str, wait: float = 0.0, inline_images: bool = False,
              steps: str = "", images: str = "") -> Group:
        """The group now, or once it ended if that is within ``wait`` seconds.

        ``steps`` is how much of each step comes: "full" (default), "prefix"
        (each step after the first holds what its prompt adds to the step
        before's: prompt_prefix_messages and prompt_prefix_ids say how much
        it shares) or "none" (only each attempt's outcome). ``images`` is
        "refs" (default: legato-image:// references, fetched with blob),
        "inline" (data URLs in every step's messages) or "attempt" (each
        image once, in the attempt's ``images``). Each step lists its
        prompt's images in order (sha256, bytes, width, height, and the
        token_span of their placeholder tokens in the prompt ids).
        """
        q = {"wait": f"{wait:g}"}
        _shape(q, inline_images, steps, images)
        path = f"/v1/groups/{urllib.parse.quote(group_id)}?" + urllib.parse.urlencode(q)
        return Group.from_json(self._request("GET", path, timeout=self.timeout + wait))

    def cancel(self, group_id: str) -> Group:
        """Cancel a group no longer wanted; attempts that finished stay recorded."""
        return Group.from_json(self._request("DELETE", f"/v1/groups/{urllib.parse.quote(group_id)}"))

    def stream(self, after: int = 0, limit: int = 0, idle: float = 0.0,
               inline_images: bool = False, reconnect: bool = True,
               retry_for: float = 120.0, steps: str = "", images: str = "") -> Iterator[StreamItem]:
        """Ended groups after cursor ``after``, in the order they ended,
        shaped by ``steps`` and ``images`` as ``group`` says.

        It yields groups as they end and returns after ``limit`` items (0: no
        limit) or ``idle`` seconds without one (0: never). With ``reconnect``
        a dropped connection (the service restarting) is retried from the
        last cursor yielded, so nothing is lost or repeated, until the
        failures in a row (no group read between them) span ``retry_for``
        seconds: then StreamError is raised, as it is at once for a line that
        is not a stream line.
        """
        sent = 0
        delay = 0.2
        failing_since: Optional[float] = None  # the first failure in a row
        failures = 0
        while True:
            q: JSON = {"after": after}
            if limit:
                q["limit"] = limit - sent
            if idle:
                q["wait"] = f"{idle:g}"
            _shape(q, inline_images, steps, images)
            req = urllib.request.Request(self.base_url + "/v1/stream?" + urllib.parse.urlencode(q))
            if self.token:
                req.add_header("Authorization", "Bearer " + self.token)
            got_any = False
            why = "the stream ended with no group"
            try:
                # No read timeout: the stream is quiet until a group ends.
                with urllib.request.urlopen(req, timeout=None if not idle else idle + self.timeout) as resp:
                    for raw in resp:
                        if not raw.strip():
                            continue
                        if not raw.endswith(b"\n"):
                            # The last line, cut short: the service went away.
                            raise http.client.IncompleteRead(raw)
                        item = _stream_item(raw, after)
                        after = item.cursor
                        sent += 1
                        got_any = True
                        delay, failing_since, failures = 0.2, None, 0
                        yield item
                        if limit and sent >= limit:
                            return
                if idle and not got_any:
                    return
            except urllib.error.HTTPError as e:
                if e.code == 401 and self._reload_token():
                    continue
                raise LegatoError(e.code, _message(e.read()), "GET", "/v1/stream") from None
            except (OSError, http.client.HTTPException) as e:
                # Connection refused or reset, or a line cut short: the
                # service went away. Read on from the cursor.
                if not reconnect:
                    raise
                why = f"{type(e).__name__}: {e}"
            if limit and sent >= limit:
                return
            if not got_any:
                now = time.monotonic()
                failures += 1
                if failing_since is None:
                    failing_since = now
                elif now - failing_since > retry_for:
                    raise StreamError(f"{self.base_url}: no group read in {failures} tries over {now - failing_since:.1f} s "
                                      f"(retry_for={retry_for:g}); last: {why}; read on from cursor {after} once the service is back",
                                      after)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- policy ------------------------------------------------------------

    def pause(self, drain: bool = False) -> JSON:
        """Hold new model calls (attempts keep their place) while weights swap.
        With ``drain`` it answers once no model call is in flight: every
        call sent under the old weights has come back, so they may go."""
        if drain:
            return self._request("POST", "/v1/policy", {"state": "paused", "drain": True},
                                 timeout=self.timeout + 600)
        return self._request("POST", "/v1/policy", {"state": "paused"})

    def serve(self, version: str = "", base_urls: Optional[List[str]] = None, force: bool = False) -> JSON:
        """Resume model calls; with ``version``, every later step carries it.
        ``base_urls`` move the calls to other servers (replicas of the new
        weights), e.g. when the trainer started them on new ports. ``force``
        puts a version in force that does not come after the current one
        (going back to earlier weights on purpose)."""
        body: JSON = {"state": "serving", "version": version}
        if base_urls:
            body["base_urls"] = list(base_urls)
        if force:
            body["force"] = True
        return self._request("POST", "/v1/policy", body)

    def policy(self) -> JSON:
        """The policy's state: version, state (serving or paused), held_calls
        (waiting at the pause), in_flight (sent, not yet answered), servers."""
        return self._request("GET", "/v1/policy")

    # -- the rest ------------------------------------------------------------

    def blob(self, sha256: str) -> bytes:
        """A screenshot's PNG, or a message's JSON, by the hash a step names
        (``legato-image://<sha256>`` in a sample's messages)."""
        data = self._request("GET", f"/v1/blobs/{sha256}")
        return data if isinstance(data, bytes) else json.dumps(data).encode()

    def blobs(self, sha256s: Sequence[str]) -> Dict[str, bytes]:
        """Several blobs in one call (at most 256 hashes): sha256 to bytes."""
        got = self._request("POST", "/v1/blobs", {"sha256": list(sha256s)})
        return {k: base64.b64decode(v) for k, v in got["blobs"].items()}

    def status(self) -> JSON:
        """Desktops, groups by state, the stream's last cursor, records by status."""
        return self._request("GET", "/v1/status")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the service answers, e.g. right after starting it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.status()
                return
            except (OSError, LegatoError) as e:
                if isinstance(e, LegatoError) and e.status == 401 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _stream_item(line: bytes, after: int) -> StreamItem:
    """A line of the stream, or StreamError saying what it is not."""
    try:
        d = json.loads(line)
        return StreamItem(cursor=int(d["cursor"]), group=Group.from_json(d["group"]))
    except (ValueError, KeyError, TypeError) as e:
        raise StreamError(f"after cursor {after}, a line that is not a stream line ({type(e).__name__}: {e}): "
                          f"{line[:200]!r}", after) from None


def _read_token(path: str) -> str:
    """The token in a service's token file, or "" when it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _shape(q: JSON, inline_images: bool, steps: str, images: str) -> None:
    """Adds a result's shape to query q."""
    if inline_images:
        images = images or "inline"
    if images:
        q["images"] = images
    if steps:
        q["steps"] = steps


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("error", raw.decode(errors="replace")))
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")


# -- helpers for trainers' glue (slime_glue.py, skyrl_glue.py) ---------------

# The token_ids_source values whose ids are the ones the server generated.
EXACT_SOURCES = ("return_token_ids", "tokens_as_ids", "meta_info")
# How a step's messages refer to a screenshot; Client.blob fetches it.
IMAGE_PREFIX = "legato-image://"


class NotContiguous(ValueError):
    """An attempt's prompts do not extend each other token for token, so it
    has no single-sequence (trajectory) layout."""


# -- reading an attempt ------------------------------------------------------


def untrainable_reason(attempt: Attempt) -> Optional[str]:
    """Why ``attempt`` gives no token-level training data, or None.

    A masked attempt never trains; an unmasked one needs, at every step,
    prompt token ids, exact generated ids and one logprob per id."""
    if attempt.masked:
        return f"masked by legato (status {attempt.status})"
    if attempt.advantage is None:
        return "no advantage"
    if not attempt.steps:
        return "no steps"
    for s in attempt.steps:
        n = s.get("step")
        if not s.get("prompt_token_ids"):
            return f"step {n}: no prompt_token_ids"
        if s.get("token_ids_source") not in EXACT_SOURCES:
            return f"step {n}: token ids not exact ({s.get('token_ids_source')!r})"
        ids, lps = s.get("response_token_ids") or [], s.get("response_logprobs")
        if lps is None or len(lps) != len(ids):
            return f"step {n}: {len(ids)} token ids but {'no' if lps is None else len(lps)} logprobs"
    return None


def trainable(group: Group) -> Tuple[List[Attempt], Dict[str, str]]:
    """The attempts of ``group`` that train, in attempt order, and why each
    of the others does not (``untrainable_reason``: masked attempts first)."""
    ok: List[Attempt] = []
    why: Dict[str, str] = {}
    for a in sorted(group.attempts, key=lambda a: a.attempt):
        reason = untrainable_reason(a)
        if reason:
            why[a.rollout_id] = reason
        else:
            ok.append(a)
    return ok, why


def image_refs(messages: Sequence[Dict[str, Any]]) -> List[str]:
    """The sha256 of every legato-image:// reference in ``messages``, in order."""
    out = []
    for m in messages or []:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith(IMAGE_PREFIX):
                    out.append(url[len(IMAGE_PREFIX):])
    return out


def concatenate_steps(steps: Sequence[Dict[str, Any]]) -> Tuple[List[int], List[int], List[int], List[float], List[int]]:
    """One attempt as one sequence: (prompt_ids, response_ids, loss_mask,
    logprobs, step_starts).

    ``prompt_ids`` is the first step's prompt. ``response_ids`` holds each
    step's generated ids (mask 1, the server's logprobs), each followed by the
    tokens the next step's prompt adds (mask 0, logprob 0.0). ``step_starts[i]``
    is where step i's generated ids start in ``response_ids``. Raises
    NotContiguous when a prompt does not begin with everything before it.
    """
    if not steps:
        raise NotContiguous("no steps")
    prompt = [int(t) for t in steps[0]["prompt_token_ids"]]
    seq = list(prompt)
    response: List[int] = []
    mask: List[int] = []
    lps: List[float] = []
    starts: List[int] = []
    for i, s in enumerate(steps):
        p = s["prompt_token_ids"]
        if i > 0:
            if len(p) < len(seq) or p[: len(seq)] != seq:
                raise NotContiguous(
                    f"rollout {s.get('rollout_id')} step {s.get('step')}: its prompt does not extend the previous "
                    "prompt and response token for token (run legato with --history contiguous, or use the step layout)")
            added = [int(t) for t in p[len(seq):]]
            response += added
            mask += [0] * len(added)
            lps += [0.0] * len(added)
            seq += added
        gen = [int(t) for t in s["response_token_ids"] or []]
        starts.append(len(response))
        response += gen
        mask += [1] * len(gen)
        lps += [float(x) for x in s["response_logprobs"] or []]
        seq += gen
    return prompt, response, mask, lps, starts


def step_images(step: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The images of a step's prompt in order, as legato lists them: each
    ``{"sha256", "bytes", "width", "height"[, "token_span"]}``, the span
    being [start, end) of its placeholder tokens in the prompt's ids. A
    step without that list (from before legato listed images) gives its
    messages' legato-image:// references, sha256 only."""
    images = step.get("images")
    if images is not None:
        return [dict(img) for img in images]
    return [{"sha256": sha} for sha in image_refs(step.get("messages") or [])]


# -- weight sync ---------------------------------------------------------------


class WeightSync:
    """legato's side of a trainer's weight update: ``before`` holds new
    model calls and waits until none is in flight (POST /v1/policy paused,
    drain), so no call is answered half by the old weights and half by the
    new ones, or aborted by the swap; ``after`` serves ``version`` on
    ``base_urls``, the OpenAI API roots that serve the new weights (the
    trainer's router or engines), so every step from then on carries the
    version and goes where the weights are.

    Versions only go up in legato. A trainer restarted from a checkpoint
    older than the last version it served goes back on purpose: the first
    ``after`` of a process is sent with ``force`` when legato refuses it
    (409), and journaled so; a later refusal is raised.

    An update that raises leaves legato paused: nothing is generated with
    weights half swapped. The next ``after`` (a restarted trainer's first
    sync) serves again.
    """

    def __init__(self, client: "Client", base_urls: Optional[Sequence[str]] = None) -> None:
        self.client = client
        self.base_urls = [u for u in (base_urls or []) if u]
        self.synced: List[str] = []  # the versions served, in order

    def before(self) -> None:
        self.client.pause(drain=True)

    def after(self, version: str) -> JSON:
        try:
            st = self.client.serve(version, self.base_urls)
        except LegatoError as e:
            if e.status != 409 or self.synced:
                raise
            st = self.client.serve(version, self.base_urls, force=True)
        self.synced.append(version)
        return st

    def around(self, version: str, update: Any, *args: Any, **kwargs: Any) -> Any:
        """``update(*args, **kwargs)`` between ``before`` and ``after``."""
        self.before()
        out = update(*args, **kwargs)
        self.after(version)
        return out

    async def around_async(self, version: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
        """``around`` for a coroutine function ``update``; ``version`` may be
        a function, called once the update is done. The client's calls run
        in a thread, so the trainer's event loop keeps going."""
        import asyncio
        await asyncio.to_thread(self.before)
        out = await update(*args, **kwargs)
        v = version() if callable(version) else version
        await asyncio.to_thread(self.after, v)
        return out
