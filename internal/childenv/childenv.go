// Package childenv builds the environments of the processes legato starts.
//
// A child never inherits legato's environment whole: that holds the model
// server's key (LEGATO_POLICY_KEY) and whatever else the user exported,
// and children such as QEMU clones run as another user, whose /proc/PID/
// environ that user can read. Each child gets only what it needs.
package childenv

import "strings"

// SystemPath is the PATH of children that need no user's PATH.
const SystemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Minimal is the environment of a system program (QEMU, qemu-img): a
// fixed PATH, the C locale, and extra ("NAME=value").
func Minimal(extra ...string) []string {
	return append([]string{"PATH=" + SystemPath, "LC_ALL=C"}, extra...)
}

// pythonNames are the variables a Python program of the user's (OSWorld's
// evaluators) may need from legato's environment: where programs,
// libraries and data are, the locale and time zone, and the threading
// knobs of numeric libraries.
var pythonNames = []string{
	"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "TEMP", "TMP",
	"VIRTUAL_ENV", "LD_LIBRARY_PATH", "NLTK_DATA", "SSL_CERT_FILE", "SSL_CERT_DIR",
}

var pythonPrefixes = []string{
	"LC_", "PYTHON", "CONDA_", "OPENBLAS_", "OMP_", "MKL_", "HF_", "XDG_",
}

// Python is the environment of a Python program of the user's, taken from
// env (os.Environ() in production) by the allowlist above, then extra.
// LEGATO_* variables never pass, whatever their prefix, nor any whose name
// says it holds a credential (secretName): an allowed prefix covers
// HF_TOKEN as well as HF_HOME.
func Python(env []string, extra ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || strings.HasPrefix(name, "LEGATO_") || !allowed(name) || secretName(name) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func allowed(name string) bool {
	for _, n := range pythonNames {
		if name == n {
			return true
		}
	}
	for _, p := range pythonPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// secretWords end the words of a variable's name that holds a credential,
// or says where one is: HF_TOKEN, HF_TOKEN_PATH, HUGGING_FACE_HUB_TOKEN,
// OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, PGPASSWORD, CONDA_APIKEY. A
// harmless knob that names one (HF_HUB_DISABLE_IMPLICIT_TOKEN) is dropped
// too: graders read local files and talk to loopback only, so no
// credential is theirs to use.
var secretWords = []string{"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}

// secretName reports whether a word of name (split at '_') ends in one of
// secretWords.
func secretName(name string) bool {
	for w := range strings.SplitSeq(strings.ToUpper(name), "_") {
		for _, s := range secretWords {
			if strings.HasSuffix(w, s) {
				return true
			}
		}
	}
	return false
}
