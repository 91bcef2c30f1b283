"""Our own implementations of OSWorld's os metrics that read GNOME settings
(gsettings output), with the same signatures and the same behaviour
(including where OSWorld's raise), written for legato's differential tests."""


def check_gnome_favorite_apps(apps_str, rule):
    shown = eval(apps_str)
    wanted = rule["expected"]
    if len(shown) != len(wanted):
        return 0
    return 1 if set(shown) == set(wanted) else 0


def check_text_enlarged(scaling_factor_str):
    return 1 if float(scaling_factor_str) > 1.0 else 0
