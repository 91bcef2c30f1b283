# Test fixture laid out like OSWorld's desktop_env/evaluators/getters: the
# package imports every getter from its module, as OSWorld's does.
from .file import get_cache_file, get_cloud_file, get_vm_file
from .general import get_vm_command_line
from .misc import (
    get_accessibility_tree,
    get_env_probe,
    get_no_such_file,
    get_rule,
    get_signal_guest,
)
from .vlc import get_default_video_player
