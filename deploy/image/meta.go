package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

const (
	// defaultRepo is where the image is named unless -tag says otherwise.
	// It has a registry host so that Istio's chart, which takes an image
	// value containing "/" verbatim, uses it as it is.
	defaultRepo = "ghcr.io/gozt/gozt"
	sourceURL   = "https://github.com/gozt/gozt"
)

// meta is everything about the image that does not come from the binary's
// bytes.
type meta struct {
	bin      []byte    // the binary
	arch     string    // GOARCH of the binary, from its ELF header
	version  string    // gozt's version
	revision string    // source revision, or ""
	created  time.Time // image creation time and layer file times
	ref      string    // full image reference, e.g. ghcr.io/gozt/gozt:0.1.0-dev
	tag      string    // the tag of ref
}

// resolveMeta reads the binary and fills in what the flags left empty.
func resolveMeta(binPath, version, revision, tag string) (meta, error) {
	data, err := os.ReadFile(binPath)
	if err != nil {
		return meta{}, err
	}
	arch, err := staticArch(data)
	if err != nil {
		return meta{}, fmt.Errorf("%s: %w", binPath, err)
	}
	if version == "" {
		if version, err = askVersion(binPath, arch); err != nil {
			return meta{}, err
		}
	}
	gitRev, gitTime := gitHead()
	if revision == "" {
		revision = gitRev
	}
	created, err := creationTime(gitTime)
	if err != nil {
		return meta{}, err
	}
	if tag == "" {
		tag = defaultRepo + ":" + version
	}
	ref, tagStr, err := fullRef(tag)
	if err != nil {
		return meta{}, err
	}
	return meta{bin: data, arch: arch, version: version, revision: revision,
		created: created, ref: ref, tag: tagStr}, nil
}

// elfArch maps the machine of a 64-bit linux ELF file to its GOARCH.
var elfArch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_PPC64:   "ppc64le", // checked to be little-endian below
	elf.EM_S390:    "s390x",
	elf.EM_RISCV:   "riscv64",
}

// staticArch returns the GOARCH of a linux ELF executable, and an error if
// it is not statically linked: the image has no dynamic loader or libc.
func staticArch(data []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("not a linux executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return "", errors.New("dynamically linked; build it with CGO_ENABLED=0")
		}
	}
	arch, ok := elfArch[f.Machine]
	if !ok || f.Class != elf.ELFCLASS64 || (arch == "ppc64le" && f.Data != elf.ELFDATA2LSB) {
		return "", fmt.Errorf("unsupported architecture %v (%v)", f.Machine, f.Class)
	}
	return arch, nil
}

// askVersion runs `BIN version`, which prints "gozt VERSION", when the
// binary can run on this machine.
func askVersion(binPath, arch string) (string, error) {
	if runtime.GOOS != "linux" || arch != runtime.GOARCH {
		return "", fmt.Errorf("%s is linux/%s and cannot run here to tell its version; pass -version", binPath, arch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "version")
	cmd.Env = []string{}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s version: %w", binPath, err)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "gozt ")
	if !ok || v == "" || strings.ContainsAny(v, " \n") {
		return "", fmt.Errorf("%s version printed %q, want \"gozt VERSION\"", binPath, out)
	}
	return v, nil
}

// gitHead returns HEAD's commit and commit time, or zero values when git
// or the repository is not there.
func gitHead() (string, time.Time) {
	out, err := exec.Command("git", "log", "-1", "--format=%H %ct").Output()
	if err != nil {
		return "", time.Time{}
	}
	rev, ct, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	sec, err := strconv.ParseInt(ct, 10, 64)
	if !ok || err != nil {
		return "", time.Time{}
	}
	return rev, time.Unix(sec, 0).UTC()
}

// creationTime is SOURCE_DATE_EPOCH (the reproducible-builds convention)
// when set, else the commit time, else the Unix epoch.
func creationTime(commit time.Time) (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	if !commit.IsZero() {
		return commit, nil
	}
	return time.Unix(0, 0).UTC(), nil
}

// fullRef validates a fully specified image reference (registry, repository
// and tag, as the chart and containerd want it) and spells its registry as
// docker and containerd do.
func fullRef(s string) (ref, tag string, err error) {
	t, err := name.NewTag(s, name.StrictValidation)
	if err != nil {
		return "", "", fmt.Errorf("-tag %q: %w", s, err)
	}
	registry := t.RegistryStr()
	if registry == name.DefaultRegistry {
		registry = "docker.io" // go-containerregistry says index.docker.io; docker and containerd say docker.io
	}
	return registry + "/" + t.RepositoryStr() + ":" + t.TagStr(), t.TagStr(), nil
}
