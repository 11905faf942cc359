package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestImageArchive builds gozt as `make image` does, packages it, and reads
// the archive back three ways: as a raw tar (what docker load and
// containerd's importer walk), with go-containerregistry's OCI layout
// reader and with its docker tarball reader. Then it runs the binary it
// extracted from the layer, through the entrypoint and through the ztunnel
// name.
func TestImageArchive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image holds a linux binary; run this test on linux")
	}
	dir := t.TempDir()
	bin := buildGozt(t, dir)
	archive := filepath.Join(dir, "out", "gozt-image.tar")
	// The tool runs as its own process: built with -race, as this test is,
	// gzip of a 30 MB layer takes most of a minute.
	tool := filepath.Join(dir, "image")
	if out, err := exec.Command("go", "build", "-o", tool, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build ./deploy/image: %v\n%s", err, out)
	}
	if out, err := exec.Command(tool, "-bin", bin, "-o", archive).CombinedOutput(); err != nil {
		t.Fatalf("image -bin %s -o %s: %v\n%s", bin, archive, err, out)
	}
	version := strings.TrimPrefix(runOK(t, bin, "version"), "gozt ")
	ref := defaultRepo + ":" + version

	docker := checkRawArchive(t, archive, ref)
	img := readLayout(t, archive)
	checkDockerTarball(t, archive, img, docker)
	checkConfig(t, img, version)

	root := filepath.Join(dir, "rootfs")
	extractLayer(t, img, root)
	if got, want := sha256File(t, filepath.Join(root, binPath)), sha256File(t, bin); got != want {
		t.Errorf("the binary in the layer has sha256 %s, the one built %s", got, want)
	}
	checkStatic(t, filepath.Join(root, binPath))

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	entrypoint := filepath.Join(root, cf.Config.Entrypoint[0])
	for _, exe := range []string{entrypoint, filepath.Join(root, aliasPath)} {
		if out := runOK(t, exe, "version"); out != "gozt "+version {
			t.Errorf("%s version = %q, want %q", exe, out, "gozt "+version)
		}
	}
	checkProxyArgs(t, entrypoint, cf.Config.Cmd)
}

// buildGozt builds a static gozt exactly as the Makefile's image target does
// (so the two share the build cache).
func buildGozt(t *testing.T, dir string) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gozt-linux-"+runtime.GOARCH)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/gozt")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gozt: %v\n%s", err, out)
	}
	t.Logf("built %s in %v", bin, time.Since(start).Round(time.Millisecond))
	return bin
}

// checkRawArchive walks the archive as a plain tar and checks what docker
// load and containerd's importer rely on: an OCI layout whose blobs match
// their names, an index.json naming the image, and a docker manifest.json
// pointing at the same blobs. It returns the manifest.json entry.
func checkRawArchive(t *testing.T, archive, ref string) tarball.Descriptor {
	t.Helper()
	files := readTar(t, archive)
	var layoutFile struct {
		Version string `json:"imageLayoutVersion"`
	}
	mustJSON(t, files, "oci-layout", &layoutFile)
	if layoutFile.Version != "1.0.0" {
		t.Errorf("oci-layout imageLayoutVersion = %q, want 1.0.0", layoutFile.Version)
	}
	for name, data := range files {
		if hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if got := sha256Hex(data); got != hexDigest {
				t.Errorf("blob %s has sha256 %s", name, got)
			}
		}
	}

	var index v1.IndexManifest
	mustJSON(t, files, "index.json", &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(index.Manifests))
	}
	desc := index.Manifests[0]
	if got := desc.Annotations[annotationContainerdName]; got != ref {
		t.Errorf("index.json names the image %q (%s), want %q", got, annotationContainerdName, ref)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != runtime.GOARCH {
		t.Errorf("index.json platform = %+v, want linux/%s", desc.Platform, runtime.GOARCH)
	}
	var manifest v1.Manifest
	mustJSON(t, files, blobPath(desc.Digest), &manifest)

	var docker tarball.Manifest
	mustJSON(t, files, "manifest.json", &docker)
	if len(docker) != 1 {
		t.Fatalf("manifest.json has %d images, want 1", len(docker))
	}
	want := tarball.Descriptor{Config: blobPath(manifest.Config.Digest), RepoTags: []string{ref}}
	for _, l := range manifest.Layers {
		want.Layers = append(want.Layers, blobPath(l.Digest))
	}
	if diff := cmp.Diff(want, docker[0]); diff != "" {
		t.Errorf("manifest.json does not point at the OCI manifest's blobs (-want +got):\n%s", diff)
	}
	for _, p := range append([]string{docker[0].Config}, docker[0].Layers...) {
		if _, ok := files[p]; !ok {
			t.Errorf("manifest.json names %s, which the archive lacks", p)
		}
	}
	return docker[0]
}

// readTar returns the archive's regular files by name, and fails on any
// entry that is neither a file nor a directory or that escapes the root.
func readTar(t *testing.T, archive string) map[string][]byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("read %s: %v", archive, err)
		}
		if !fs.ValidPath(strings.TrimSuffix(h.Name, "/")) {
			t.Errorf("archive entry %q is not a clean relative path", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("archive entry %q has type %q; want only files and directories", h.Name, h.Typeflag)
		}
	}
}

func mustJSON(t *testing.T, files map[string][]byte, name string, v any) {
	t.Helper()
	data, ok := files[name]
	if !ok {
		t.Fatalf("the archive has no %s", name)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// readLayout unpacks the archive and reads it as an OCI image layout.
func readLayout(t *testing.T, archive string) v1.Image {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	for name, data := range readTar(t, archive) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("layout.ImageIndexFromPath: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatalf("layout image: %v", err)
	}
	// Fast: layer bytes are checked once, by checkRawArchive (digest)
	// and extractLayer (diff ID), since gunzip is slow under -race.
	if err := validate.Image(img, validate.Fast); err != nil {
		t.Fatalf("validate OCI layout image: %v", err)
	}
	return img
}

// checkDockerTarball reads the archive as docker load would, through
// manifest.json, and checks it is the same image as the OCI layout's.
func checkDockerTarball(t *testing.T, archive string, ociImg v1.Image, docker tarball.Descriptor) {
	t.Helper()
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatalf("tarball.ImageFromPath: %v", err)
	}
	if err := validate.Image(img, validate.Fast); err != nil {
		t.Fatalf("validate docker tarball image: %v", err)
	}
	if diff := cmp.Diff(layerDigests(t, ociImg), layerDigests(t, img)); diff != "" {
		t.Errorf("the docker tarball's layers differ from the OCI layout's (-oci +docker):\n%s", diff)
	}
	gotCfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if blobPath(gotCfg) != docker.Config {
		t.Errorf("docker tarball config = %v, manifest.json says %s", gotCfg, docker.Config)
	}
}

func layerDigests(t *testing.T, img v1.Image) []v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var ds []v1.Hash
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds
}

// checkConfig checks how a runtime would start the container.
func checkConfig(t *testing.T, img v1.Image, version string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config platform = %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	c := cf.Config
	if diff := cmp.Diff([]string{"/usr/local/bin/gozt"}, c.Entrypoint); diff != "" {
		t.Errorf("Entrypoint (-want +got):\n%s", diff)
	}
	// Istio's chart sets args `proxy ztunnel` and no command.
	if diff := cmp.Diff([]string{"proxy", "ztunnel"}, c.Cmd); diff != "" {
		t.Errorf("Cmd (-want +got):\n%s", diff)
	}
	if c.WorkingDir != "/" {
		t.Errorf("WorkingDir = %q, want /", c.WorkingDir)
	}
	// ztunnel's relative default paths must land on the chart's mounts.
	if got := path.Join(c.WorkingDir, "./var/run/secrets/tokens/istio-token"); got != "/var/run/secrets/tokens/istio-token" {
		t.Errorf("the default token path resolves to %s", got)
	}
	if c.User != "" {
		t.Errorf("User = %q; the chart sets uid 0 / gid 1337 itself", c.User)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":   "gozt",
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.source":  "https://github.com/gozt/gozt",
	}
	for k, want := range wantLabels {
		if got := c.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	checkRevision(t, c.Labels["org.opencontainers.image.revision"])
}

// checkRevision checks the revision label names a commit of this
// repository (HEAD when the image was built; it may have moved since).
func checkRevision(t *testing.T, rev string) {
	t.Helper()
	if _, err := exec.Command("git", "rev-parse", "HEAD").Output(); err != nil {
		if rev != "" {
			t.Errorf("revision label %q without git", rev)
		}
		return
	}
	if len(rev) != 40 {
		t.Fatalf("revision label = %q, want HEAD's commit", rev)
	}
	if out, err := exec.Command("git", "cat-file", "-t", rev).Output(); err != nil || strings.TrimSpace(string(out)) != "commit" {
		t.Errorf("revision label %s is not a commit here: %q, %v", rev, out, err)
	}
}

// extractLayer writes the single layer's entries under root, checking each
// is what the package doc lists.
func extractLayer(t *testing.T, img v1.Image, root string) {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 {
		t.Fatalf("image has %d layers, want 1", len(ls))
	}
	rc, err := ls[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	diffID := sha256.New()
	type entry struct {
		Type     byte
		Mode     fs.FileMode
		Linkname string
		UID, GID int
	}
	got := map[string]entry{}
	tr := tar.NewReader(io.TeeReader(rc, diffID))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = entry{h.Typeflag, h.FileInfo().Mode(), h.Linkname, h.Uid, h.Gid}
		writeEntry(t, root, h, tr)
	}
	if _, err := io.Copy(diffID, rc); err != nil { // the tar's end-of-archive blocks
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := "sha256:" + hex.EncodeToString(diffID.Sum(nil)); len(cf.RootFS.DiffIDs) != 1 || cf.RootFS.DiffIDs[0].String() != got {
		t.Errorf("config diff_ids = %v, the layer's uncompressed sha256 is %s", cf.RootFS.DiffIDs, got)
	}
	want := map[string]entry{
		"tmp/":                  {tar.TypeDir, fs.ModeDir | fs.ModeSticky | 0o777, "", 0, 0},
		"usr/":                  {tar.TypeDir, fs.ModeDir | 0o755, "", 0, 0},
		"usr/local/":            {tar.TypeDir, fs.ModeDir | 0o755, "", 0, 0},
		"usr/local/bin/":        {tar.TypeDir, fs.ModeDir | 0o755, "", 0, 0},
		"usr/local/bin/gozt":    {tar.TypeReg, 0o755, "", 0, 0},
		"usr/local/bin/ztunnel": {tar.TypeSymlink, fs.ModeSymlink | 0o777, "gozt", 0, 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
	// The alias resolves, inside the image, to the entrypoint.
	if e := got["usr/local/bin/ztunnel"]; path.Join("/usr/local/bin", e.Linkname) != binPath {
		t.Errorf("%s -> %s does not resolve to %s", aliasPath, e.Linkname, binPath)
	}
}

func writeEntry(t *testing.T, root string, h *tar.Header, r io.Reader) {
	t.Helper()
	if !fs.ValidPath(strings.TrimSuffix(h.Name, "/")) {
		t.Fatalf("layer entry %q is not a clean relative path", h.Name)
	}
	p := filepath.Join(root, filepath.FromSlash(h.Name))
	var err error
	switch h.Typeflag {
	case tar.TypeDir:
		err = os.MkdirAll(p, 0o755)
	case tar.TypeReg:
		var data []byte
		if data, err = io.ReadAll(r); err == nil {
			err = os.WriteFile(p, data, 0o755)
		}
	case tar.TypeSymlink:
		err = os.Symlink(h.Linkname, p)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// checkStatic fails unless the ELF file has no interpreter and no dynamic
// section: the image has no loader and no libc.
func checkStatic(t *testing.T, file string) {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header; want a static binary", file, p.Type)
		}
	}
	if s := f.Section(".dynamic"); s != nil {
		t.Errorf("%s has a .dynamic section", file)
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("%s imports %v", file, libs)
	}
}

// checkProxyArgs runs the image's default arguments (the chart's) with a
// PROXY_MODE gozt refuses, which shows they reach `gozt proxy` and its
// environment check, not the usage error of an unknown command, and
// without starting anything.
func checkProxyArgs(t *testing.T, exe string, args []string) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	cmd.Env = []string{"PROXY_MODE=bogus"}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("%s %v with PROXY_MODE=bogus succeeded:\n%s", exe, args, out)
	}
	if !strings.Contains(string(out), "PROXY_MODE") || strings.Contains(string(out), "unknown command") {
		t.Errorf("%s %v with PROXY_MODE=bogus: %v\n%s\nwant an error about PROXY_MODE", exe, args, err, out)
	}
}

func runOK(t *testing.T, exe string, args ...string) string {
	t.Helper()
	cmd := exec.Command(exe, args...)
	cmd.Env = []string{}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v", exe, args, err)
	}
	return strings.TrimSpace(string(out))
}

func sha256File(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return sha256Hex(data)
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestArchiveReproducible builds the archive twice from the same bytes and
// time and expects the same bytes, so the image digest depends only on the
// binary and the commit.
func TestArchiveReproducible(t *testing.T) {
	m := meta{bin: []byte("\x7fELF not really"), arch: "arm64", version: "1.2.3", revision: "abc",
		created: time.Unix(1700000000, 0).UTC(), ref: "ghcr.io/gozt/gozt:1.2.3", tag: "1.2.3"}
	var archives [2]bytes.Buffer
	for i := range archives {
		img, err := build(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeArchive(&archives[i], img, m); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(archives[0].Bytes(), archives[1].Bytes()) {
		t.Error("two builds of the same image differ")
	}
}

func TestFullRef(t *testing.T) {
	tests := []struct {
		in, ref, tag string
		wantErr      bool
	}{
		{in: "ghcr.io/gozt/gozt:0.1.0-dev", ref: "ghcr.io/gozt/gozt:0.1.0-dev", tag: "0.1.0-dev"},
		{in: "localhost:5000/gozt:dev", ref: "localhost:5000/gozt:dev", tag: "dev"},
		{in: "docker.io/library/gozt:dev", ref: "docker.io/library/gozt:dev", tag: "dev"},
		{in: "index.docker.io/me/gozt:1", ref: "docker.io/me/gozt:1", tag: "1"},
		{in: "gozt:dev", wantErr: true},              // no registry: the chart would prefix its hub
		{in: "ghcr.io/gozt/gozt", wantErr: true},     // no tag
		{in: "ghcr.io/gozt/gozt:a+b", wantErr: true}, // not a tag
	}
	for _, tt := range tests {
		ref, tag, err := fullRef(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("fullRef(%q) = %q, %q; want an error", tt.in, ref, tag)
			}
			continue
		}
		if err != nil || ref != tt.ref || tag != tt.tag {
			t.Errorf("fullRef(%q) = %q, %q, %v; want %q, %q", tt.in, ref, tag, err, tt.ref, tt.tag)
		}
	}
}

// TestStaticArchRefusesDynamic checks the build refuses a binary that
// needs a dynamic loader, which the image does not have.
func TestStaticArchRefusesDynamic(t *testing.T) {
	for _, p := range []string{"/bin/true", "/usr/bin/true", "/bin/sh"} {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil || f.Section(".interp") == nil {
			continue
		}
		if arch, err := staticArch(data); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("staticArch(%s) = %q, %v; want a dynamically linked error", p, arch, err)
		}
		return
	}
	t.Skip("no dynamically linked ELF binary found here")
}
