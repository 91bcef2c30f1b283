"""Does the glue's output fit the trainers' interfaces? Standard library only.

The interfaces are the descriptors in descriptors/ (slime.json, skyrl.json,
verl.json), which descriptors/extract.py reads from each framework's source
at a pinned commit: field names and annotated types of what the glue builds
(slime's ``Sample``, SkyRL's ``GeneratorOutput``, verl's ``AgentLoopOutput``)
and the rules the framework checks on it (SkyRL's
``validate_generator_output``, slime's sample conversion). Each ``check_*``
returns the problems found, as sentences; none means the output fits.

A field the glue sets that the framework does not have, a value whose type
the annotation does not admit, a required field missing or a rule broken is
a problem. Annotations name types the descriptor cannot resolve without the
framework (``torch.Tensor``): those are opaque and admit any value.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import os
import sys
import types
from typing import Any, Dict, Iterable, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
DESCRIPTORS = os.path.join(HERE, "descriptors")
FRAMEWORKS = ("slime", "skyrl", "verl")


def load(name: str, directory: str = DESCRIPTORS) -> Dict[str, Any]:
    """The descriptor of framework ``name`` (slime, skyrl or verl)."""
    with open(os.path.join(directory, f"{name}.json")) as f:
        return json.load(f)


# -- types -----------------------------------------------------------------------

_BUILTIN = {"int", "float", "str", "bool", "bytes", "dict", "list", "tuple", "set", "object", "Any", "None",
            "NoneType", "Dict", "List", "Tuple", "Set", "Optional", "Union", "Literal", "Sequence", "Mapping",
            "Callable", "Hashable", "TypeAlias"}


def type_problem(value: Any, annotation: str, types: Dict[str, Any], where: str) -> Optional[str]:
    """Why ``value`` does not fit ``annotation`` (a type as written in the
    framework's source), or None. ``types`` resolves the framework's own
    names: dataclasses, TypedDicts, enums and aliases the descriptor holds."""
    try:
        node = _parse(annotation)
    except SyntaxError:
        return f"{where}: annotation {annotation!r} does not parse"
    return _fits(value, node, types, where, 0)


_PARSED: Dict[str, ast.AST] = {}


def _parse(annotation: str) -> ast.AST:
    if annotation not in _PARSED:
        _PARSED[annotation] = ast.parse(annotation, mode="eval").body
    return _PARSED[annotation]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value  # a forward reference
    return ast.unparse(node)


def _args(node: ast.AST) -> List[ast.AST]:
    return list(node.elts) if isinstance(node, ast.Tuple) else [node]


# Built-in types by name, as a checker admits them.
_SIMPLE = {"int": lambda x: isinstance(x, int) and not isinstance(x, bool),
           # PEP 484: an int is accepted where a float is.
           "float": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
           "str": lambda x: isinstance(x, str), "bool": lambda x: isinstance(x, bool),
           "bytes": lambda x: isinstance(x, bytes), "dict": lambda x: isinstance(x, dict),
           "list": lambda x: isinstance(x, list), "tuple": lambda x: isinstance(x, tuple),
           "None": lambda x: x is None, "NoneType": lambda x: x is None}


def _bad(v: Any, node: ast.AST, where: str) -> str:
    return f"{where}: {type(v).__name__} {_short(v)} is not {ast.unparse(node)}"


def _fits(v: Any, node: ast.AST, types: Dict[str, Any], where: str, depth: int) -> Optional[str]:
    if depth > 20:
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        alts = [node.left, node.right]
        return None if any(_fits(v, a, types, where, depth + 1) is None for a in alts) else _bad(v, node, where)
    if isinstance(node, ast.Subscript):
        head, args = _name(node.value), _args(node.slice)
        head = head.rsplit(".", 1)[-1] if head.startswith("typing.") else head
        if head == "Optional":
            return None if v is None else _fits(v, args[0], types, where, depth + 1)
        if head == "Union":
            return None if any(_fits(v, a, types, where, depth + 1) is None for a in args) else _bad(v, node, where)
        if head == "Literal":
            return None if any(isinstance(a, ast.Constant) and a.value == v for a in args) else _bad(v, node, where)
        if head in ("List", "list", "Sequence"):
            if not isinstance(v, list):
                return _bad(v, node, where)
            elem = args[0]
            simple = _SIMPLE.get(_name(elem)) if isinstance(elem, ast.Name) else None
            if simple is not None and all(simple(x) for x in v):
                return None  # the common case (token ids), at list speed
            for i, x in enumerate(v):
                p = _fits(x, elem, types, f"{where}[{i}]", depth + 1)
                if p:
                    return p
            return None
        if head in ("Dict", "dict", "Mapping"):
            if not isinstance(v, dict):
                return _bad(v, node, where)
            for k, x in v.items():
                p = _fits(k, args[0], types, f"{where} key", depth + 1) or \
                    _fits(x, args[1], types, f"{where}[{k!r}]", depth + 1)
                if p:
                    return p
            return None
        if head in ("Tuple", "tuple"):
            if not isinstance(v, (tuple, list)):
                return _bad(v, node, where)
            if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
                return next((p for i, x in enumerate(v) if (p := _fits(x, args[0], types, f"{where}[{i}]", depth + 1))), None)
            if len(v) != len(args):
                return _bad(v, node, where)
            return next((p for i, (x, a) in enumerate(zip(v, args)) if (p := _fits(x, a, types, f"{where}[{i}]", depth + 1))), None)
        return _fits(v, node.value, types, where, depth + 1)  # Callable[...] and the like: its head
    name = _name(node)
    if name in _SIMPLE:
        return None if _SIMPLE[name](v) else _bad(v, node, where)
    if name in ("Any", "object", "typing.Any"):
        return None
    t = types.get(name)
    if t is None:
        return None  # opaque (torch.Tensor, ...): the descriptor cannot say
    kind = t["kind"]
    if kind == "alias":
        return _fits(v, _parse(t["type"]), types, where, depth + 1)
    if kind == "enum":
        got = v.value if isinstance(v, enum.Enum) else v
        return None if got in t["values"] else f"{where}: {got!r} is not one of {name}'s values {t['values']}"
    if kind in ("dataclass", "model", "typeddict"):
        if v is None:
            return _bad(v, node, where)
        items = _items(v)
        if items is None:
            return _bad(v, node, where)
        return next((p for p in field_problems(items, t["fields"], types, f"{where} ({name})", require=True)), None)
    return None


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _items(obj: Any) -> Optional[Dict[str, Any]]:
    """An object's fields by name: a dict's items, a dataclass's fields, a
    pydantic model's or a plain object's attributes."""
    if isinstance(obj, dict):
        return dict(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)} | {
            k: v for k, v in vars(obj).items() if not k.startswith("_")}
    if hasattr(obj, "model_dump"):  # pydantic 2
        return {k: getattr(obj, k) for k in type(obj).model_fields}
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    return None


def field_problems(items: Dict[str, Any], fields: Dict[str, Any], types: Dict[str, Any], where: str,
                   require: bool = True) -> Iterable[str]:
    """Every field in ``items`` must be one of ``fields`` with a value its
    type admits; with ``require`` every field without a default must be
    there."""
    for k, v in items.items():
        f = fields.get(k)
        if f is None:
            yield f"{where}: field {k!r} is not one of the framework's ({', '.join(sorted(fields))})"
            continue
        p = type_problem(v, f["type"], types, f"{where}.{k}")
        if p:
            yield p
    if require:
        for k, f in fields.items():
            if f.get("required") and k not in items:
                yield f"{where}: required field {k!r} is missing"


# -- slime -----------------------------------------------------------------------


def _walk_samples(node: Any, depth: int = 0) -> Iterable[tuple]:
    if isinstance(node, list):
        for x in node:
            yield from _walk_samples(x, depth + 1)
    else:
        yield node, depth


def check_slime(groups: Sequence[Any], desc: Dict[str, Any]) -> List[str]:
    """A rollout function's samples (``list[list[Sample]]``, or a list of
    per-step lists per rollout in the step layout) against slime's
    ``Sample`` and the rules its rollout manager applies to them."""
    types, fields = desc["types"], desc["types"]["Sample"]["fields"]
    problems: List[str] = []
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        return ["samples: not a list of groups (list[list[Sample]])"]
    flat = []
    for i, (s, depth) in enumerate(_walk_samples(groups)):
        items = _items(s)
        if items is None:
            problems.append(f"sample {i}: a {type(s).__name__}, not a Sample")
            continue
        problems += field_problems(items, fields, types, f"sample {i}")
        flat.append(s)
    for rule in desc["rules"]:
        problems += _slime_rule(rule, groups, flat)
    return problems


def _slime_rule(rule: Dict[str, Any], groups: Any, flat: List[Any]) -> List[str]:
    kind = rule["rule"]
    out = []
    if kind == "length_equals_field":  # len(sample.A) == sample.B
        for i, s in enumerate(flat):
            a = getattr(s, rule["field"], None)
            n = getattr(s, rule["equals"], None)
            if a is not None and len(a) != n:
                out.append(f"sample {i}: len({rule['field']}) {len(a)} != {rule['equals']} {n}")
    elif kind == "siblings_share":  # lists at depth >= min_depth share a set field
        def walk(node: Any, depth: int) -> None:
            if isinstance(node, list) and node and not isinstance(node[0], list):
                if depth >= rule["min_depth"] and len(node) > 1:
                    vals = [getattr(s, rule["field"], None) for s in node]
                    if any(v is None for v in vals) or len(set(vals)) != 1:
                        out.append(f"samples of one rollout at depth {depth}: {rule['field']} {vals}, "
                                   "want one value, set on each")
                return
            for x in node if isinstance(node, list) else []:
                walk(x, depth + 1)
        walk(groups, 0)
    elif kind == "post_process_lengths":
        pass  # checked where reward_post_process runs (check_slime_post_process)
    elif kind == "gated":
        pass  # a feature the glue does not turn on
    else:
        out.append(f"rule {kind!r}: this checker does not know it (update glue_conform.py)")
    return out


def check_slime_post_process(raw: List[float], adv: List[float], samples: List[Any], desc: Dict[str, Any]) -> List[str]:
    if not any(r["rule"] == "post_process_lengths" for r in desc["rules"]):
        return []
    out = []
    for name, xs in (("raw rewards", raw), ("rewards", adv)):
        if len(xs) != len(samples):
            out.append(f"reward post-process: {len(xs)} {name} for {len(samples)} samples")
    return out


# -- SkyRL -------------------------------------------------------------------------


def check_skyrl(output: Dict[str, Any], num_prompts: int, step_wise: bool, desc: Dict[str, Any]) -> List[str]:
    """A generator's output against SkyRL's GeneratorOutput and the rules
    of its validate_generator_output (``step_wise`` as the trainer would
    call it)."""
    types = desc["types"]
    problems = list(field_problems(output, types["GeneratorOutput"]["fields"], types, "GeneratorOutput"))
    for rule in desc["validate_generator_output"]["rules"]:
        problems += _skyrl_rule(rule, output, num_prompts, step_wise)
    return problems


def _when(rule: Dict[str, Any], step_wise: bool) -> bool:
    w = rule.get("when", "")
    return not (w == "step_wise" and not step_wise or w == "not step_wise" and step_wise)


def _key(tid: Any) -> str:
    return tid.to_string() if hasattr(tid, "to_string") else str(tid)


def _skyrl_rule(rule: Dict[str, Any], out: Dict[str, Any], num_prompts: int, step_wise: bool) -> List[str]:
    if not _when(rule, step_wise):
        return []
    kind = rule["rule"]
    get = out.get
    try:
        if kind == "nonempty":
            return [] if get(rule["key"]) else [f"{rule['key']}: empty"]
        if kind == "rows_equal_prompts":
            n = len(get(rule["key"]) or [])
            return [] if n == num_prompts else [f"{rule['key']}: {n} rows for {num_prompts} prompts"]
        if kind == "same_length":
            a, b = rule["keys"]
            if get(a) is None or get(b) is None:
                return [f"same length {a}, {b}: {a if get(a) is None else b} is missing"]
            return [] if len(get(a)) == len(get(b)) else [f"{a}: {len(get(a))} rows, {b}: {len(get(b))}"]
        if kind == "list_keys_same_length":
            n = len(get(rule["as"]) or [])
            return [f"{k}: {len(get(k))} rows, {rule['as']}: {n}" for k in rule["keys"]
                    if isinstance(get(k), list) and len(get(k)) != n]
        if kind == "row_same_length":
            a, b = rule["keys"]
            probs = []
            if rule.get("when_set"):
                if rule["when_set"] not in out:
                    return [f"{rule['when_set']}: missing (validate_generator_output reads it)"]
                if not get(rule["when_set"]):
                    return []
            probs += [f"{k}: missing (validate_generator_output reads it)" for k in (a, b) if k not in out]
            if probs:
                return probs
            for i, (x, y) in enumerate(zip(get(a) or [], get(b) or [])):
                if rule.get("when_row_list") and not isinstance(get(rule["when_row_list"])[i], list):
                    continue
                if len(x) != len(y):
                    probs.append(f"row {i}: {a} has {len(x)}, {b} {len(y)}")
            return probs
        if kind == "uniform_nesting":
            xs = get(rule["key"]) or []
            kinds = {isinstance(x, list) for x in xs}
            return [] if len(kinds) <= 1 else [f"{rule['key']}: lists and scalars mixed"]
        if kind == "required":
            return [] if get(rule["key"]) is not None else [f"{rule['key']}: missing (None)"]
        if kind == "last_true":
            xs = get(rule["key"]) or [None]
            return [] if xs[-1] is True else [f"{rule['key']}[-1] is {xs[-1]!r}, not True"]
        if kind == "some_true":
            return [] if any(get(rule["key"]) or []) else [f"{rule['key']}: no True"]
        if kind == "contiguous":
            seen, prev, probs = set(), None, []
            for i, t in enumerate(get(rule["key"]) or []):
                k = _key(t)
                if k != prev:
                    if k in seen:
                        probs.append(f"{rule['key']}[{i}]: {k} again after others")
                    if prev is not None:
                        seen.add(prev)
                    prev = k
            return probs
        if kind == "flag_at_boundaries":
            flags, tids, probs = get(rule["flag"]) or [], get(rule["key"]) or [], []
            for i in range(len(tids) - 1):
                edge = _key(tids[i]) != _key(tids[i + 1])
                if (flags[i] is True) != edge:
                    probs.append(f"row {i}: {rule['flag']} {flags[i]!r} but the trajectory "
                                 f"{'ends' if edge else 'goes on'}")
            return probs
    except (TypeError, IndexError, KeyError) as e:
        return [f"rule {kind} on {rule}: {type(e).__name__}: {e}"]
    return [f"rule {kind!r}: this checker does not know it (update glue_conform.py)"]


def strict_input(fields: Dict[str, Any], values: Dict[str, Any]) -> Dict[str, Any]:
    """A SkyRL GeneratorInput holding ``values``, whose reads of a key the
    TypedDict does not declare raise KeyError: the glue must read only
    what SkyRL gives."""
    unknown = set(values) - set(fields)
    if unknown:
        raise KeyError(f"GeneratorInput has no {sorted(unknown)}")

    class Input(dict):
        def __getitem__(self, k: str) -> Any:
            if k not in fields:
                raise KeyError(f"GeneratorInput has no key {k!r} (it has {sorted(fields)})")
            return dict.__getitem__(self, k)

        def get(self, k: str, default: Any = None) -> Any:
            if k not in fields:
                raise KeyError(f"GeneratorInput has no key {k!r} (it has {sorted(fields)})")
            return dict.get(self, k, default)
    return Input({k: values.get(k) for k in fields})


# -- verl --------------------------------------------------------------------------


def check_verl(outputs: Sequence[Any], desc: Dict[str, Any]) -> List[str]:
    """Agent-loop outputs against verl's AgentLoopOutput (and its
    AgentLoopMetrics), what verl's worker reads of them, and the lengths its
    padding lines up."""
    types = desc["types"]
    fields = types["AgentLoopOutput"]["fields"]
    problems: List[str] = []
    for i, o in enumerate(outputs):
        items = _items(o)
        if items is None:
            problems.append(f"output {i}: a {type(o).__name__}")
            continue
        problems += field_problems(items, fields, types, f"output {i}")
        for attr in desc["worker_reads"]["output"]:
            if attr not in items:
                problems.append(f"output {i}: verl's worker reads {attr!r}, which it lacks")
        mm = items.get("multi_modal_data") or {}
        for k in mm:
            if k not in desc["worker_reads"]["multi_modal_data"]:
                problems.append(f"output {i}: multi_modal_data[{k!r}] is not read by verl "
                                f"(it reads {desc['worker_reads']['multi_modal_data']})")
        # verl pads prompt_ids, response_ids, response_mask and
        # response_logprobs apart: unequal lengths misalign them silently.
        n = len(items.get("response_ids") or [])
        for k in ("response_mask", "response_logprobs"):
            if items.get(k) is not None and len(items[k]) != n:
                problems.append(f"output {i}: {k} has {len(items[k])} entries for {n} response ids")
    return problems


def check_signature(fn: Any, spec: Dict[str, Any], where: str) -> List[str]:
    """``fn`` takes the parameters ``spec`` (from the framework's own
    definition) names, and is a coroutine function when it is."""
    import inspect
    out = []
    if spec.get("async") and not inspect.iscoroutinefunction(fn):
        out.append(f"{where}: not async, as the framework's is")
    params = inspect.signature(fn).parameters
    names = [p for p in params if p != "self"]
    for p in spec["params"]:
        if p not in names and not any(q.kind == q.VAR_KEYWORD for q in params.values()):
            out.append(f"{where}: no parameter {p!r} (the framework passes {spec['params']})")
    if spec.get("kwargs") and not any(q.kind == q.VAR_KEYWORD for q in params.values()):
        out.append(f"{where}: takes no **kwargs, which the framework passes")
    return out


# -- the glue on legato's groups ---------------------------------------------------

G = 3  # attempts per group
TASK = {"task_id": "demo-write-note", "domain": "os"}
# A service on fake desktops whose groups have masked attempts (oversample)
# and contiguous sequences, at no speed cost (no latencies, no settle wait).
FIXTURE_FLAGS = ("--fake-speed", "none", "--no-ready-signal", "--desktops", "2", "--oversample", "1",
                 "--history", "contiguous", "--max-steps", "3")


def skyrl_batch(instances: int, trajectory_id: Any, batch_metadata: Any, size: int = G,
                task: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A GeneratorInput as SkyRL's prepare_generator_input lays it out:
    each instance's prompt ``size`` times, its task in ``env_extras``."""
    prompts, extras, tids = [], [], []
    for u in range(instances):
        for r in range(size):
            prompts.append([{"role": "user", "content": "write a note"}])
            extras.append({"legato_task": dict(task or TASK)})
            tids.append(trajectory_id(instance_id=f"uid{u}", repetition_id=r))
    return {"prompts": prompts, "env_classes": ["legato"] * len(prompts), "env_extras": extras,
            "sampling_params": None, "trajectory_ids": tids, "batch_metadata": batch_metadata}


@dataclasses.dataclass
class GlueOutputs:
    """What each glue makes of the same ended legato groups."""

    groups: List[Any]
    slime: Dict[str, Any]  # layout: the rollout function's samples
    slime_post: Any  # (raw rewards, advantages, flat samples) of the trajectory layout
    skyrl: Dict[str, Any]  # layout: (number of prompts, GeneratorOutput)
    verl: List[Any]


def ended_groups(client: Any, n: int = 2, wait: float = 120.0) -> List[Any]:
    """``n`` groups of ``G`` attempts at TASK, once they ended."""
    ids = [client.submit(TASK, group_size=G).id for _ in range(n)]
    out = []
    for gid in ids:
        g = client.group(gid, wait=wait)
        if not g.ended:
            raise TimeoutError(f"group {gid} still {g.state} after {wait:g}s")
        out.append(g)
    return out


def glue_outputs(client: Any, groups: Optional[List[Any]] = None, skyrl_input: Any = None) -> GlueOutputs:
    """Each glue's output on ``groups`` (default: two new ended groups).
    ``skyrl_input(values) -> batch`` builds SkyRL's input (default: the
    dict itself)."""
    import skyrl_glue
    import slime_glue
    import verl_glue
    if groups is None:
        groups = ended_groups(client)
        # And the first as legato sends a group one of whose counted
        # attempts is masked after all (its sequence could not be built):
        # fewer trainable attempts than slots, so placeholders.
        victim = next(a for a in groups[0].attempts if not a.masked)
        groups.append(dataclasses.replace(groups[0], attempts=[
            dataclasses.replace(a, masked=True) if a is victim else a for a in groups[0].attempts]))
    templates = lambda i: [slime_glue.LegatoSample(group_index=i, index=i * G + j, prompt="write a note",  # noqa: E731
                                                   metadata={"legato_task": dict(TASK)}) for j in range(G)]
    slime = {layout: [slime_glue.group_to_samples(g, templates(i), layout=layout) for i, g in enumerate(groups)]
             for layout in ("trajectory", "step")}
    flat = [s for grp in slime["trajectory"] for s in grp]
    raw, adv = slime_glue.reward_post_process(None, flat)
    skyrl = {}
    for layout in ("trajectory", "step"):
        gen = skyrl_glue.LegatoGenerator(client, layout=layout)
        values = skyrl_batch(len(groups), skyrl_glue.TrajectoryID, None)
        batch = skyrl_input(values) if skyrl_input else values
        skyrl[layout] = (len(values["prompts"]), gen.output_for(batch, groups))
    images = lambda shas: [client.blob(s) for s in shas]  # noqa: E731
    verl = [o for g in groups for o in verl_glue.group_outputs(g, G, images=images)]
    return GlueOutputs(groups, slime, (raw, adv, flat), skyrl, verl)


def conformance(name: str, out: GlueOutputs, desc: Dict[str, Any]) -> List[tuple]:
    """(what, problems) for each check of framework ``name``'s glue."""
    if name == "slime":
        import slime_glue
        ws = desc["weight_sync"]
        seam = []
        if slime_glue.SEAM["group_method"] not in ws["trainer_group"]["methods"]:
            seam.append(f"{ws['trainer_group']['class']} has no {slime_glue.SEAM['group_method']}")
        if not all(ws["update_weights_calls"].values()):
            seam.append(f"a training script does not call actor_model.update_weights: {ws['update_weights_calls']}")
        seam += [f"slime has no argument {a}" for a in slime_glue.SEAM["router_args"] if a not in ws["router_args"]]
        raw, adv, flat = out.slime_post
        return [("trajectory layout samples", check_slime(out.slime["trajectory"], desc)),
                ("step layout samples", check_slime(out.slime["step"], desc)),
                ("reward post-process", check_slime_post_process(raw, adv, flat, desc)),
                ("generate_rollout's parameters", check_signature(slime_glue.generate_rollout, desc["rollout_function"],
                                                                  "generate_rollout")),
                ("weight sync seam", seam)]
    if name == "skyrl":
        import skyrl_glue
        ws = desc["weight_sync"]
        seam = []
        for t, info in ws["trainers"].items():
            defined = info["defines"] + [m for b in info["bases"] for m in ws["trainers"].get(b, {}).get("defines", [])]
            if skyrl_glue.SEAM["trainer_method"] not in defined:
                seam.append(f"{t} has no {skyrl_glue.SEAM['trainer_method']}")
            if f"self.dispatch.{skyrl_glue.SEAM['dispatch_method']}" not in info["train_awaits"]:
                seam.append(f"{t}.train does not await dispatch.{skyrl_glue.SEAM['dispatch_method']}")
        if skyrl_glue.SEAM["router_field"] not in ws["engine_client_fields"]:
            seam.append(f"the engine client has no {skyrl_glue.SEAM['router_field']}")
        if not hasattr(skyrl_glue.LegatoDispatch, skyrl_glue.SEAM["dispatch_method"]):
            seam.append(f"LegatoDispatch does not wrap {skyrl_glue.SEAM['dispatch_method']}")
        n_t, o_t = out.skyrl["trajectory"]
        n_s, o_s = out.skyrl["step"]
        return [("trajectory layout (step_wise=False)", check_skyrl(o_t, n_t, False, desc)),
                ("step layout (step_wise=True)", check_skyrl(o_s, n_s, True, desc)),
                ("generate's parameters", check_signature(skyrl_glue.LegatoGenerator.generate, desc["generate"],
                                                          "LegatoGenerator.generate")),
                ("weight sync seam", seam)]
    if name == "verl":
        import verl_glue
        ws = desc["weight_sync"]
        seam = []
        if verl_glue.SEAM["manager_method"] not in ws["manager_methods"] or not ws["fit_calls_update_weights"]:
            seam.append(f"the trainer does not update weights through checkpoint_manager.{verl_glue.SEAM['manager_method']}")
        if verl_glue.SEAM["replica_addresses"] not in ws["manager_address_fields"]:
            seam.append(f"the agent loop manager has no {verl_glue.SEAM['replica_addresses']}")
        return [("agent loop outputs", check_verl(out.verl, desc)),
                ("run's parameters", check_signature(verl_glue.LegatoAgentLoop.run, desc["run"], "LegatoAgentLoop.run")),
                ("__init__'s parameters", check_signature(verl_glue.LegatoAgentLoop.__init__, desc["init"],
                                                          "LegatoAgentLoop.__init__")),
                ("weight sync seam", seam)]
    raise ValueError(f"framework {name!r}: one of {FRAMEWORKS}")


def stub_modules(modules: Dict[str, Dict[str, Any]]):
    """Install stand-in modules (name -> attributes) in sys.modules, with
    their parent packages; returns a function that removes them."""
    added = []
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            mod = ".".join(parts[:i])
            if mod not in sys.modules:
                sys.modules[mod] = types.ModuleType(mod)
                added.append(mod)
        for k, v in attrs.items():
            setattr(sys.modules[name], k, v)
        for i in range(1, len(parts)):
            setattr(sys.modules[".".join(parts[:i])], parts[i], sys.modules[".".join(parts[:i + 1])])

    def remove() -> None:
        for mod in added:
            sys.modules.pop(mod, None)
    return remove
