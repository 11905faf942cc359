package ociarchive

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestWrite writes an image and reads the archive back as containerd's
// importer does: index.json names the image and points at a manifest whose
// config and layer are blobs with the digests it records.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	img := Image{
		Ref: "localhost/test/app:v1", Entrypoint: []string{"/usr/local/bin/app"}, User: "1337:1337",
		Files: []File{
			{Path: "/usr/local/bin/app", Src: bin},
			{Path: "/usr/local/bin/app-link", Link: "app"},
			{Path: "/tmp", Dir: true, Mode: 0o777 | os.ModeSticky},
		},
	}
	if err := Write(out, img); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, blobs := readTar(t, f)
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	mustJSON(t, blobs["index.json"], &index)
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != img.Ref {
		t.Fatalf("index.json = %s", blobs["index.json"])
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	mustJSON(t, blob(t, blobs, index.Manifests[0].Digest), &manifest)
	var config struct {
		Config struct {
			Entrypoint []string
			User       string
		}
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	mustJSON(t, blob(t, blobs, manifest.Config.Digest), &config)
	if config.Config.User != "1337:1337" || config.Config.Entrypoint[0] != "/usr/local/bin/app" {
		t.Errorf("config = %+v", config.Config)
	}
	if len(manifest.Layers) != 1 || config.Rootfs.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Fatalf("layers %v, diff_ids %v", manifest.Layers, config.Rootfs.DiffIDs)
	}
	layer, contents := readTar(t, bytes.NewReader(blob(t, blobs, manifest.Layers[0].Digest)))
	for _, want := range []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/app", "usr/local/bin/app-link", "tmp/"} {
		if _, ok := layer[want]; !ok {
			t.Fatalf("layer lacks %s (has %v)", want, slices.Sorted(maps.Keys(layer)))
		}
	}
	if layer["tmp/"].Mode != 0o1777 || layer["usr/local/bin/app-link"].Linkname != "app" {
		t.Errorf("tmp mode %o, link %q", layer["tmp/"].Mode, layer["usr/local/bin/app-link"].Linkname)
	}
	if app := layer["usr/local/bin/app"]; app.Mode != 0o755 || string(contents[app.Name]) != "#!/bin/true\n" {
		t.Errorf("usr/local/bin/app: mode %o, contents %q; want 755, the source file's", app.Mode, contents[app.Name])
	}
}

func blob(t *testing.T, blobs map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := blobs["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob %s", digest)
	}
	sum := sha256.Sum256(b)
	if "sha256:"+hex.EncodeToString(sum[:]) != digest {
		t.Fatalf("blob %s has another digest", digest)
	}
	return b
}

// readTar reads every entry of the tar stream r: its headers and the
// contents of its regular files, by name.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hs, files := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs, files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hs[h.Name], files[h.Name] = h, b
	}
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
}
