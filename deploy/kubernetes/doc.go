// Package kubernetes holds no code: its directory holds the Kubernetes
// packaging of a legato libvirt host (the image's Containerfile, its
// entrypoint and sshd_config, and the manifests), and its tests check them
// without a cluster. Every manifest decodes strictly into its k8s.io/api
// type; the manifests, the entrypoint, legato's VM defaults and the
// README's "Running hosts on Kubernetes" agree; and the entrypoint's KVM
// verdict and host cap are run on fake /dev, /proc and /sys. The
// Kubernetes API modules are imported by these tests only.
package kubernetes
