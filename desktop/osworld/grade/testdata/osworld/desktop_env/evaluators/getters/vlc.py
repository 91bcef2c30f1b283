"""The default video player getter: our own version of OSWorld's, which asks
the guest server for each video type's default application, one request per
type listed (repeats included), and returns the most common answer."""

from collections import Counter

from .general import get_vm_command_line

VIDEO_TYPES = [
    "3gp", "3gp", "3gpp", "3gpp", "3gpp2", "3gpp2", "avi", "avi", "divx", "divx", "dv", "dv", "fli", "fli",
    "flv", "flv", "mp2t", "mp2t", "mp4", "mp4", "mp4v-es", "mp4v-es", "mpeg", "mpeg", "mpeg-system",
    "mpeg-system", "msvideo", "msvideo", "ogg", "ogg", "quicktime", "quicktime", "vnd.divx", "vnd.divx",
    "vnd.mpegurl", "vnd.mpegurl", "vnd.rn-realvideo", "vnd.rn-realvideo", "webm", "webm", "x-anim", "x-anim",
    "x-avi", "x-avi", "x-flc", "x-flc", "x-fli", "x-fli", "x-flv", "x-flv", "x-m4v", "x-m4v", "x-matroska",
    "x-matroska", "x-mpeg", "x-mpeg", "x-mpeg-system", "x-mpeg-system", "x-mpeg2", "x-mpeg2", "x-ms-asf",
    "x-ms-asf", "x-ms-asf-plugin", "x-ms-asf-plugin", "x-ms-asx", "x-ms-asx", "x-ms-wm", "x-ms-wm", "x-ms-wmv",
    "x-ms-wmv", "x-ms-wmx", "x-ms-wmx", "x-ms-wvx", "x-ms-wvx", "x-msvideo", "x-msvideo", "x-nsv", "x-nsv",
    "x-ogm", "x-ogm", "x-ogm+ogg", "x-theora", "x-theora", "x-theora+ogg", "x-theora+ogg",
]


def get_default_video_player(env, config):
    if env.vm_platform != "Linux":
        raise Exception("Unsupported operating system", env.vm_platform)
    answers = []
    for t in VIDEO_TYPES:
        app = get_vm_command_line(env, {"command": ["xdg-mime", "query", "default", "video/" + t]})
        if app:
            answers.append(app)
    if not answers:
        return "unknown"
    return Counter(answers).most_common(1)[0][0]
