// Package deploy holds gozt's Kubernetes deployment files, which are data,
// not Go: ztunnel-values.yaml, the Helm values that run gozt in Istio's own
// ztunnel chart, and daemonset.yaml, a plain manifest for clusters without
// Helm (see README.md here). The package's tests render Istio's chart with
// Helm's Go engine and start the gozt binary with exactly the environment,
// arguments, mounts and capabilities each DaemonSet gives it. The image
// itself is built by deploy/image.
package deploy
