#!/usr/bin/env bash
# Runs every Go fuzz target in the module for FUZZTIME each (default 10s),
# one after another, starting from its seed corpus (testdata/fuzz and the
# f.Add seeds). A crash stops the run with the failing input saved under
# the package's testdata/fuzz directory, as go test -fuzz does.
set -euo pipefail
fuzztime=${FUZZTIME:-10s}
pkgs=$(go list ./...)
total=0
for pkg in $pkgs; do
  targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
  for target in $targets; do
    echo "fuzz: $pkg $target for $fuzztime"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
    total=$((total + 1))
  done
done
echo "fuzz: $total targets, $fuzztime each"
