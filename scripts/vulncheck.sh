#!/usr/bin/env bash
# govulncheck over every package of gozt, against the Go vulnerability
# database (TESTPLAN 5.5), without a network beyond the Go module proxy:
# vuln.go.dev cannot be reached from CI, so the database is built here from
# the OSV files of the golang.org/x/vulndb module (the database's own
# source, served by the module proxy) with that module's indexdb command,
# once per pinned version, into bin/. Bump VULNDB_VERSION to take newer
# reports: `go list -m golang.org/x/vulndb@latest`, run outside this module,
# names the newest pseudo-version the proxy serves (it answers no branch
# names such as @master).
#
# It first scans scripts/testdata/vulncanary, a program built on an x/net
# with a known hole, and fails unless that is reported: a database or scan
# that finds nothing must not pass for a clean bill.
#
# Exit status: 0 when no vulnerable code is reachable from gozt's packages;
# otherwise govulncheck's report and a non-zero status.
set -euo pipefail
cd "$(dirname "$0")/.."
# As make does: the Go go.mod's toolchain line names, whose standard library
# is what gozt's binary is built with, unless the caller chose another.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

VULN_VERSION=v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
CANARY_ID=GO-2024-2687

bin=$(pwd)/bin
tool=$bin/govulncheck-$VULN_VERSION
db=$bin/vulndb-$VULNDB_VERSION
mkdir -p "$bin"

if [ ! -x "$tool" ]; then
  tmp=$(mktemp -d)
  GOBIN=$tmp go install "golang.org/x/vuln/cmd/govulncheck@$VULN_VERSION"
  mv "$tmp/govulncheck" "$tool"
  rmdir "$tmp"
fi

if [ ! -f "$db/index/db.json" ]; then
  # Downloaded outside this module, so that go.mod is not consulted; the
  # path has no upper-case letters, so the cache holds it as spelled.
  (cd / && go mod download "golang.org/x/vulndb@$VULNDB_VERSION")
  src=$(go env GOMODCACHE)/golang.org/x/vulndb@$VULNDB_VERSION
  if [ ! -d "$src/data/osv" ]; then
    echo "vulncheck: golang.org/x/vulndb@$VULNDB_VERSION has no data/osv" >&2
    exit 1
  fi
  rm -rf "$db.tmp"
  go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$db.tmp"
  mv "$db.tmp" "$db"
fi

set +e
canary=$(cd scripts/testdata/vulncanary && "$tool" -db "file://$db" . 2>&1)
rc=$?
set -e
if [ $rc -ne 3 ] || ! grep -q "$CANARY_ID" <<<"$canary"; then
  echo "vulncheck: the canary's $CANARY_ID was not reported (exit $rc); the database or the scan is broken:" >&2
  echo "$canary" >&2
  exit 1
fi

echo "vulncheck: database golang.org/x/vulndb@$VULNDB_VERSION, govulncheck $VULN_VERSION, $(go env GOVERSION)"
"$tool" -db "file://$db" ./...
