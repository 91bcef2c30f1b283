package kubernetes_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"legato/rl/desktop/osworld/vm"
)

// typeMeta is what a manifest says it is.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// kustomization is the part of kustomize's Kustomization that
// kustomization.yaml uses: kustomize's own types are a module of their
// own, more than three fields are worth.
type kustomization struct {
	typeMeta  `json:",inline"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// manifests are the YAML files here, each with the type it decodes into
// and the apiVersion and kind it must say.
var manifests = []struct {
	file, apiVersion, kind string
	decode                 func([]byte) error
}{
	{"namespace.yaml", "v1", "Namespace", strictly[corev1.Namespace]},
	{"daemonset.yaml", "apps/v1", "DaemonSet", strictly[appsv1.DaemonSet]},
	{"service.yaml", "v1", "Service", strictly[corev1.Service]},
	{"secret-template.yaml", "v1", "Secret", strictly[corev1.Secret]},
	{"pdb.yaml", "policy/v1", "PodDisruptionBudget", strictly[policyv1.PodDisruptionBudget]},
	{"kustomization.yaml", "kustomize.config.k8s.io/v1beta1", "Kustomization", strictly[kustomization]},
}

func strictly[T any](data []byte) error { return decodeStrict(data, new(T)) }

// decodeStrict decodes the one YAML document of data into obj. A field the
// type lacks, a field given twice, a field spelt in another case (which
// encoding/json would take, and the API server's strict decoding would
// not) and a second document (which a decoder of one object skips) are
// errors.
func decodeStrict(data []byte, obj any) error {
	if n := documents(data); n != 1 {
		return fmt.Errorf("%d YAML documents: want one object per file", n)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		return err
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	var written, typed any
	if err := json.Unmarshal(j, &written); err != nil {
		return err
	}
	back, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(back, &typed); err != nil {
		return err
	}
	return within(written, typed, "")
}

// within reports, as an error, where written (the file as JSON) differs
// from typed (the decoded object marshalled again): every field written
// must come back under its own name with its value, but for a zero value
// that the type omits.
func within(written, typed any, path string) error {
	switch w := written.(type) {
	case map[string]any:
		t, ok := typed.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: an object in the file, %T in the type", path, typed)
		}
		for k, v := range w {
			tv, ok := t[k]
			if !ok {
				if isZero(v) {
					continue
				}
				return fmt.Errorf("%s.%s: not a field of the type (spelt in another case?)", path, k)
			}
			if err := within(v, tv, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		t, ok := typed.([]any)
		if !ok || len(t) != len(w) {
			return fmt.Errorf("%s: %d items in the file, %v in the type", path, len(w), typed)
		}
		for i := range w {
			if err := within(w[i], t[i], path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	default:
		if written != typed {
			return fmt.Errorf("%s: %v in the file, %v in the type", path, written, typed)
		}
	}
	return nil
}

func isZero(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case float64:
		return v == 0
	case string:
		return v == ""
	case map[string]any:
		return len(v) == 0
	case []any:
		return len(v) == 0
	}
	return false
}

// documents counts the YAML documents of data that hold anything but
// comments.
func documents(data []byte) int {
	n, content := 0, false
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.TrimRight(line, " \t\r") == "---" {
			if content {
				n++
			}
			content = false
			continue
		}
		if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") {
			content = true
		}
	}
	if content {
		n++
	}
	return n
}

func TestManifestsDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var known []string
	for _, m := range manifests {
		known = append(known, m.file)
	}
	slices.Sort(known)
	if diff := cmp.Diff(known, files); diff != "" {
		t.Errorf("YAML files here, and the ones this test decodes (-tested +present):\n%s", diff)
	}
	for _, m := range manifests {
		t.Run(m.file, func(t *testing.T) {
			data, err := os.ReadFile(m.file)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.decode(data); err != nil {
				t.Fatalf("decode %s strictly: %v", m.file, err)
			}
			var tm typeMeta
			if err := yaml.Unmarshal(data, &tm); err != nil {
				t.Fatal(err)
			}
			if want := (typeMeta{m.apiVersion, m.kind}); tm != want {
				t.Errorf("%s says %+v, want %+v", m.file, tm, want)
			}
		})
	}
}

// TestDecodeStrictRejects shows that the decoding above fails the mistakes
// a lenient decoder lets through.
func TestDecodeStrictRejects(t *testing.T) {
	const service = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  clusterIP: None\n"
	if err := decodeStrict([]byte(service), new(corev1.Service)); err != nil {
		t.Fatalf("a good Service: %v", err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown field", service + "  headless: true\n", "unknown field"},
		{"field given twice", service + "  clusterIP: None\n", "already"},
		{"field in another case", strings.Replace(service, "clusterIP", "clusterip", 1), "another case"},
		{"second document", service + "---\n" + service, "2 YAML documents"},
		{"value of the wrong type", service + "  ports: 22\n", "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decodeStrict([]byte(tc.yaml), new(corev1.Service))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// load decodes file strictly into a T.
func load[T any](t *testing.T, file string) *T {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	obj := new(T)
	if err := decodeStrict(data, obj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return obj
}

// scriptDefaults returns the defaults host-entrypoint.sh gives its
// LEGATO_* variables (NAME=${VAR:-default}).
func scriptDefaults(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("host-entrypoint.sh")
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\w+=\$\{(LEGATO_\w+):-([^}]+)\}$`).FindAllStringSubmatch(string(data), -1) {
		defaults[m[1]] = m[2]
	}
	if len(defaults) == 0 {
		t.Fatal("host-entrypoint.sh: no NAME=${LEGATO_...:-default} lines")
	}
	return defaults
}

// hostContainer returns the DaemonSet's one container.
func hostContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	if n := len(ds.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the DaemonSet has %d containers, want the host's alone", n)
	}
	return ds.Spec.Template.Spec.Containers[0]
}

// selects reports, as an error, whether sel does not select the pod
// template's labels.
func selects(what string, sel labels.Selector, pod map[string]string) error {
	if sel.Empty() || !sel.Matches(labels.Set(pod)) {
		return fmt.Errorf("%s selects %q, not the DaemonSet's pods %v", what, sel, pod)
	}
	return nil
}

func TestManifestsAgree(t *testing.T) {
	ns := load[corev1.Namespace](t, "namespace.yaml")
	ds := load[appsv1.DaemonSet](t, "daemonset.yaml")
	svc := load[corev1.Service](t, "service.yaml")
	secret := load[corev1.Secret](t, "secret-template.yaml")
	pdb := load[policyv1.PodDisruptionBudget](t, "pdb.yaml")
	defaults := scriptDefaults(t)
	pod := ds.Spec.Template
	c := hostContainer(t, ds)

	for _, m := range []metav1.ObjectMeta{ds.ObjectMeta, svc.ObjectMeta, secret.ObjectMeta, pdb.ObjectMeta} {
		if m.Namespace != ns.Name {
			t.Errorf("%s is in namespace %q, want %q (namespace.yaml)", m.Name, m.Namespace, ns.Name)
		}
	}

	// The Service: headless, ready pods only, selecting the DaemonSet's
	// pods, port 22 named ssh on both.
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.PublishNotReadyAddresses {
		t.Errorf("the Service has clusterIP %q and publishNotReadyAddresses %v, want None and false (headless, ready pods only)",
			svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	for _, err := range []error{
		selects("the Service", labels.SelectorFromSet(svc.Spec.Selector), pod.Labels),
		selects("the DaemonSet's selector", mustSelector(t, ds.Spec.Selector), pod.Labels),
		selects("the PodDisruptionBudget", mustSelector(t, pdb.Spec.Selector), pod.Labels),
	} {
		if err != nil {
			t.Error(err)
		}
	}
	wantPort := corev1.ContainerPort{Name: "ssh", ContainerPort: 22, Protocol: corev1.ProtocolTCP}
	if diff := cmp.Diff([]corev1.ContainerPort{wantPort}, c.Ports); diff != "" {
		t.Errorf("container ports (-want +got):\n%s", diff)
	}
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("the Service has %d ports, want ssh alone", len(svc.Spec.Ports))
	}
	sp := svc.Spec.Ports[0]
	if sp.Name != "ssh" || sp.Port != 22 || (sp.TargetPort.String() != "ssh" && sp.TargetPort.IntValue() != 22) {
		t.Errorf("the Service's port is %s %d -> %s, want ssh 22 -> the container's ssh port", sp.Name, sp.Port, sp.TargetPort.String())
	}
	if p := c.ReadinessProbe; p == nil || p.TCPSocket == nil || (p.TCPSocket.Port.String() != "ssh" && p.TCPSocket.Port.IntValue() != 22) {
		t.Errorf("readiness probe %+v, want TCP on the ssh port (sshd starts last)", p)
	}

	// The pod: on labelled nodes only, its own network, privileged (the
	// node's /dev/kvm reaches it that way, and only when there is one).
	spec := pod.Spec
	if diff := cmp.Diff(map[string]string{"legato.dev/libvirt-host": "true"}, spec.NodeSelector); diff != "" {
		t.Errorf("nodeSelector (-want +got):\n%s", diff)
	}
	if spec.HostNetwork {
		t.Error("hostNetwork is on: the guests' ports must stay on the pod's own 127.0.0.1")
	}
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the container is not privileged: without a device plugin it would get no /dev/kvm")
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 60 {
		t.Errorf("terminationGracePeriodSeconds %v, want at least 60 to destroy the VMs", g)
	}

	// Volumes: the node's dir where the entrypoint keeps the pool, host
	// key and cap, the Secret's key where the entrypoint reads it, and a
	// tmpfs for the fork templates (a container's /dev/shm is 64 MiB). No
	// hostPath under /dev: one for /dev/kvm would fail (CharDevice) or
	// alter (untyped) a node without KVM.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	var hostDir, keys, forks bool
	for _, v := range spec.Volumes {
		m, mounted := mounts[v.Name]
		switch {
		case v.HostPath != nil && strings.HasPrefix(v.HostPath.Path+"/", "/dev/"):
			t.Errorf("volume %s: hostPath %s: /dev/kvm reaches a privileged pod without one", v.Name, v.HostPath.Path)
		case v.HostPath != nil:
			hostDir = true
			want := defaults["LEGATO_HOST_DIR"]
			if v.HostPath.Path != want || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate || !mounted || m.MountPath != want {
				t.Errorf("volume %s: hostPath %+v mounted at %q, want %s (DirectoryOrCreate) at the same path, the entrypoint's LEGATO_HOST_DIR",
					v.Name, v.HostPath, m.MountPath, want)
			}
		case v.Secret != nil:
			keys = true
			s := v.Secret
			if s.SecretName != secret.Name || len(s.Items) != 1 || !mounted {
				t.Fatalf("volume %s: secret %+v (mounted %v), want the one item of %s, mounted", v.Name, s, mounted, secret.Name)
			}
			if _, ok := secret.StringData[s.Items[0].Key]; !ok {
				t.Errorf("volume %s: key %q is not in secret-template.yaml's %v", v.Name, s.Items[0].Key, secret.StringData)
			}
			if got, want := filepath.Join(m.MountPath, s.Items[0].Path), defaults["LEGATO_FLEET_KEYS"]; got != want {
				t.Errorf("the fleet's key is mounted at %s, the entrypoint reads %s", got, want)
			}
		case v.EmptyDir != nil:
			forks = true
			if v.EmptyDir.Medium != corev1.StorageMediumMemory || v.EmptyDir.SizeLimit != nil || !mounted ||
				!strings.HasPrefix(vm.DefaultForkDir, m.MountPath+"/") {
				t.Errorf("volume %s: emptyDir %+v mounted at %q, want a memory-backed one with no size limit of its own, mounted at a parent of the fork dir %s",
					v.Name, v.EmptyDir, m.MountPath, vm.DefaultForkDir)
			}
		default:
			t.Errorf("volume %s: neither the node's dir, the fleet's key nor the fork templates' tmpfs", v.Name)
		}
	}
	if !hostDir || !keys || !forks {
		t.Errorf("volumes: the node's dir %v, the fleet's key %v, the fork templates' tmpfs %v: want all three", hostDir, keys, forks)
	}

	// The desktop size and pool: legato's defaults, in the DaemonSet and
	// the entrypoint; and every LEGATO_ variable set is one the entrypoint
	// reads.
	want := map[string]string{
		"LEGATO_DESKTOP_CPUS":    strconv.Itoa(vm.DefaultVCPUs),
		"LEGATO_DESKTOP_MEM_MIB": strconv.Itoa(vm.DefaultMemoryMiB),
		"LEGATO_STORAGE_POOL":    vm.DefaultStoragePool,
	}
	for name, v := range want {
		if defaults[name] != v {
			t.Errorf("host-entrypoint.sh: %s defaults to %q, legato's default is %q", name, defaults[name], v)
		}
	}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "LEGATO_") {
			continue
		}
		if _, ok := defaults[e.Name]; !ok {
			t.Errorf("daemonset.yaml sets %s, which host-entrypoint.sh does not read", e.Name)
		}
		if w, ok := want[e.Name]; ok && e.Value != w {
			t.Errorf("daemonset.yaml sets %s=%q, legato's default is %q", e.Name, e.Value, w)
		}
	}
}

func mustSelector(t *testing.T, s *metav1.LabelSelector) labels.Selector {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// legatoBinary is the legato binary the image carries, built into the
// build context (deploy/kubernetes) before podman build: the README's go
// build makes it, and .gitignore keeps it out of the tree.
const legatoBinary = "legato"

// TestKustomizationAndImage checks that kustomization.yaml applies every
// manifest but the Secret's template, renames the DaemonSet's image, and
// that the Containerfile copies what the image runs.
func TestKustomizationAndImage(t *testing.T) {
	k := load[kustomization](t, "kustomization.yaml")
	var want []string
	for _, m := range manifests {
		if m.kind != "Kustomization" && m.kind != "Secret" {
			want = append(want, m.file)
		}
	}
	if diff := cmp.Diff(want, k.Resources); diff != "" {
		t.Errorf("kustomization resources (-want +got):\n%s", diff)
	}
	image := hostContainer(t, load[appsv1.DaemonSet](t, "daemonset.yaml")).Image
	if len(k.Images) != 1 || k.Images[0].Name != image {
		t.Errorf("kustomization images %+v, want one renaming the DaemonSet's %q", k.Images, image)
	}

	data, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	copied := map[string]string{}
	var entrypoint []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "COPY":
			if f[1] == legatoBinary {
				copied[f[2]] = f[1] // built into the context first (README)
				continue
			}
			if _, err := os.Stat(f[1]); err != nil {
				t.Errorf("Containerfile: %s: %v (the build context is deploy/kubernetes)", line, err)
			}
			copied[f[2]] = f[1]
		case len(f) > 1 && f[0] == "ENTRYPOINT":
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "ENTRYPOINT")), &entrypoint); err != nil {
				t.Fatalf("Containerfile: %s: %v", line, err)
			}
		}
	}
	if len(entrypoint) == 0 || copied[entrypoint[len(entrypoint)-1]] != "host-entrypoint.sh" {
		t.Errorf("Containerfile: ENTRYPOINT %v does not end in the copied host-entrypoint.sh (copies: %v)", entrypoint, copied)
	}
	if copied["/usr/local/bin/legato"] != legatoBinary {
		t.Errorf("Containerfile does not install the %s binary as /usr/local/bin/legato, which the fleet runs on the host (copies: %v)", legatoBinary, copied)
	}
	if copied["/etc/ssh/sshd_config"] != "sshd_config" {
		t.Errorf("Containerfile does not install sshd_config as /etc/ssh/sshd_config (copies: %v)", copied)
	}
	info, err := os.Stat("host-entrypoint.sh")
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&0o111 == 0 {
		t.Errorf("host-entrypoint.sh has mode %v: not executable, and COPY keeps the mode", info.Mode())
	}
}
