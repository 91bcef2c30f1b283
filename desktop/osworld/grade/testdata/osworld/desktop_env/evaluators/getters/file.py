"""Getters for files: our own versions of OSWorld's, same behaviour."""

import os
import urllib.request
from datetime import datetime


def _pairs(config):
    if config.get("multi", False):
        return list(zip(config["path"], config["dest"]))
    return [(config["path"], config["dest"])]


def _hand_out(paths):
    return paths[0] if len(paths) == 1 else paths


def get_vm_file(env, config):
    pairs = _pairs(config)
    if not config.get("multi", False) and config.get("time_suffix", False):
        stamp = datetime.now().strftime(config.get("time_format", "%Y%m%d_%H%M%S"))
        stem, ext = os.path.splitext(pairs[0][1])
        pairs = [(pairs[0][0], "%s_%s%s" % (stem, stamp, ext))]
    wanted = set(config.get("gives", [0]))
    out = []
    for i, (src, dest) in enumerate(pairs):
        local = os.path.join(env.cache_dir, dest)
        content = env.controller.get_file(src)
        if content is None:
            if i in wanted:
                out.append(None)
            continue
        with open(local, "wb") as f:
            f.write(content)
        if i in wanted:
            out.append(local)
    return _hand_out(out)


def get_cloud_file(env, config):
    wanted = set(config.get("gives", [0]))
    out = []
    for i, (url, dest) in enumerate(_pairs(config)):
        local = os.path.join(env.cache_dir, dest)
        if i in wanted:
            out.append(local)
        if os.path.exists(local):
            continue
        with urllib.request.urlopen(url) as resp, open(local, "wb") as f:
            f.write(resp.read())
    return _hand_out(out)


def get_cache_file(env, config):
    local = os.path.join(env.cache_dir, config["path"])
    assert os.path.exists(local)
    return local
