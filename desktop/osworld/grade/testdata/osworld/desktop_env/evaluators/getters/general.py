"""Command getters: our own version of OSWorld's, which posts to the guest
server directly rather than through the controller."""

import json
import urllib.error
import urllib.request


def get_vm_command_line(env, config):
    body = json.dumps({"command": config["command"], "shell": config.get("shell", False)}).encode()
    req = urllib.request.Request(
        "http://%s:%d/execute" % (env.vm_ip, env.server_port),
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req) as resp:
            return json.loads(resp.read())["output"]
    except urllib.error.HTTPError:
        return None
