// Package configdump is the workloads/services/policies/stagedServices part
// of the admin /config_dump in the shape istioctl's ztunnel-config reads
// (SPEC §8.2): FromSnapshot renders a state.Snapshot into it, and Parse with
// Dump.State or Dump.Apply reads it back into state values. Only cmd/gozt
// imports it: admin serves it and explain reloads it.
package configdump
