"""Rule and probe getters."""


def get_rule(env, config):
    return config["rules"]


def get_accessibility_tree(env, *args):
    return env.controller.get_accessibility_tree()


def get_env_probe(env, config):
    """What a getter sees of the env object legato builds."""
    controller = env.controller
    return {
        "vm_ip": env.vm_ip,
        "server_port": env.server_port,
        "chromium_port": env.chromium_port,
        "vlc_port": env.vlc_port,
        "cache_dir": env.cache_dir,
        "vm_platform": env.vm_platform,
        "controller": sorted(
            name
            for name in ("get_file", "execute_python_command", "get_accessibility_tree", "get_terminal_output")
            if callable(getattr(controller, name, None))
        ),
    }


def get_no_such_file(env, config):
    raise FileNotFoundError(config.get("path", "nothing"))


def get_signal_guest(env, config):
    """Tells the test's guest that grading has started, then hands on the
    rules."""
    env.controller.get_file(config["signal"])
    return config.get("rules")
