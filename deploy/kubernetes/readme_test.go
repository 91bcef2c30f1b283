package kubernetes_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"legato/rl/desktop/osworld/hostdns"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

const readmeHeading = "## Running hosts on Kubernetes"

// readmeSection returns the README's section under heading, to the next
// heading of its level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

// commandLines returns the lines of the section's bash blocks, comments
// cut, as fields.
func commandLines(section string) [][]string {
	var lines [][]string
	in := false
	for line := range strings.SplitSeq(section, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			in = line == "```bash"
		case in:
			line, _, _ = strings.Cut(line, "#")
			if f := strings.Fields(line); len(f) > 0 {
				lines = append(lines, f)
			}
		}
	}
	return lines
}

// flagValue returns the value of flag in a command's fields (NAME VALUE or
// NAME=VALUE), or "".
func flagValue(cmd []string, flag string) string {
	for i, f := range cmd {
		if f == flag && i+1 < len(cmd) {
			return cmd[i+1]
		}
		if v, ok := strings.CutPrefix(f, flag+"="); ok {
			return v
		}
	}
	return ""
}

// TestREADMEAgrees checks the README's section against the files: what it
// names exists, and its commands use the manifests' node label, Secret,
// key, namespace, pod labels and Service, and the entrypoint's log lines
// and directory.
func TestREADMEAgrees(t *testing.T) {
	section := readmeSection(t, readmeHeading)
	flat := strings.Join(strings.Fields(section), " ")
	ds := load[appsv1.DaemonSet](t, "daemonset.yaml")
	svc := load[corev1.Service](t, "service.yaml")
	secret := load[corev1.Secret](t, "secret-template.yaml")
	ns := load[corev1.Namespace](t, "namespace.yaml")
	defaults := scriptDefaults(t)

	for _, p := range regexp.MustCompile(`deploy/kubernetes/[\w./-]*`).FindAllString(section, -1) {
		if p == "deploy/kubernetes/"+legatoBinary {
			continue // the go build makes it
		}
		if _, err := os.Stat(filepath.Join("../..", p)); err != nil {
			t.Errorf("README names %s: %v", p, err)
		}
	}
	for _, m := range regexp.MustCompile("`([\\w-]+\\.yaml|Containerfile)`").FindAllStringSubmatch(section, -1) {
		if _, err := os.Stat(m[1]); err != nil {
			t.Errorf("README names %s: %v", m[1], err)
		}
	}

	cmds := commandLines(section)
	has := func(what string, match func([]string) bool) []string {
		t.Helper()
		i := slices.IndexFunc(cmds, match)
		if i < 0 {
			t.Errorf("README's commands have no %s", what)
			return nil
		}
		return cmds[i]
	}
	for _, c := range cmds {
		if c[0] != "kubectl" {
			continue
		}
		for _, flag := range []string{"-f", "-k"} {
			if p := flagValue(c, flag); p != "" {
				if _, err := os.Stat(filepath.Join("../..", p)); err != nil {
					t.Errorf("README: %s: %v", strings.Join(c, " "), err)
				}
			}
		}
		if n := flagValue(c, "-n"); n != "" && n != ns.Name {
			t.Errorf("README: %s: namespace %s, the manifests' is %s", strings.Join(c, " "), n, ns.Name)
		}
	}
	for k, v := range ds.Spec.Template.Spec.NodeSelector {
		has("kubectl label node NODE "+k+"="+v, func(c []string) bool {
			return len(c) == 5 && c[0] == "kubectl" && c[1] == "label" && c[2] == "node" && c[4] == k+"="+v
		})
	}
	if c := has("kubectl create secret generic", func(c []string) bool {
		return c[0] == "kubectl" && slices.Contains(c, "secret") && slices.Contains(c, "generic")
	}); c != nil {
		name := c[slices.Index(c, "generic")+1]
		key, _, _ := strings.Cut(flagValue(c, "--from-file"), "=")
		item := ds.Spec.Template.Spec.Volumes[slices.IndexFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil })].Secret
		if name != item.SecretName || name != secret.Name || key != item.Items[0].Key || flagValue(c, "-n") != ns.Name {
			t.Errorf("README: %s: want secret %s in %s with key %s", strings.Join(c, " "), item.SecretName, ns.Name, item.Items[0].Key)
		}
	}
	if c := has("kubectl logs -l", func(c []string) bool { return c[0] == "kubectl" && slices.Contains(c, "logs") }); c != nil {
		sel, err := labels.Parse(flagValue(c, "-l"))
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("README: %s: -l does not select the DaemonSet's pods %v (%v)", strings.Join(c, " "), ds.Spec.Template.Labels, err)
		}
	}
	// COPY in the Containerfile takes its files from deploy/kubernetes.
	has("podman build -f deploy/kubernetes/Containerfile ... deploy/kubernetes", func(c []string) bool {
		return c[0] == "podman" && c[1] == "build" && flagValue(c, "-f") == "deploy/kubernetes/Containerfile" && c[len(c)-1] == "deploy/kubernetes"
	})
	// The image's legato binary, built into the context before the build.
	has("go build -o deploy/kubernetes/"+legatoBinary+" ./cmd/legato", func(c []string) bool {
		i := slices.Index(c, "go")
		return i >= 0 && len(c) > i+1 && c[i+1] == "build" && flagValue(c, "-o") == "deploy/kubernetes/"+legatoBinary && c[len(c)-1] == "./cmd/legato"
	})
	// legato's --hosts-from, as legato parses it: the Service's name, and
	// the user the entrypoint installs the fleet's key for.
	name := svc.Name + "." + svc.Namespace + ".svc.cluster.local"
	has("legato rl collect --hosts-from dns:"+name+",user=root", func(c []string) bool {
		if !slices.Equal(c[:min(3, len(c))], []string{"legato", "rl", "collect"}) {
			return false
		}
		src, err := hostdns.ParseSource(flagValue(c, "--hosts-from"))
		return err == nil && src.Name == name && src.User == "root"
	})

	for _, s := range []string{kvmUsable, kvmNone, "host cap: N desktops", "host key: ssh-ed25519",
		defaults["LEGATO_HOST_DIR"] + "/host-cap", "qemu+ssh://root@", svc.Name} {
		if !strings.Contains(flat, s) {
			t.Errorf("README's section does not say %q", s)
		}
	}
}
