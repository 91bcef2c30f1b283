package kubernetes_test

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
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
	// sshd -T refuses to start without its privilege separation
	// directory, which only a started sshd service makes (not so on a
	// machine where openssh-server was installed without starting it).
	if _, err := os.Stat("/run/sshd"); err != nil {
		if os.Geteuid() != 0 {
			t.Skip("no /run/sshd (sshd's privilege separation directory), and not root to make it:", err)
		}
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
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
		"permitopen":                   "any",
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

// TestSSHDConfigForwards runs Debian 12's sshd with sshd_config on a
// loopback port and opens through it, as root with a key, what legato's
// vm package opens on a host: libvirtd's unix socket (a socket of the
// test's here), a guest's port on 127.0.0.1, and a remote forward on
// 127.0.0.1:0. sshd -T alone does not show what sshd refuses: a
// PermitOpen, whatever it lists, refuses every unix socket.
func TestSSHDConfigForwards(t *testing.T) {
	const sshd = "/usr/sbin/sshd"
	if _, err := os.Stat(sshd); err != nil {
		t.Skip("no sshd (openssh-server):", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd with this config logs in root only: run as root")
	}
	dir := t.TempDir()
	hostKey := writeKey(t, filepath.Join(dir, "host_key"))
	clientKey := writeKey(t, filepath.Join(dir, "client_key"))
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientKey.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(sshd, "-D", "-e", "-f", "sshd_config", "-h", filepath.Join(dir, "host_key"),
		"-o", "Port="+port, "-o", "ListenAddress=127.0.0.1", "-o", "PidFile="+filepath.Join(dir, "sshd.pid"),
		// The test's temporary directory is under the world-writable /tmp.
		"-o", "AuthorizedKeysFile="+filepath.Join(dir, "authorized_keys"), "-o", "StrictModes=no")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for sc := bufio.NewScanner(stderr); sc.Scan(); {
			log.WriteString(sc.Text() + "\n")
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-logged
		cmd.Wait()
		if t.Failed() {
			t.Logf("sshd's log:\n%s", log.String())
		}
	})

	var client *ssh.Client
	conf := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(clientKey)},
		HostKeyCallback: ssh.FixedHostKey(hostKey.PublicKey()), Timeout: 10 * time.Second}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if client, err = ssh.Dial("tcp", addr, conf); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log in to sshd at %s: %v", addr, err)
		}
	}
	defer client.Close()

	// A unix socket and a TCP port that each greet whoever connects.
	greet := func(l net.Listener, hello string) {
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				io.WriteString(c, hello)
				c.Close()
			}
		}()
	}
	sock, err := net.Listen("unix", filepath.Join(dir, "libvirt-sock"))
	if err != nil {
		t.Fatal(err)
	}
	greet(sock, "libvirtd")
	guest, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	greet(guest, "guest")
	for _, c := range []struct{ network, addr, hello string }{
		{"unix", sock.Addr().String(), "libvirtd"},
		{"tcp", guest.Addr().String(), "guest"},
	} {
		conn, err := client.Dial(c.network, c.addr)
		if err != nil {
			t.Errorf("open %s %s through sshd: %v", c.network, c.addr, err)
			continue
		}
		got, err := io.ReadAll(conn)
		conn.Close()
		if string(got) != c.hello {
			t.Errorf("%s %s through sshd: read %q, %v; want %q", c.network, c.addr, got, err, c.hello)
		}
	}
	remote, err := client.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Errorf("remote forward on 127.0.0.1:0: %v", err)
	} else {
		remote.Close()
	}
}

// writeKey writes a new ed25519 key in OpenSSH's format to path and
// returns its signer.
func writeKey(t *testing.T, path string) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}
