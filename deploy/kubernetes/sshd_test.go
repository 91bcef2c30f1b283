package kubernetes_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
)

// TestSSHDConfig reads sshd_config as Debian 12's sshd (the image's)
// applies it to legato's login: root, by key only, allowed what vm's
// ssh.go opens and nothing beyond it: libvirtd's unix socket, the guests'
// ports on 127.0.0.1, and remote forwards on 127.0.0.1:0 that find free
// ports for QEMU. The host key is the one the entrypoint gives with -h,
// not one of the image's.
func TestSSHDConfig(t *testing.T) {
	const sshd = "/usr/sbin/sshd"
	if _, err := os.Stat(sshd); err != nil {
		t.Skip("no sshd (openssh-server):", err)
	}
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Skip("no ssh-keygen:", err)
	}
	key := filepath.Join(t.TempDir(), "ssh_host_ed25519_key")
	if out, err := exec.CommandContext(t.Context(), keygen, "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(t.Context(), sshd, "-T", "-f", "sshd_config", "-h", key,
		"-C", "user=root,host=legato,addr=127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("sshd -T: %v\n%s", err, out)
	}
	port := hostContainer(t, load[appsv1.DaemonSet](t, "daemonset.yaml")).Ports[0].ContainerPort
	want := map[string]string{
		"port":                         strconv.Itoa(int(port)),
		"hostkey":                      key,
		"permitrootlogin":              "without-password",
		"pubkeyauthentication":         "yes",
		"passwordauthentication":       "no",
		"kbdinteractiveauthentication": "no",
		"usepam":                       "no",
		"allowstreamlocalforwarding":   "local",
		"allowtcpforwarding":           "yes",
		"gatewayports":                 "no",
		"permitopen":                   "127.0.0.1:*",
		"permitlisten":                 "127.0.0.1:*",
	}
	got := map[string]string{}
	for line := range strings.SplitSeq(string(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		if _, ok := want[k]; ok {
			if v == "prohibit-password" { // the same, as other versions print it
				v = "without-password"
			}
			got[k] = v
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sshd's settings for legato's login (-want +got):\n%s", diff)
	}
}
