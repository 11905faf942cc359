// Package gozt is a drop-in, wire-compatible Go implementation of Istio's
// ztunnel. The code lives in the subpackages (see DESIGN.md for the layout);
// this root package holds only repository-wide tests such as the import rules.
package gozt
